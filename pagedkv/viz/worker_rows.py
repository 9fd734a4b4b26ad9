"""The GPU worker's copy of the block tables, step by step, beside the scheduler's: which entries the worker already
held, which block ids the scheduler sent it in that step (vLLM 0.33's ``new_block_ids`` in
``vllm/v1/core/sched/output.py``), and which rows it dropped. Drawn from plain data an engine loop records (each
step's ``snapshot().tables``, and who was preempted or admitted again in which step), with a text map of the same
rows to print beside it.

The rule is model runner V2's (``vllm/v1/worker/gpu/``): a running request is sent only the ids it gained; a request
that held no row the step before (new, or back from a preemption, whose row was dropped) is sent its whole table,
the blocks the prefix cache gave back included."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..errors import PagedKVValueError
from .block_map import PALETTE, _ink, _lighter
from .blocks_held import _check_tables
from .blocks_held import _requests as _requests_in_order

KEPT_EDGE, TEXT, GONE = "#555555", "#222222", "#777777"


def _check(tables, steps, preempted, back) -> tuple[list, list, dict, dict]:
    _check_tables(tables)
    steps = list(steps)
    if not steps or any(not isinstance(s, int) or not 0 <= s < len(tables) for s in steps):
        raise PagedKVValueError(f"steps must be step numbers of the run, 0 to {len(tables) - 1}; got {steps!r}.")
    return tables, steps, dict(preempted or {}), dict(back or {})


def rows_after(tables: list, step: int, preempted: dict | None = None) -> dict:
    """Each request's row on the worker after ``step``: ``(kept, sent)``, the ids it already held and the ids sent
    in this step (a request with no row the step before is sent its whole table), or ``"dropped"`` (preempted in
    this step) or ``"finished"`` (its table freed for another reason). Requests with no row before or after are
    left out."""
    before, now = (tables[step - 1] if step else {}), tables[step]
    rows = {}
    for request_id in dict.fromkeys([*before, *now]):
        if request_id in now:
            table, held = list(now[request_id]), list(before.get(request_id, []))
            kept = len(held) if table[:len(held)] == held else 0
            rows[request_id] = (table[:kept], table[kept:])
        else:
            rows[request_id] = "dropped" if request_id in (preempted or {}).get(step, ()) else "finished"
    return rows


def _requests(tables, steps) -> list:
    """The requests any shown step holds a row of (or drops one in), in the order they first hold a table."""
    shown = {r for s in steps for r in rows_after(tables, s)}
    return [r for r in _requests_in_order(tables) if r in shown]


def _cached_blocks(back, step, request_id, block_size) -> int:
    tokens = back.get(step, {}).get(request_id, 0)
    if tokens and not block_size:
        raise PagedKVValueError("back gives tokens from the prefix cache: pass block_size to count their blocks.")
    return tokens // block_size if tokens else 0


def worker_rows_text(tables: list, steps, preempted: dict | None = None, back: dict | None = None,
                     block_size: int | None = None) -> str:
    """The text map of :func:`draw_worker_rows`: a line per request, a column per step, each the worker's row after
    that step, ``+id`` for an id sent in that step and ``*`` after an id the prefix cache gave back."""
    tables, steps, preempted, back = _check(tables, steps, preempted, back)
    per_step = {s: rows_after(tables, s, preempted) for s in steps}
    cells = {}
    for s in steps:
        for request_id, row in per_step[s].items():
            if isinstance(row, str):
                cells[request_id, s] = row
                continue
            kept, sent = row
            num_cached = _cached_blocks(back, s, request_id, block_size)
            ids = [str(b) for b in kept] + [f"+{b}" for b in sent]
            cells[request_id, s] = " ".join(i + "*" * (n < num_cached) for n, i in enumerate(ids)) or "[]"
    requests = _requests(tables, steps)
    width = max([len(v) for v in cells.values()] + [len(f"step {s}") for s in steps]) + 3
    name = max([len(str(r)) for r in requests] + [len("request")]) + 2
    lines = ["request".ljust(name) + "".join(f"step {s}".ljust(width) for s in steps)]
    for request_id in requests:
        lines.append(str(request_id).ljust(name) + "".join(cells.get((request_id, s), "-").ljust(width)
                                                           for s in steps))
    return "\n".join(line.rstrip() for line in lines)


def draw_worker_rows(tables: list, steps, preempted: dict | None = None, back: dict | None = None,
                     block_size: int | None = None, colors: dict | None = None, title: str | None = None):
    """Two panels, a row per request (first on top) and a group of cells per step: left, the scheduler's table
    after the step (``KVCacheManager``; hatched: blocks the prefix cache gave a comeback); right, the worker's row
    after it, the ids sent in that step filled with the request's colour, those it already held outlined. A row the
    worker dropped (preemption) or freed (finish) says so. ``back``: step -> {request: prompt tokens the prefix cache
    gave it}, as :func:`draw_blocks_held` takes it, with ``block_size`` to count their blocks. Returns the Figure."""
    tables, steps, preempted, back = _check(tables, steps, preempted, back)
    requests = _requests(tables, steps)
    colors = {r: (colors or {}).get(r, PALETTE[i % len(PALETTE)]) for i, r in enumerate(requests)}
    widths = [max([len(tables[s].get(r, ())) for r in requests] + [2]) for s in steps]
    starts = [sum(widths[:i]) + 1.2 * i for i in range(len(steps))]
    total = starts[-1] + widths[-1]
    fig, axes = plt.subplots(1, 2, figsize=(min(12.0, 1.6 + 0.62 * total), 1.1 + 0.36 * len(requests)))
    for side, ax in zip(("scheduler", "worker"), axes):
        for s, start, width in zip(steps, starts, widths):
            rows = rows_after(tables, s, preempted)
            ax.text(start + width / 2, len(requests) + 0.05, f"step {s}", ha="center", va="bottom", fontsize=9)
            for i, request_id in enumerate(requests):
                y = len(requests) - 1 - i
                row = rows.get(request_id)
                if row is None:
                    continue
                if isinstance(row, str):
                    word = {"scheduler": {"dropped": "preempted", "finished": "finished"},
                            "worker": {"dropped": "row dropped", "finished": "row freed"}}[side][row]
                    ax.text(start + 0.05, y + 0.45, word, fontsize=8, color=GONE, style="italic", va="center")
                    continue
                kept, sent = row
                num_cached = _cached_blocks(back, s, request_id, block_size)
                for n, block_id in enumerate(kept + sent):
                    is_sent = n >= len(kept)
                    if side == "scheduler":
                        face, edge, weight, hatch = _lighter(colors[request_id], 0.45), KEPT_EDGE, "normal", None
                        if n < num_cached:
                            hatch = "///"
                    elif is_sent:
                        face, edge, weight, hatch = colors[request_id], TEXT, "bold", None
                    else:
                        face, edge, weight, hatch = "white", colors[request_id], "normal", None
                    ax.add_patch(Rectangle((start + n + 0.05, y + 0.05), 0.9, 0.8, facecolor=face, edgecolor=edge,
                                           linewidth=1.6 if side == "worker" else 0.8, hatch=hatch))
                    ink = "white" if side == "worker" and is_sent and _ink(face) == "white" else TEXT
                    ax.text(start + n + 0.5, y + 0.45, str(block_id), ha="center", va="center", fontsize=9,
                            color=ink, weight=weight)
        ax.set_xlim(-0.2, total + 0.2)
        ax.set_ylim(-0.2, len(requests) + 0.6)
        ax.set_yticks([len(requests) - 1 - i + 0.45 for i in range(len(requests))], [str(r) for r in requests])
        ax.set_xticks([])
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.tick_params(left=False)
    axes[0].set_title("the scheduler's tables (KVCacheManager)", fontsize=10)
    axes[1].set_title("the worker's rows (its persistent block table)", fontsize=10)
    handles = [Patch(facecolor=PALETTE[0], edgecolor=TEXT, label="filled: sent to the worker in this step "
                                                               "(new_block_ids)"),
               Patch(facecolor="white", edgecolor=PALETTE[0], linewidth=1.6, label="outlined: already in the "
                                                                                    "worker's row")]
    if any(_cached_blocks(back, s, r, block_size) for s in steps for r in requests):
        handles.append(Patch(facecolor=_lighter(PALETTE[0], 0.45), edgecolor=KEPT_EDGE, hatch="///",
                             label="hatched: given back by the prefix cache"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig
