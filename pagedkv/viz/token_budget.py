"""One token budget per step, drawn: each step's scheduled tokens as a bar, one segment per request, against the
budget (vLLM's ``max_num_batched_tokens``). Drawn from a :class:`Timeline`'s ``tokens`` (plain data, like the
block maps), with a text map of the same numbers to print beside it."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..errors import PagedKVValueError
from .block_map import PALETTE
from .timeline import STATES, Timeline

CHUNK_HATCH = "////"  # a chunk that stops short of the request's last token: it samples nothing


def _steps(timeline: Timeline, steps) -> list[int]:
    if not isinstance(timeline, Timeline):
        raise PagedKVValueError(f"expected a Timeline (its tokens per step), got {type(timeline).__name__}.")
    chosen = list(range(len(timeline.steps)) if steps is None else steps)
    if any(not isinstance(s, int) or not 0 <= s < len(timeline.steps) for s in chosen):
        raise PagedKVValueError(f"steps must be step numbers of the timeline, 0 to {len(timeline.steps) - 1}, "
                                f"got {steps!r}.")
    return chosen


def draw_token_budget(timeline: Timeline, budget: int | None = None, ax=None, colors: dict | None = None,
                      labels: dict | None = None, steps=None, title: str | None = None, legend: bool = True,
                      totals: bool = False):
    """Each step's scheduled tokens as a stacked bar, one segment per request (bottom first, in the order the
    requests first appeared); a chunk that samples nothing hatched; a request preempted in the step marked ``X``
    above the bar, in its colour; a dashed line at ``budget`` (None: no line). ``colors``: request -> colour
    (default: the palette, in order); ``labels``: request -> its name in the key (requests of one name share one
    entry, e.g. a batch of decodes); ``steps``: the step numbers to draw (default: all); ``totals``: each bar's
    total written above it. On axes that share a y axis, the scale only grows, so every panel fits. Returns the
    Axes."""
    chosen = _steps(timeline, steps)
    colors = {r: (colors or {}).get(r, PALETTE[i % len(PALETTE)]) for i, r in enumerate(timeline.requests)}
    labels = {r: str((labels or {}).get(r, r)) for r in timeline.requests}
    if ax is None:
        _, ax = plt.subplots(figsize=(min(12, 2.5 + 0.3 * len(chosen)), 3))
    tops = {}
    largest = max([sum(timeline.tokens[s].values()) for s in chosen] + [budget or 0, 1])
    for step in chosen:
        bottom = 0
        for request_id in timeline.requests:
            num_tokens = timeline.tokens[step].get(request_id, 0)
            if num_tokens:
                chunk = timeline.steps[step].get(request_id) == "chunk"
                ax.bar(step, num_tokens, bottom=bottom, width=0.8, color=colors[request_id], edgecolor="white",
                       linewidth=0.6 if num_tokens > largest / 50 else 0, hatch=CHUNK_HATCH if chunk else None)
                bottom += num_tokens
        tops[step] = bottom
    top = largest
    for step in chosen:
        if totals:
            ax.text(step, tops[step] + top * 0.02, f"{tops[step]:,}", ha="center", va="bottom", fontsize=8)
        victims = [r for r in timeline.requests if timeline.steps[step].get(r) == "preempted"]
        for i, request_id in enumerate(victims):
            ax.text(step, tops[step] + top * (0.03 + 0.09 * i), "X", ha="center", va="bottom", fontsize=10,
                    weight="bold", color=colors[request_id])
    if budget is not None:
        ax.axhline(budget, color="#222222", linestyle="--", linewidth=1.2)
    ax.set_xticks(chosen, [str(s) for s in chosen])
    ax.set_xlim(min(chosen, default=0) - 0.6, max(chosen, default=0) + 0.6)
    ax.set_ylim(0, max(top * 1.15, ax.get_ylim()[1]))
    ax.set_xlabel("step")
    ax.set_ylabel("tokens scheduled")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    if legend:
        shown = [r for r in timeline.requests if any(timeline.tokens[s].get(r) for s in chosen)]
        handles = {labels[r]: Patch(facecolor=colors[r], label=labels[r]) for r in shown}
        handles = list(handles.values())
        if any(timeline.steps[s].get(r) == "chunk" for s in chosen for r in shown):
            handles.append(Patch(facecolor="white", edgecolor="#555555", hatch=CHUNK_HATCH,
                                 label="hatched: a chunk (samples nothing)"))
        if any(state == "preempted" for s in chosen for state in timeline.steps[s].values()):
            handles.append(Line2D([], [], linestyle="none", marker="$X$", color="#555555",
                                  label="X: preempted in this step"))
        if budget is not None:
            handles.append(Line2D([], [], color="#222222", linestyle="--", label=f"the budget: {budget} tokens"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return ax


def token_budget_text(timeline: Timeline, budget: int | None = None, steps=None) -> str:
    """The text map of :func:`draw_token_budget`: a row per request and a column per step, each cell the tokens it
    was scheduled and its state's letter (``6p`` a chunk of 6 that samples nothing, ``2P`` a prompt's last 2,
    ``1D`` a decode, ``X`` preempted, ``.`` waiting), then each step's total, and the largest against ``budget``."""
    chosen = _steps(timeline, steps)

    def cell(step, request_id):
        state = timeline.steps[step].get(request_id)
        if state is None:
            return ""
        letter = STATES[state][0]
        num_tokens = timeline.tokens[step].get(request_id, 0)
        return f"{num_tokens}{letter}" if num_tokens else letter

    rows = [("step", [str(s) for s in chosen])]
    rows += [(str(r), [cell(s, r) for s in chosen]) for r in timeline.requests]
    totals = [timeline.total_tokens()[s] for s in chosen]
    rows.append(("total", [str(t) for t in totals]))
    name_width = max(len(name) for name, _ in rows)
    width = max(len(c) for _, cells in rows for c in cells) + 1
    lines = [(f"{name:<{name_width}}" + "".join(f"{c:>{width}}" for c in cells)).rstrip() for name, cells in rows]
    used = {timeline.steps[s].get(r) for s in chosen for r in timeline.requests}
    lines.append("  ".join(f"{letter} {name}" for name, (letter, _, _) in STATES.items() if name in used))
    largest = max(totals, default=0)
    lines.append(f"the largest step holds {largest} tokens" + ("" if budget is None else f"; the budget is {budget}"))
    return "\n".join(lines)
