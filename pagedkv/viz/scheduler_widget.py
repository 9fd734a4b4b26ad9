"""A companion to the block-table visualizer: step a ``Scheduler`` and watch its queues and blocks.

``version="v0"`` steps the paper's scheduler (prefills and decodes, swap or recompute); ``version="v1"`` steps
vLLM today's (``pagedkv.v1``: one token budget, prompts chunked, recompute only), whose chunks the timeline
draws as half-height prefill bars.

Plain methods first (``step``, ``add_request``, ``reset``, ``status_text``), so
tests drive it without a browser; the buttons only call them.  Requests are
served by a stand-in model (a deterministic function of the tokens so far):
the scheduler never looks at what a token means, only at how many there are.
"""

from __future__ import annotations

import html
import random

import ipywidgets as widgets
import matplotlib.pyplot as plt

from ..errors import PagedKVError, PagedKVValueError
from ..manager import BlockSpaceManager
from ..scheduler import Scheduler
from ..v1 import KVCacheManager
from ..v1 import Scheduler as V1Scheduler
from ..validate import check_choice, check_int
from .block_map import add_block_map_key, draw_block_map
from .timeline import Timeline, draw_timeline


def stand_in_model(token_ids: list[int]) -> int:
    """The next token: any deterministic function of the sequence would do."""
    return (sum(token_ids) * 31 + len(token_ids)) % 1000


class SchedulerVisualizer:
    """``SchedulerVisualizer()`` starts a small pool with a burst of requests; ``step()`` runs one step."""

    def __init__(self, *, num_gpu_blocks: int = 12, block_size: int = 4, num_cpu_blocks: int = 8,
                 preemption_mode: str = "recompute", watermark: float = 0.0, num_requests: int = 5,
                 max_num_seqs: int = 8, seed: int = 0, version: str = "v0", max_num_batched_tokens: int = 16):
        """``max_num_batched_tokens`` is v1's budget (small, so chunks show); v0 here admits whole prompts."""
        self.settings = dict(num_gpu_blocks=num_gpu_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                             preemption_mode=preemption_mode, watermark=watermark, num_requests=num_requests,
                             max_num_seqs=max_num_seqs, seed=seed, version=version,
                             max_num_batched_tokens=max_num_batched_tokens)
        self._displayed = False
        if not self.reset():
            raise PagedKVValueError(self.message.removeprefix("reset failed: "))
        self._build_widgets()
        self.refresh()

    # ------------------------------------------------------------ the model
    def reset(self, **settings) -> bool:
        """Start again (keyword arguments change the settings); a bad setting is refused and changes nothing."""
        new = {**self.settings, **settings}
        try:
            unknown = sorted(set(settings) - set(self.settings))
            if unknown:
                raise PagedKVValueError(f"unknown settings {unknown}; use {sorted(self.settings)}.")
            check_int("num_requests", new["num_requests"], minimum=0)
            manager, scheduler = self._make(new)
        except PagedKVError as error:
            self.message = f"reset failed: {error}"
            if hasattr(self, "output"):
                self.refresh()
            return False
        self.settings, self.manager, self.scheduler = new, manager, scheduler
        self.rng = random.Random(new["seed"])
        self.timeline, self.last, self.message, self._next_id = Timeline(), None, "", 0
        self.last_chunks: dict = {}
        for _ in range(new["num_requests"]):
            self.add_request()
        if hasattr(self, "output"):
            self.refresh()
        return True

    @staticmethod
    def _make(s: dict):
        if check_choice("version", s["version"], ("v0", "v1")) == "v1":
            manager = KVCacheManager(s["block_size"], s["num_gpu_blocks"])
            return manager, V1Scheduler(manager, s["max_num_seqs"], s["max_num_batched_tokens"])
        manager = BlockSpaceManager(s["block_size"], s["num_gpu_blocks"], s["num_cpu_blocks"], s["watermark"])
        return manager, Scheduler(manager, s["max_num_seqs"], max(64, s["max_num_seqs"]), s["preemption_mode"])

    @property
    def is_v1(self) -> bool:
        return self.settings["version"] == "v1"

    def add_request(self, prompt_len: int | None = None, max_tokens: int | None = None):
        """Queue a request (random lengths unless given); returns its id, or None if it was refused."""
        prompt_len = prompt_len if prompt_len is not None else self.rng.randint(2, 3 * self.settings["block_size"])
        max_tokens = max_tokens if max_tokens is not None else self.rng.randint(2, 4 * self.settings["block_size"])
        request_id = f"r{self._next_id}"
        try:
            length = check_int("prompt_len", prompt_len, minimum=0)  # 0 is refused below, as an empty prompt
            self.scheduler.add_request(request_id, [self.rng.randrange(1000) for _ in range(length)], max_tokens)
        except PagedKVError as error:
            self.message = f"add request failed: {error}"
            return None
        self._next_id += 1
        self.message = f"added {request_id}: {prompt_len} prompt tokens, up to {max_tokens} new"
        return request_id

    def step(self, num_steps: int = 1) -> int:
        """Run up to ``num_steps`` scheduler steps; returns how many ran (0 when every request is done)."""
        try:
            num_steps = check_int("num_steps", num_steps, minimum=1)
        except PagedKVError as error:
            self.message = f"step failed: {error}"
            return 0
        ran = 0
        while ran < num_steps and self.scheduler.has_unfinished_requests():
            out = self.scheduler.schedule()
            self.timeline.record(self.scheduler, out)
            self.last = out
            if self.is_v1:
                self.last_chunks = {r: (n, self.scheduler.requests[r].num_tokens)
                                    for r, n in out.num_scheduled_tokens.items()}
                self.scheduler.update_from_output(out, {r: stand_in_model(self.scheduler.requests[r].all_token_ids)
                                                        for r in self.scheduler.sampling_request_ids(out)})
            else:
                self.scheduler.update(out, {r: stand_in_model(self.scheduler.requests[r].token_ids)
                                            for r in out.scheduled})
            ran += 1
        self.message = self.step_summary() if ran else "every request has finished: add one, or reset"
        if hasattr(self, "output"):
            self.refresh()
        return ran

    def step_summary(self) -> str:
        out = self.last
        if out is None:
            return "no step yet"
        parts = [f"step {len(self.timeline.steps) - 1}:"]
        if self.is_v1:
            return "  ".join(parts + self._v1_summary(out))
        if out.prefills:
            parts.append("prefill " + ", ".join(f"{r} ({len(t)} tokens)" for r, t in out.prefills))
        if out.decodes:
            parts.append("decode " + ", ".join(map(str, out.decodes)))
        if out.preempted:
            how = {r: "swap" if r in out.swapped_out else "recompute" for r in out.preempted}
            parts.append("PREEMPTED " + ", ".join(f"{r} ({how[r]})" for r in out.preempted))
        if out.blocks_to_swap_in:
            parts.append(f"swap in {out.blocks_to_swap_in}")
        if out.ignored:
            parts.append("ignored " + ", ".join(map(str, out.ignored)))
        return "  ".join(parts)

    def _v1_summary(self, out) -> list[str]:
        """v1: each request's share of the budget, e.g. ``r3 8 of 20``, then who was preempted."""
        shares = [f"{r} {n}" + (f" of {total}" if n > 1 else "") for r, (n, total) in self.last_chunks.items()]
        parts = [f"budget {out.total_num_scheduled_tokens}/{self.scheduler.max_num_batched_tokens} tokens: "
                 + ", ".join(shares)] if shares else []
        if out.preempted_req_ids:
            parts.append("PREEMPTED " + ", ".join(f"{r} (recompute)" for r in out.preempted_req_ids))
        return parts

    def status_text(self) -> str:
        if self.is_v1:
            s, kv = self.scheduler, self.manager
            return (f"v1: running {s.running}  waiting {s.waiting}  finished {len(s.finished)}\n"
                    f"GPU blocks {kv.num_gpu_blocks - kv.num_free_blocks}/{kv.num_gpu_blocks} used (no CPU pool: "
                    f"v1 only recomputes); preemptions {s.num_preemptions}, tokens recomputed "
                    f"{s.num_recomputed_tokens}")
        s, m = self.scheduler, self.manager
        used = m.num_total_gpu_blocks - m.num_free_gpu_blocks
        return (f"running {s.running}  waiting {s.waiting}  swapped {s.swapped}  finished {len(s.finished)}\n"
                f"GPU blocks {used}/{m.num_total_gpu_blocks} used, CPU {m.num_total_cpu_blocks - m.num_free_cpu_blocks}"
                f"/{m.num_total_cpu_blocks}; preemptions {s.num_preemptions}, "
                f"tokens recomputed {s.num_recomputed_tokens}")

    # ------------------------------------------------------------- the view
    def _build_widgets(self) -> None:
        w = widgets
        self.buttons = {}
        for label, handler in (("step", lambda _: self.step()), ("5 steps", lambda _: self.step(5)),
                               ("add request", lambda _: (self.add_request(), self.refresh())),
                               ("reset", lambda _: self._reset_from_controls())):
            self.buttons[label] = w.Button(description=label, layout=w.Layout(width="110px"))
            self.buttons[label].on_click(handler)
        modes = [("v0, recompute", "recompute"), ("v0, swap", "swap"), ("v1 (chunked, recompute)", "v1")]
        self.mode = w.Dropdown(options=modes, value="v1" if self.is_v1 else self.settings["preemption_mode"],
                               description="scheduler", layout=w.Layout(width="260px"))
        self.gpu_blocks = w.BoundedIntText(value=self.settings["num_gpu_blocks"], min=1, max=256,
                                           description="GPU blocks", layout=w.Layout(width="170px"))
        self.status_html, self.message_html, self.output = w.HTML(), w.HTML(), w.Output()
        self.widget = w.VBox([w.HBox([*self.buttons.values(), self.mode, self.gpu_blocks]),
                              self.message_html, self.status_html, self.output])

    def _reset_from_controls(self) -> None:
        v1 = self.mode.value == "v1"
        self.reset(version="v1" if v1 else "v0", preemption_mode="recompute" if v1 else self.mode.value,
                   num_gpu_blocks=self.gpu_blocks.value)

    def refresh(self) -> None:
        self.status_html.value = f"<pre class='pagedkv-status'>{html.escape(self.status_text())}</pre>"
        self.message_html.value = f"<span class='pagedkv-message'>{html.escape(self.message)}</span>"
        if not self._displayed:
            return
        with self.output:
            self.output.clear_output(wait=True)
            self.figure()
            plt.show()

    def figure(self):
        """The block map over the timeline, as the widget draws them: also a still picture where widgets do
        not run (on GitHub, say)."""
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.5), height_ratios=[3, 2])
        state = self.manager.snapshot()
        draw_block_map(state, ax=top)
        draw_timeline(self.timeline, ax=bottom)
        add_block_map_key(fig, cached=bool(state.prefix_caching))  # under both panels, over neither
        fig.tight_layout(rect=(0, 0.16, 1, 1))
        return fig

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
        self._displayed = True
        self.refresh()
