"""Blocks held over a run: a band per request, its height the blocks its table holds after each step, with each
preemption (the table dropped, its blocks freed) and each comeback (the whole table back, part of it perhaps from
the prefix cache) marked. Drawn from plain data an engine loop records (each step's ``snapshot().tables``, and who
was preempted or admitted again in which step), with a text map of the same events to print beside it."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..errors import PagedKVValueError
from .block_map import PALETTE

PREEMPTED, BACK = "#222222", "#CC0000"


def _check_tables(tables) -> None:
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise PagedKVValueError("tables must be a list with one {request: block ids} dict per step "
                                "(each step's snapshot().tables).")


def _check(tables, preempted, back) -> tuple[list, dict, dict]:
    _check_tables(tables)
    preempted, back = dict(preempted or {}), dict(back or {})
    for name, events in (("preempted", preempted), ("back", back)):
        if any(not isinstance(s, int) or not 0 <= s < len(tables) for s in events):
            raise PagedKVValueError(f"{name} must map step numbers of the run, 0 to {len(tables) - 1}, to requests; "
                                    f"got steps {sorted(events)!r}.")
    return tables, preempted, back


def _requests(tables) -> list:
    """The requests in the order they first hold a table."""
    return list(dict.fromkeys(r for table in tables for r in table))


def draw_blocks_held(tables: list, preempted: dict | None = None, back: dict | None = None, pool: int | None = None,
                     ax=None, colors: dict | None = None, title: str | None = None, legend: bool = True):
    """A row per request (first on top), a column per step; the band's height is the blocks the request's table
    holds after the step (a full row: the most any request holds). ``preempted``: step -> the requests preempted in
    it, marked X where their band stops; ``back``: step -> {request: prompt tokens the prefix cache gave it}, the
    requests admitted again in it, marked with a triangle and that count. ``pool``: the pool's size, written in the
    key beside the most blocks in use at once. Returns the Axes."""
    tables, preempted, back = _check(tables, preempted, back)
    requests = _requests(tables)
    colors = {r: (colors or {}).get(r, PALETTE[i % len(PALETTE)]) for i, r in enumerate(requests)}
    most = max([len(t) for table in tables for t in table.values()] + [1])
    if ax is None:
        _, ax = plt.subplots(figsize=(min(12, 3 + 0.12 * len(tables)), 0.5 + 0.45 * len(requests)))
    for row, request_id in enumerate(requests):
        base = len(requests) - 1 - row
        heights = [len(table.get(request_id, ())) / most * 0.8 for table in tables]
        ax.bar(range(len(tables)), heights, bottom=base - 0.4, width=1.0, color=colors[request_id], linewidth=0)
    rows = {r: len(requests) - 1 - i for i, r in enumerate(requests)}
    for step, victims in preempted.items():
        for request_id in victims:
            ax.plot(step, rows[request_id], marker="x", color=PREEMPTED, markersize=7, markeredgewidth=2)
    for step, cached in back.items():
        for request_id, num_cached in cached.items():
            ax.plot(step, rows[request_id] - 0.25, marker="^", color=BACK, markersize=7)
            if num_cached:
                ax.text(step + 0.8, rows[request_id] + 0.05, f"{num_cached}", color=BACK, fontsize=9,
                        va="center", weight="bold")
    ax.set_yticks(range(len(requests)), [str(r) for r in reversed(requests)])
    ax.set_xlim(-0.5, len(tables) - 0.5)
    ax.set_ylim(-0.6, len(requests) - 0.4)
    ax.set_xlabel("step")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    if legend:
        in_use = max(sum(len(t) for t in table.values()) for table in tables) if tables else 0
        handles = [Patch(facecolor="#999999", label=f"band height: blocks held (a full row: {most})")]
        if pool is not None:
            handles.append(Patch(facecolor="white", edgecolor="white",
                                 label=f"the pool: {pool} blocks, {in_use} in use at the most"))
        if preempted:
            handles.append(Line2D([], [], linestyle="none", marker="x", color=PREEMPTED, markeredgewidth=2,
                                  label="x: preempted, its table dropped and its blocks freed"))
        if back:
            handles.append(Line2D([], [], linestyle="none", marker="^", color=BACK,
                                  label="triangle: back, its whole table sent again; the number: tokens from the "
                                        "prefix cache"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, -0.18), ncol=2, fontsize=8, frameon=False)
    return ax


def blocks_held_text(tables: list, preempted: dict | None = None, back: dict | None = None) -> str:
    """The text map of :func:`draw_blocks_held`: one line per preemption and comeback, in step order, with the
    blocks the victim freed (its table the step before) or the block ids its whole table sends, and the prompt tokens
    the prefix cache gave it back."""
    tables, preempted, back = _check(tables, preempted, back)
    lines = [f"{'step':>4}  {'request':<8} {'what':<10} {'blocks':<18} tokens from the prefix cache"]
    events = sorted([(s, 0, r) for s, victims in preempted.items() for r in victims]
                    + [(s, 1, r) for s, cached in back.items() for r in cached])
    for step, kind, request_id in events:
        if kind == 0:
            freed = tables[step - 1].get(request_id, []) if step else []
            lines.append(f"{step:>4}  {request_id!s:<8} {'preempted':<10} {f'{len(freed)} freed {freed}':<18}")
        else:
            table = tables[step][request_id]
            lines.append(f"{step:>4}  {request_id!s:<8} {'back':<10} {f'{len(table)} sent {table}':<18} "
                         f"{back[step][request_id]}")
    return "\n".join(line.rstrip() for line in lines)
