"""A scripted scenario, one step at a time: predict, then see (notebook 08, section 3).

Each step asks a question about the state the step leaves.  ``replay.step(k, prediction)``
does nothing until it is given a prediction: the map stays hidden until the student has
committed to one.  Then it runs the step on a real manager (through the visualizer), says
whether the prediction was right and why, and prints and draws the map.  The true answers
are read off the manager, never written in the notebook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt

from .block_map import draw_block_map
from .visualizer import BlockTableVisualizer


@dataclass(frozen=True)
class Step:
    title: str  # what the step does
    question: str  # what to predict about the state it leaves
    run: Callable[[BlockTableVisualizer], Any]  # does the step; returns the true answer
    why: str  # one line: the rule behind the answer


def _joined_queue(v: BlockTableVisualizer, seq_id: str) -> list[int]:
    before = v.manager.free_block_ids()
    v.free(seq_id)
    return v.manager.free_block_ids()[len(before):]


def _table_after(action: Callable[[BlockTableVisualizer], Any], seq_id: str):
    def run(v: BlockTableVisualizer):
        action(v)
        return v.manager.get_block_table(seq_id)

    return run


def _free_after(action: Callable[[BlockTableVisualizer], Any]):
    def run(v: BlockTableVisualizer):
        action(v)
        return v.manager.num_free_gpu_blocks

    return run


SETTINGS_08 = dict(block_size=4, num_gpu_blocks=10, num_cpu_blocks=0)

SCENARIO_08 = (
    Step("add A, a 7-token prompt", "A's block table?",
         _table_after(lambda v: v.add_sequence(7), "A"),
         "7 tokens need 2 blocks of 4, taken from the head of a fresh free queue."),
    Step("add B, a 10-token prompt", "B's block table?",
         _table_after(lambda v: v.add_sequence(10), "B"),
         "3 blocks, the next three at the head of the queue."),
    Step("fork A into C (parallel sampling)", "how many GPU blocks are free after the fork?",
         _free_after(lambda v: v.fork("A")),
         "a fork copies the block table and raises ref counts; it takes no block."),
    Step("C appends 1 token", "C's block table?",
         _table_after(lambda v: v.append("C", 1), "C"),
         "C writes into a shared, partly filled block: copy-on-write gives it a private copy from the queue's head."),
    Step("A appends 1 token", "how many GPU blocks are free now?",
         _free_after(lambda v: v.append("A", 1)),
         "A's last block is A's alone since C's copy: A fills its last slot in place, no copy, no new block."),
    Step("free B", "which blocks join the free queue, in the order they join?",
         lambda v: _joined_queue(v, "B"),
         "a table is freed from its last block, and each block joins the queue's tail."),
    Step("add D, an 18-token prompt", "D's block table?",
         _table_after(lambda v: v.add_sequence(18), "D"),
         "5 blocks from the queue's head: first the blocks never used, then B's, last block first."),
)


def _blank(value) -> bool:
    return value is None or value is Ellipsis


def _plain(value):
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class ScenarioReplay:
    """Notebook 08's scenario (or any list of :class:`Step`), replayed one predicted step at a time."""

    def __init__(self, steps=SCENARIO_08, **settings):
        self.steps = steps
        self.visualizer = BlockTableVisualizer(**(settings or SETTINGS_08))
        self.done = 0

    def step(self, number: int, prediction=...) -> None:
        """Run step ``number`` once a prediction is given; say if it was right, why, and show the map."""
        step = self.steps[number - 1]
        print(f"--- step {number}: {step.title}. Predict: {step.question}")
        if _blank(prediction):
            print("Write your prediction first: the map stays hidden until you do.")
            return
        if number != self.done + 1:
            print(f"Run step {self.done + 1} first: the steps build on each other.")
            return
        truth = step.run(self.visualizer)
        self.done = number
        verdict = "[ok]" if _plain(prediction) == _plain(truth) else "[not quite]"
        print(f"{verdict} you said {prediction!r}; it is {truth!r}: {step.why}")
        state = self.visualizer.snapshot()
        print(state)
        draw_block_map(state, highlight=self.visualizer.last_touched, title=f"step {number}: {step.title}", key=True)
        plt.show()


def replay_all(steps=SCENARIO_08, settings=None) -> BlockTableVisualizer:
    """Every step run without predictions (for checks that start from the scenario's end)."""
    visualizer = BlockTableVisualizer(**(settings or SETTINGS_08))
    for step in steps:
        step.run(visualizer)
    return visualizer
