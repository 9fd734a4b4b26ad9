"""The engine loop on a time axis: the main thread's schedule / wait / update beside the model's forward of each step.

Drawn from ``LLMEngine.trace`` (a list of ``StepEvent``, plain data) of the v1 engine, synchronous or async: printed
as a text timeline that nbval can compare (the order of the main thread's spans and the steps in flight after each:
no clock times), summed up as wall time and the share of it the forward lane sits idle, and drawn with matplotlib
with a key. vLLM 0.33's async loop is ``EngineCore.step_with_batch_queue`` (``vllm/v1/engine/core.py``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

# kind -> (colour, words for the key)
KINDS = {
    "schedule": ("#0072B2", "schedule step k (upper row)"),
    "update": ("#009E73", "update_from_output of step k (lower row)"),
    "wait": ("#E0E0E0", "main thread waits for the oldest step's output"),
    "forward": ("#E69F00", "forward of step k (the GPU's stand-in)"),
}
WORDS = {"schedule": "schedule step", "wait": "wait for step", "update": "update from step"}
# kind -> (bottom, height) in its lane: the schedule and update marks on two sub-rows of the main thread's lane
ROWS = {"schedule": (1.0, 0.35), "update": (0.65, 0.35), "wait": (0.65, 0.7), "forward": (-0.35, 0.7)}


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


def forward_idle(trace) -> tuple[float, float, float]:
    """(wall time in milliseconds from the first span's start to the last one's end, the share of it during which
    no forward runs: the time a GPU would sit idle, and the part of that share during which the next step was
    already handed over and the one before it done: a thread waiting for a core, not the loop)."""
    t0, t1 = min(e.start for e in trace), max(e.end for e in trace)
    forwards = sorted((e for e in trace if e.kind == "forward"), key=lambda e: e.start)
    handed = {e.step: e.end for e in trace if e.kind == "schedule"}  # a step is handed over as its mark ends
    busy = sum(e.end - e.start for e in forwards)
    ready = sum(max(0.0, nxt.start - max(prev.end, handed[nxt.step])) for prev, nxt in zip(forwards, forwards[1:]))
    return (t1 - t0) * 1e3, 1 - busy / (t1 - t0), ready / (t1 - t0)


def step_spans_text(trace) -> str:
    """The text map beside a drawn timeline: per step, the milliseconds of its schedule, forward and update spans
    (the main thread's waits left out). Clock times: they differ from run to run."""
    first = min(e.step for e in trace)
    ms = {(e.kind, e.step - first): 1e3 * (e.end - e.start) for e in trace if e.kind != "wait"}
    lines = [f"{'step':>4}  {'schedule':>8}  {'forward':>7}  {'update':>6}   (ms)"]
    for step in sorted({step for _, step in ms}):
        lines.append(f"{step:>4}  " + "  ".join(f"{ms.get((kind, step), 0.0):>{width}.1f}" for kind, width in
                                                 (("schedule", 8), ("forward", 7), ("update", 6))))
    return "\n".join(lines)


def draw_async_timeline(trace, ax=None, max_step: int | None = None, title: str | None = None, key: bool = True):
    """Two lanes, time in milliseconds from the first span: the main thread above (schedule marks on its upper
    sub-row, update marks on its lower one, each labelled with its step; the waits behind them), the forward lane
    below, each forward labelled with its step. Marks are drawn at their true width, at least 1/400 of the axis
    (a hair); a mark is labelled where its label fits. ``key=False``
    leaves the key out (two timelines stacked share one)."""
    first = min(e.step for e in trace)
    events = [e for e in trace if max_step is None or e.step - first <= max_step]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3))
    t0 = min(e.start for e in events)
    span = (max(e.end for e in events) - t0) * 1e3
    for e in sorted(events, key=lambda e: e.kind != "wait"):  # the marks over the waits
        bottom, height = ROWS[e.kind]
        width = max((e.end - e.start) * 1e3, span / 400)  # a mark far shorter than a pixel is drawn a hair wide
        ax.broken_barh([((e.start - t0) * 1e3, width)], (bottom, height), facecolors=KINDS[e.kind][0],
                       edgecolor="#333333", linewidth=0.5)
        if e.kind != "wait" and width >= span / 60:  # room for a digit
            colour = "black" if e.kind == "forward" else "white"
            ax.text((e.start - t0) * 1e3 + width / 2, bottom + height / 2, str(e.step - first), ha="center",
                    va="center", fontsize=7, color=colour)
    ax.set_yticks([0, 1], ["forward", "main thread"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlabel("milliseconds")
    ax.set_title(title or "two steps in flight: step k + 1 is scheduled while step k runs", fontsize=10)
    if key:
        ax.legend(handles=[Patch(facecolor=c, edgecolor="#333333", label=w) for c, w in KINDS.values()],
                  loc="upper center", bbox_to_anchor=(0.5, -0.42), ncol=2, fontsize=8, frameon=False)
        ax.figure.subplots_adjust(left=0.15, right=0.98, top=0.88, bottom=0.42)
    return ax.figure


def draw_sync_and_async(sync_trace, async_trace, titles=("synchronous", "async scheduling")):
    """The two loops on one millisecond axis, the synchronous one above, with one key below both."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    for ax, trace, title in zip(axes, (sync_trace, async_trace), titles):
        draw_async_timeline(trace, ax=ax, title=title, key=False)
    axes[0].set_xlabel("")
    axes[1].legend(handles=[Patch(facecolor=c, edgecolor="#333333", label=w) for c, w in KINDS.values()],
                   loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=2, fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.13, right=0.98, top=0.93, bottom=0.24, hspace=0.45)
    return fig
