"""Draw a block map from a ``ManagerState`` snapshot (and nothing else).

Top: the physical pools as grids of cells (GPU, then CPU when swapping is on).
A cell is coloured by the sequence that owns it, striped when several share
it (with the ref count printed), filled from the bottom as far as its tokens
go; a free cell shows its place in the free queue (``#0`` is handed out next)
and, with prefix caching, the start of its hash.  Bottom: each sequence's
logical block table, entry ``i`` showing the physical block it maps to.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.collections import PatchCollection
from matplotlib.patches import Rectangle

from ..state import ManagerState

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999933",
           "#882255", "#44AA99"]
FREE, CACHED, EDGE, HIGHLIGHT = "#EEEEEE", "#D9D9D9", "#555555", "#CC0000"


def seq_colors(state: ManagerState) -> dict:
    """A stable colour per sequence, in the order the sequences appear in the snapshot."""
    return {seq: PALETTE[i % len(PALETTE)] for i, seq in enumerate(state.tables)}


def _grid_columns(num_blocks: int) -> int:
    return max(1, min(16, math.ceil(math.sqrt(num_blocks * 2))))


def draw_block_map(state: ManagerState, ax=None, highlight=(), title: str | None = None,
                   show_tables: bool = True, labels: bool | None = None):
    """Draw ``state`` on ``ax`` (a new figure if None) and return the Axes.

    ``highlight``: block ids (GPU) or ``(device, block_id)`` pairs to outline, e.g.
    the blocks the last event touched.  ``labels`` (default: on up to 128
    blocks per pool) prints ids, ref counts and free positions in the cells.
    """
    colors = seq_colors(state)
    marked = {h if isinstance(h, tuple) else ("gpu", h) for h in highlight}
    pools = [d for d, n in (("gpu", state.num_gpu_blocks), ("cpu", state.num_cpu_blocks)) if n]
    cols = {d: _grid_columns(len(state.device_blocks(d))) for d in pools}
    rows = {d: math.ceil(len(state.device_blocks(d)) / cols[d]) for d in pools}
    table_rows = len(state.tables) if show_tables else 0
    width = sum(cols.values()) + (len(pools) - 1)
    table_width = max((len(t) for t in state.tables.values()), default=0) + 2
    width = max(width, table_width if show_tables else 0, 4)
    height = max(rows.values(), default=1) + (table_rows + 1.5 if table_rows else 0)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(0.55 * width + 1, 16), min(0.55 * height + 1.2, 14)))

    patches, faces, x0 = [], [], 0.0
    for device in pools:
        blocks = state.device_blocks(device)
        show = labels if labels is not None else len(blocks) <= 128
        ax.text(x0, -0.35, f"{device.upper()} pool ({len(blocks)} blocks)", fontsize=9, weight="bold")
        for b in blocks:
            x, y = x0 + b.block_id % cols[device], b.block_id // cols[device]
            _draw_cell(ax, b, x, y, state.block_size, colors, patches, faces, show,
                       (device, b.block_id) in marked)
        x0 += cols[device] + 1
    ax.add_collection(PatchCollection(patches, facecolors=faces, edgecolors="none", zorder=1))

    if table_rows:
        top = max(rows.values(), default=1) + 1
        ax.text(0, top - 0.35, "block tables (logical block i -> physical block)", fontsize=9, weight="bold")
        for r, (seq, table) in enumerate(state.tables.items()):
            y = top + r
            device = state.seq_devices[seq]
            ax.text(-0.1, y + 0.5, f"seq {seq}", ha="right", va="center", fontsize=8)
            for i, block_id in enumerate(table):
                ax.add_patch(Rectangle((i, y + 0.1), 0.9, 0.8, facecolor=colors[seq], edgecolor=EDGE, lw=0.6,
                                       alpha=0.9 if device == "gpu" else 0.45))
                ax.text(i + 0.45, y + 0.5, f"{block_id}" + ("c" if device == "cpu" else ""), ha="center",
                        va="center", fontsize=7)
    ax.set_xlim(-2.2 if table_rows else -0.5, width + 0.2)
    ax.set_ylim(height + 0.2, -0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"block_size {state.block_size}: {state.num_used('gpu')}/{state.num_gpu_blocks} "
                 f"GPU blocks used", fontsize=10)
    return ax


def _draw_cell(ax, b, x, y, block_size, colors, patches, faces, show_labels, marked):
    size = 0.9
    if b.is_free:
        patches.append(Rectangle((x, y), size, size))
        faces.append(CACHED if b.block_hash else FREE)
    else:
        owners = [s for s in b.seq_ids if s in colors] or [None]
        stripe = size / len(owners)
        fill = size * b.num_tokens / block_size
        for i, seq in enumerate(owners):  # one vertical stripe per sharing sequence
            patches.append(Rectangle((x + i * stripe, y), stripe, size))
            faces.append(_lighter(colors.get(seq, "#BBBBBB")))
            patches.append(Rectangle((x + i * stripe, y + size - fill), stripe, fill))  # filled slots
            faces.append(colors.get(seq, "#BBBBBB"))
    ax.add_patch(Rectangle((x, y), size, size, fill=False, edgecolor=HIGHLIGHT if marked else EDGE,
                           lw=2.2 if marked else 0.6, zorder=3))
    if not show_labels:
        return
    ax.text(x + 0.05, y + 0.08, str(b.block_id), fontsize=6, va="top", zorder=4)
    if b.is_free:
        ax.text(x + 0.45, y + 0.55, f"#{b.free_position}", fontsize=6, ha="center", color="#777777", zorder=4)
        if b.block_hash:
            ax.text(x + 0.45, y + 0.8, b.block_hash[:4], fontsize=5, ha="center", color="#555555", zorder=4)
    else:
        if b.ref_count > 1:
            ax.text(x + 0.45, y + 0.5, f"x{b.ref_count}", fontsize=8, ha="center", va="center", weight="bold",
                    zorder=4)
        if b.block_hash:
            ax.text(x + 0.45, y + 0.82, b.block_hash[:4], fontsize=5, ha="center", zorder=4)


def _lighter(hex_color: str, amount: float = 0.6) -> tuple:
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)
