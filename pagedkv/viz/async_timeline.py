"""The async engine loop on a time axis: the main thread's schedule / wait / update beside the forward thread's steps.

Drawn from ``LLMEngine.trace`` (a list of ``StepEvent``, plain data), printed as a text timeline that nbval can
compare (the order of the main thread's spans and the steps in flight after each: no clock times), and drawn with
matplotlib with a key. vLLM 0.33's loop is ``EngineCore.step_with_batch_queue`` (``vllm/v1/engine/core.py``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

# kind -> (colour, words for the key)
KINDS = {
    "schedule": ("#0072B2", "schedule step k (and hand it to the forward thread)"),
    "wait": ("#E0E0E0", "wait for the oldest step's output"),
    "update": ("#009E73", "update_from_output of step k"),
    "forward": ("#E69F00", "forward of step k and its draws"),
}
WORDS = {"schedule": "schedule step", "wait": "wait for step", "update": "update from step"}


def async_timeline_text(trace, max_step: int | None = None) -> str:
    """One line per main-thread span, in order, with the steps in flight after it (scheduled, output not yet
    processed). The same on every run: it shows the protocol, not the clock."""
    first = min(e.step for e in trace)  # steps counted from the trace's first one
    lines, in_flight = [f"{'main thread':<22}steps in flight after it"], []
    for event in sorted((e for e in trace if e.thread == "main"), key=lambda e: e.start):
        step = event.step - first
        if max_step is not None and step > max_step:
            break
        if event.kind == "schedule":
            in_flight.append(step)
        elif event.kind == "update":
            in_flight.remove(step)
        lines.append(f"{WORDS[event.kind]} {step:<{22 - len(WORDS[event.kind]) - 1}}{in_flight}")
    return "\n".join(lines)


def draw_async_timeline(trace, ax=None, max_step: int | None = None, title: str | None = None):
    """Two lanes, time in milliseconds from the first span: the main thread above, the forward thread below, each
    forward labelled with its step. Schedule and update marks are drawn at least 1/150 of the axis wide."""
    first = min(e.step for e in trace)
    events = [e for e in trace if max_step is None or e.step - first <= max_step]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3))
    t0 = min(e.start for e in events)
    span = (max(e.end for e in events) - t0) * 1e3
    for e in sorted(events, key=lambda e: e.kind != "wait"):  # the marks over the waits
        y = 1 if e.thread == "main" else 0
        width = (e.end - e.start) * 1e3
        if e.kind in ("schedule", "update"):
            width = max(width, span / 150)  # often far shorter than a pixel: drawn a hair wide
        ax.broken_barh([((e.start - t0) * 1e3, width)], (y - 0.35, 0.7), facecolors=KINDS[e.kind][0],
                       edgecolor="#333333", linewidth=0.5)
        if e.kind == "forward":
            ax.text((e.start - t0) * 1e3 + width / 2, y, str(e.step - first), ha="center", va="center", fontsize=8)
    ax.set_yticks([0, 1], ["forward thread", "main thread"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlabel("milliseconds")
    ax.set_title(title or "two steps in flight: step k + 1 is scheduled while step k runs")
    ax.legend(handles=[Patch(facecolor=c, edgecolor="#333333", label=w) for c, w in KINDS.values()],
              loc="upper center", bbox_to_anchor=(0.5, -0.42), ncol=2, fontsize=8, frameon=False)
    ax.figure.subplots_adjust(left=0.15, right=0.98, top=0.88, bottom=0.42)
    return ax.figure
