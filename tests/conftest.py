import os

os.environ.setdefault("PAGEDKV_QUIET", "1")  # the simulator notice is tested on its own
