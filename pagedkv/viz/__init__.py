"""Layer 10 — pictures of the cache, drawn only from ``snapshot()`` data, and the interactive visualizer."""

from .block_map import PALETTE, draw_block_map, seq_colors
from .visualizer import BlockTableVisualizer, counters

__all__ = ["PALETTE", "BlockTableVisualizer", "counters", "draw_block_map", "seq_colors"]
