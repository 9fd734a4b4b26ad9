"""Layer 10 — pictures of the cache, drawn only from ``snapshot()`` data."""

from .block_map import PALETTE, draw_block_map, seq_colors

__all__ = ["PALETTE", "draw_block_map", "seq_colors"]
