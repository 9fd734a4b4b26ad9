"""A scheduler timeline: requests as rows, steps as columns, each cell what the request did in that step.

Recorded from ``Scheduler`` outputs (plain data, like the block maps), printed
as a text grid that nbval can compare, and drawn with matplotlib with a key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

# state -> (letter in the text grid, colour, words for the key)
STATES = {
    "prefill": ("P", "#0072B2", "prefill (prompt K/V computed)"),
    "chunk": ("p", "#9ECAE1", "part of a prefill (v1: a chunk, no token yet)"),
    "decode": ("D", "#56B4E9", "decode (one token)"),
    "waiting": (".", "#E0E0E0", "waiting"),
    "swapped": ("S", "#E69F00", "swapped out to CPU"),
    "preempted": ("X", "#D55E00", "preempted this step"),
    "ignored": ("!", "#000000", "ignored: can never fit"),
    "idle": ("_", "#CC79A7", "finished, its batch slot idle (static batching)"),
    "held": ("-", "#F0E442", "running, no token: a step of prompts only"),
}


@dataclass
class Timeline:
    """Per step, the state of every request the scheduler knew about then, and the tokens each was scheduled."""

    requests: list = field(default_factory=list)  # request ids in order of first appearance
    steps: list = field(default_factory=list)  # one {request_id: state} per step
    tokens: list = field(default_factory=list)  # one {request_id: tokens scheduled} per step (draw_token_budget)

    def record(self, scheduler, out) -> None:
        """Call right after ``scheduler.schedule()`` (v0's or v1's): reads the queues and the step's outputs."""
        if hasattr(out, "num_scheduled_tokens"):
            return self._record_v1(scheduler, out)
        states = dict.fromkeys(scheduler.waiting, "waiting")
        states.update(dict.fromkeys(scheduler.swapped, "swapped"))
        states.update({request_id: "prefill" for request_id, _ in out.prefills})
        states.update(dict.fromkeys(out.decodes, "decode"))
        states.update(dict.fromkeys(out.preempted, "preempted"))
        states.update(dict.fromkeys(out.ignored, "ignored"))
        self._append(scheduler, states, {**{r: len(t) for r, t in out.prefills}, **dict.fromkeys(out.decodes, 1)})

    def _record_v1(self, scheduler, out) -> None:
        """v1 has no phases: a request whose chunk ends its tokens samples (a decode, or a prefill's last
        chunk); one whose chunk does not is part-way through its prompt."""
        states = dict.fromkeys(scheduler.waiting, "waiting")
        for request_id, num_tokens in out.num_scheduled_tokens.items():
            request = scheduler.requests[request_id]
            if request.num_computed_tokens < request.num_tokens:
                states[request_id] = "chunk"
            else:
                states[request_id] = "decode" if num_tokens == 1 and request.output_token_ids else "prefill"
        states.update(dict.fromkeys(out.preempted_req_ids, "preempted"))
        self._append(scheduler, states, dict(out.num_scheduled_tokens))

    def _append(self, scheduler, states: dict, tokens: dict) -> None:
        for request_id in [*scheduler.requests, *states]:  # rows in order of arrival
            if request_id in states and request_id not in self.requests:
                self.requests.append(request_id)
        self.steps.append(states)
        self.tokens.append(tokens)

    def total_tokens(self) -> list[int]:
        """Each step's scheduled tokens, every request's together (v1: ``total_num_scheduled_tokens``)."""
        return [sum(tokens.values()) for tokens in self.tokens]

    def row(self, request_id) -> str:
        return "".join(STATES[s[request_id]][0] if request_id in s else " " for s in self.steps)

    def finished_at(self, request_id) -> int | None:
        """The last step the request ran in (None if it never ran)."""
        ran = [i for i, s in enumerate(self.steps) if s.get(request_id) in ("prefill", "chunk", "decode")]
        return ran[-1] if ran else None

    def __str__(self) -> str:
        width = max((len(str(r)) for r in self.requests), default=4)
        ruler = "".join(str(i % 10) for i in range(len(self.steps)))
        lines = [f"{'step':>{width}}  {ruler}"]
        lines += [f"{str(r):>{width}}  {self.row(r)}" for r in self.requests]
        used = {state for s in self.steps for state in s.values()}
        lines.append("  " + "  ".join(f"{letter} {name}" for name, (letter, _, _) in STATES.items() if name in used))
        return "\n".join(lines)


def draw_timeline(timeline: Timeline, ax=None, title: str | None = None):
    """Requests as rows, steps as columns, coloured by state, with a key; returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(min(12, 2 + 0.22 * len(timeline.steps)), 0.9 + 0.32 * len(timeline.requests)))
    for y, request_id in enumerate(timeline.requests):
        for x, states in enumerate(timeline.steps):
            if request_id in states:  # a v1 chunk is a half-height (partial) prefill bar
                height = 0.42 if states[request_id] == "chunk" else 0.85
                ax.add_patch(plt.Rectangle((x, y + 0.85 - height), 1, height, color=STATES[states[request_id]][1],
                                           lw=0))
    num_steps = max(1, len(timeline.steps))
    every = max(1, -(-num_steps // 20))  # at most ~20 labelled steps, at the cells' centres
    ax.set_xlim(0, num_steps)
    ax.set_xticks([x + 0.5 for x in range(0, num_steps, every)], [str(x) for x in range(0, num_steps, every)])
    ax.set_ylim(len(timeline.requests), -0.15)
    ax.set_yticks([y + 0.42 for y in range(len(timeline.requests))], [str(r) for r in timeline.requests])
    ax.set_xlabel("step")
    used = {state for s in timeline.steps for state in s.values()}
    ax.legend(handles=[Patch(color=color, label=words) for name, (_, color, words) in STATES.items() if name in used],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax
