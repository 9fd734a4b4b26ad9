"""Slots: where each of a request's tokens has its K/V in the pool, drawn from a ``snapshot()`` (and nothing else).

Slot ``block_id * block_size + offset`` is one token's place in the pool; the token at position ``pos`` of a request
is in slot ``block_table[pos // block_size] * block_size + pos % block_size`` (vLLM 0.33's ``slot_mapping``, which
the GPU worker computes from its copy of the block tables). Each table entry is drawn as a row of ``block_size``
slots, each slot with its number and, where one of the request's tokens is in it, the token's position.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..errors import PagedKVValueError
from ..state import ManagerState, seq_name
from .block_map import EDGE, _lighter, seq_colors


def _table(state: ManagerState, request_id) -> list[int]:
    if request_id not in state.tables:
        raise PagedKVValueError(f"request {request_id!r} holds no blocks in this snapshot; running ones: "
                                f"{list(state.tables)[:8]}.")
    return state.tables[request_id]


def slot_mapping(state: ManagerState, request_id) -> list[int]:
    """The slot of each of the request's tokens, position 0 first."""
    table, bs = _table(state, request_id), state.block_size
    return [table[pos // bs] * bs + pos % bs for pos in range(state.seq_lens[request_id])]


def render_slots(state: ManagerState, request_ids) -> str:
    """A text map: per request, one line per table entry, its block's slots and the positions they hold."""
    bs, lines = state.block_size, []
    for request_id in request_ids:
        table, num_tokens = _table(state, request_id), state.seq_lens[request_id]
        lines.append(f"seq {seq_name(request_id)}: {num_tokens} tokens, table {table}")
        for i, block_id in enumerate(table):
            first, held = i * bs, max(0, min(bs, num_tokens - i * bs))
            positions = f"position {first}" if held == 1 else f"positions {first}-{first + held - 1}"
            empty = f" (slots {block_id * bs + held}-{block_id * bs + bs - 1} empty)" if 0 < held < bs else ""
            lines.append(f"  logical {i} -> block {block_id}: slots {block_id * bs}-{block_id * bs + bs - 1} "
                         f"hold {positions if held else 'nothing yet'}{empty}")
    return "\n".join(lines)


def draw_slots(state: ManagerState, request_ids, ax=None, title: str | None = None, key: bool = True):
    """Draw the requests' slots: one row per table entry (``B: logical 1 -> block 3``), a cell per slot with its number
    (large) and the position of the token in it (``pos 5``; pale and no position: empty). Colours are the block
    map's. Returns the Axes."""
    request_ids = list(request_ids)
    bs = state.block_size
    colors = seq_colors(state)
    rows = [(r, i, b) for r in request_ids for i, b in enumerate(_table(state, r))]
    gaps = len(request_ids) - 1
    if ax is None:
        _, ax = plt.subplots(figsize=(0.75 * bs + 3.2, 0.62 * (len(rows) + 0.5 * gaps) + 1.1))
    y = 0.0
    previous = None
    for request_id, i, block_id in rows:
        if previous is not None and request_id != previous:
            y += 0.5
        previous = request_id
        color, num_tokens = colors[request_id], state.seq_lens[request_id]
        ax.text(-0.15, y + 0.45, f"{seq_name(request_id)}: logical {i} -> block {block_id}", ha="right",
                va="center", fontsize=9)
        for offset in range(bs):
            pos = i * bs + offset
            held = pos < num_tokens
            ax.add_patch(plt.Rectangle((offset, y), 0.92, 0.9, facecolor=color if held else _lighter(color),
                                       edgecolor=EDGE, linewidth=0.6))
            ax.text(offset + 0.46, y + 0.36, str(block_id * bs + offset), ha="center", va="center", fontsize=10,
                    weight="bold" if held else "normal", color="black" if held else "#777777")
            if held:
                ax.text(offset + 0.46, y + 0.74, f"pos {pos}", ha="center", va="center", fontsize=7)
        y += 1
    ax.set_xlim(-4.4, bs + 0.1)
    ax.set_ylim(y + 0.1, -0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"slot = block_table[pos // {bs}] * {bs} + pos % {bs}", fontsize=10)
    if key:
        from matplotlib.patches import Patch

        first = colors[request_ids[0]]
        handles = [Patch(facecolor=first, edgecolor=EDGE, label="a slot holding a token (each request in its "
                                                                 "colour): its slot number, and pos = the "
                                                                 "token's position in the request"),
                   Patch(facecolor=_lighter(first), edgecolor=EDGE, label="pale: an empty slot of the block")]
        ax.figure.legend(handles=handles, loc="lower center", ncol=1, fontsize=8, frameon=False)
    return ax
