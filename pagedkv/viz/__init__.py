"""Layer 13 — pictures of the cache, drawn only from ``snapshot()`` data, and the interactive visualizer."""

from .block_map import PALETTE, add_block_map_key, align_panels, draw_block_map, seq_colors
from .scheduler_widget import SchedulerVisualizer
from .tiers import block_names, draw_tiers, render_tiers
from .timeline import Timeline, draw_timeline
from .visualizer import BlockTableVisualizer, counters

__all__ = ["PALETTE", "BlockTableVisualizer", "SchedulerVisualizer", "Timeline", "add_block_map_key",
           "align_panels", "block_names", "counters", "draw_block_map", "draw_tiers", "draw_timeline", "render_tiers",
           "seq_colors"]
