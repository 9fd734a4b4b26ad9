"""Course-lab helpers: friendly answer checks for the notebooks' exercises."""
