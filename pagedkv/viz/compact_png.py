"""A figure as a small PNG for a stored notebook: rendered at a readable dpi, then reduced to a palette of a few
dozen colours (the cache maps use a handful of fills), which makes the file about four times smaller than
matplotlib's full-colour PNG. Not a vLLM concept: notebook plumbing only."""

from __future__ import annotations

import io


def compact_png(fig, dpi: int = 100, colors: int = 64):
    """``fig`` as an ``IPython.display.Image`` PNG of at most ``colors`` colours at ``dpi``; closes ``fig`` so that
    the inline backend does not draw it a second time."""
    import matplotlib.pyplot as plt
    from IPython.display import Image
    from PIL import Image as PILImage

    raw = io.BytesIO()
    fig.savefig(raw, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    raw.seek(0)
    small = io.BytesIO()
    PILImage.open(raw).convert("RGB").quantize(colors=colors).save(small, format="png", optimize=True)
    return Image(data=small.getvalue(), format="png")
