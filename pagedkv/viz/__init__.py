"""Layer 13 — pictures of the cache, drawn only from ``snapshot()`` data, the interactive visualizer, and recorded
runs (``trace``) that ``player.js`` plays in a browser with no kernel."""

from .async_timeline import async_timeline_text, draw_async_timeline
from .block_map import PALETTE, add_block_map_key, align_panels, draw_block_map, seq_colors
from .scheduler_widget import SchedulerVisualizer
from .timeline import Timeline, draw_timeline
from .trace import Trace, TraceRecorder, load_trace, record_engine, record_scheduler
from .trace_widget import TracePlayer
from .visualizer import BlockTableVisualizer, counters

__all__ = ["PALETTE", "BlockTableVisualizer", "SchedulerVisualizer", "Timeline", "Trace", "TracePlayer",
           "TraceRecorder", "add_block_map_key", "align_panels", "async_timeline_text", "counters",
           "draw_async_timeline", "draw_block_map", "draw_timeline", "load_trace", "record_engine", "record_scheduler",
           "seq_colors"]
