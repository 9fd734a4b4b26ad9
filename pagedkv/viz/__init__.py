"""Layer 13 — pictures of the cache, drawn only from ``snapshot()`` data, the interactive visualizer, and recorded
runs (``trace``) that ``player.js`` plays in a browser with no kernel."""

from .async_timeline import async_timeline_text, draw_async_timeline, draw_sync_and_async, forward_idle, step_spans_text
from .block_map import PALETTE, add_block_map_key, align_panels, draw_block_map, key_below, key_beside, seq_colors
from .blocks_held import blocks_held_text, draw_blocks_held
from .compact_png import compact_png
from .free_queues import draw_free_queues, free_queues_text
from .placeholder_slots import draw_placeholder_slots, placeholder_slots_text
from .scheduler_widget import SchedulerVisualizer
from .slot_mapping import draw_slots, render_slots, slot_mapping
from .tiers import block_names, draw_tiers, render_tiers
from .timeline import Timeline, draw_timeline
from .token_budget import draw_token_budget, token_budget_text
from .trace import Trace, TraceRecorder, load_trace, record_engine, record_scheduler
from .trace_widget import TracePlayer
from .visualizer import BlockTableVisualizer, counters
from .worker_rows import draw_worker_rows, rows_after, worker_rows_text

__all__ = ["BlockTableVisualizer", "PALETTE", "SchedulerVisualizer", "Timeline", "Trace", "TracePlayer",
           "TraceRecorder", "add_block_map_key", "align_panels", "async_timeline_text", "block_names",
           "blocks_held_text", "compact_png", "counters", "draw_async_timeline", "draw_block_map",
           "draw_blocks_held", "draw_free_queues", "draw_placeholder_slots", "draw_slots",
           "draw_sync_and_async", "draw_tiers", "draw_timeline", "draw_token_budget", "draw_worker_rows",
           "forward_idle", "free_queues_text", "key_below", "key_beside", "load_trace",
           "placeholder_slots_text", "record_engine", "record_scheduler", "render_slots", "render_tiers",
           "rows_after", "seq_colors", "slot_mapping", "step_spans_text", "token_budget_text",
           "worker_rows_text"]
