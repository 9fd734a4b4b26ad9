"""A companion to the block-table visualizer: step a ``Scheduler`` and watch its queues and blocks.

``version="v0"`` steps the paper's scheduler (prefills and decodes, swap or recompute); ``version="v1"`` steps
vLLM today's (``pagedkv.v1``: one token budget, prompts chunked, recompute only), whose chunks the timeline
draws as half-height prefill bars. ``sliding_window=8`` (v1 only) makes the stand-in model hybrid, one sliding and
one full attention layer: each request then holds one block table per KV cache group over one pool, and
the sliding group's table points at the null block for blocks that left the window. ``show_group`` picks the
group whose tables the map and the text map show (None: every group, one table under the other).

Plain methods first (``step``, ``add_request``, ``reset``, ``status_text``, ``show_group``, ``map_text``), so
tests drive it without a browser; the buttons only call them.  Requests are
served by a stand-in model (a deterministic function of the tokens so far):
the scheduler never looks at what a token means, only at how many there are.
"""

from __future__ import annotations

import dataclasses
import html
import random

import ipywidgets as widgets
import matplotlib.pyplot as plt

from ..errors import PagedKVError, PagedKVValueError
from ..manager import BlockSpaceManager
from ..scheduler import Scheduler, stand_in_model  # noqa: F401 (stand_in_model: re-exported)
from ..state import render_state
from ..v1 import FullAttentionSpec, KVCacheManager, SlidingWindowSpec, get_kv_cache_groups
from ..v1 import Scheduler as V1Scheduler
from ..validate import check_choice, check_int
from .block_map import draw_block_map, key_below, seq_colors
from .timeline import Timeline, draw_timeline
from .widget_output import show_figure

EVERY_GROUP = "every group"  # the group dropdown's first choice: every group's tables, one under the other
FIGURE_SIZE = (9, 7.5)  # inches: the block map over the timeline
# The text map: never wrapped (a line wrapped anywhere is no map), in the code font, as JupyterLab shows a <pre>.
MAP_STYLE = "white-space: pre; margin: 0; line-height: 1.3; font-family: var(--jp-code-font-family, monospace)"
HYBRID_WINDOW = 8  # the "v1 hybrid" mode's window: two blocks of 4 tokens, so the window slides within a few steps


class SchedulerVisualizer:
    """``SchedulerVisualizer()`` starts a small pool with a burst of requests; ``step()`` runs one step."""

    def __init__(self, *, num_gpu_blocks: int = 12, block_size: int = 4, num_cpu_blocks: int = 8,
                 preemption_mode: str = "recompute", watermark: float = 0.0, num_requests: int = 5,
                 max_num_seqs: int = 8, seed: int = 0, version: str = "v0", max_num_batched_tokens: int = 16,
                 sliding_window: int | None = None):
        """``max_num_batched_tokens`` is v1's budget (small, so chunks show); v0 here admits whole prompts.
        ``sliding_window``: v1 only, a hybrid model (a full and a sliding KV cache group); None: full attention."""
        self.settings = dict(num_gpu_blocks=num_gpu_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                             preemption_mode=preemption_mode, watermark=watermark, num_requests=num_requests,
                             max_num_seqs=max_num_seqs, seed=seed, version=version,
                             max_num_batched_tokens=max_num_batched_tokens, sliding_window=sliding_window)
        self._displayed, self.group = False, None
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
        self.group = self.group if self.group in self.group_names else None
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
            groups = None if s["sliding_window"] is None else hybrid_groups(s["block_size"], s["sliding_window"])
            manager = KVCacheManager(s["block_size"], s["num_gpu_blocks"], kv_cache_groups=groups,
                                     max_num_batched_tokens=s["max_num_batched_tokens"])
            return manager, V1Scheduler(manager, s["max_num_seqs"], s["max_num_batched_tokens"])
        if s["sliding_window"] is not None:
            raise PagedKVValueError(f"sliding_window={s['sliding_window']!r} needs version='v1': the paper's engine "
                                    "keeps every token of every layer (set sliding_window=None for v0).")
        manager = BlockSpaceManager(s["block_size"], s["num_gpu_blocks"], s["num_cpu_blocks"], s["watermark"])
        return manager, Scheduler(manager, s["max_num_seqs"], max(64, s["max_num_seqs"]), s["preemption_mode"])

    @property
    def is_v1(self) -> bool:
        return self.settings["version"] == "v1"

    @property
    def group_names(self) -> tuple:
        """The KV cache groups' names (``("sliding 8", "full")``) when the model is hybrid, else ``()``."""
        return tuple(g.name for g in self.manager.kv_cache_groups) if self.is_v1 and self.manager.is_hybrid else ()

    def show_group(self, group: str | None) -> bool:
        """Show only ``group``'s tables (one of ``group_names``), or every group's (None); False if refused."""
        if group is not None and group not in self.group_names:
            self.message = (f"show group failed: {group!r} is not a KV cache group here; use None or one of "
                            f"{list(self.group_names)} (a hybrid model: version='v1' with a sliding_window).")
            ok = False
        else:
            self.group, self.message, ok = group, f"showing {group or 'every group'}'s block tables", True
        if hasattr(self, "output"):
            self.refresh()
        return ok

    def snapshot(self):
        """The manager's snapshot, its tables cut down to the shown group (the pool is every group's)."""
        state = self.manager.snapshot()
        if self.group is None:
            return state
        i = self.group_names.index(self.group)
        return dataclasses.replace(state, tables={r: t[i] for r, t in state.group_tables.items()},
                                   group_tables={r: (t[i],) for r, t in state.group_tables.items()},
                                   group_names=(self.group,))

    def map_text(self) -> str:
        """The text block map of what the figure shows: used blocks (the null block too), free queue, tables."""
        return render_state(self.snapshot())

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
            null = "" if kv.null_block is None else f", block {kv.null_block} being the null block"
            return (f"v1: running {s.running}  waiting {s.waiting}  finished {len(s.finished)}\n"
                    f"GPU blocks {kv.num_gpu_blocks - kv.num_free_blocks}/{kv.num_gpu_blocks} used{null} (no CPU pool: "
                    f"v1 only recomputes); preemptions {s.num_preemptions}, tokens to recompute "
                    f"{s.num_recomputed_tokens}")
        s, m = self.scheduler, self.manager
        used = m.num_total_gpu_blocks - m.num_free_gpu_blocks
        return (f"running {s.running}  waiting {s.waiting}  swapped {s.swapped}  finished {len(s.finished)}\n"
                f"GPU blocks {used}/{m.num_total_gpu_blocks} used, CPU {m.num_total_cpu_blocks - m.num_free_cpu_blocks}"
                f"/{m.num_total_cpu_blocks}; preemptions {s.num_preemptions}, "
                f"tokens to recompute {s.num_recomputed_tokens}")

    # ------------------------------------------------------------- the view
    def _build_widgets(self) -> None:
        w = widgets
        self.buttons = {}
        for label, handler in (("step", lambda _: self.step()), ("5 steps", lambda _: self.step(5)),
                               ("add request", lambda _: (self.add_request(), self.refresh())),
                               ("reset", lambda _: self._reset_from_controls())):
            self.buttons[label] = w.Button(description=label, layout=w.Layout(width="110px"))
            self.buttons[label].on_click(handler)
        modes = [("v0, recompute", "recompute"), ("v0, swap", "swap"), ("v1 (chunked, recompute)", "v1"),
                 (f"v1 hybrid (full + sliding {HYBRID_WINDOW})", "v1 hybrid")]
        mode = "v1 hybrid" if self.group_names else "v1" if self.is_v1 else self.settings["preemption_mode"]
        self.mode = w.Dropdown(options=modes, value=mode, description="scheduler", layout=w.Layout(width="300px"))
        self.group_select = w.Dropdown(description="tables of", layout=w.Layout(width="220px"))
        self._syncing = False
        self.group_select.observe(self._on_group_select, names="value")
        self.gpu_blocks = w.BoundedIntText(value=self.settings["num_gpu_blocks"], min=1, max=256,
                                           description="GPU blocks", layout=w.Layout(width="170px"))
        self.status_html, self.message_html, self.output, self.map_html = w.HTML(), w.HTML(), w.Output(), w.HTML()
        # The text map beside the drawing where the screen is wide enough for both (1920 px), else under it
        # (issue #46: squeezed into the space left, it was a ~40 px column of broken words).
        # The drawing's box is the figure's width (an Output's own width would be the whole row's); it shrinks,
        # and its picture with it, only on a screen narrower than the figure.
        self.output.layout = w.Layout(flex=f"0 1 {round(FIGURE_SIZE[0] * plt.rcParams['figure.dpi'])}px")
        self.map_html.layout = w.Layout(flex="0 0 auto", margin="0 12px")
        self.widget = w.VBox([w.HBox([*self.buttons.values(), self.mode, self.gpu_blocks]), self.group_select,
                              self.message_html, self.status_html,
                              w.HBox([self.output, self.map_html], layout=w.Layout(flex_flow="row wrap"))])

    def _reset_from_controls(self) -> None:
        v1 = self.mode.value.startswith("v1")
        self.reset(version="v1" if v1 else "v0", preemption_mode="recompute" if v1 else self.mode.value,
                   num_gpu_blocks=self.gpu_blocks.value,
                   sliding_window=HYBRID_WINDOW if self.mode.value == "v1 hybrid" else None)

    def _on_group_select(self, change) -> None:
        if not self._syncing:  # a user's choice, not refresh() catching the dropdown up
            self.show_group(None if change["new"] == EVERY_GROUP else change["new"])

    def _sync_group_select(self) -> None:
        """The group dropdown: shown for a hybrid model only, its options that model's groups."""
        self._syncing = True
        try:
            options = (EVERY_GROUP, *self.group_names)
            if tuple(self.group_select.options) != options:
                self.group_select.options = options
            self.group_select.value = self.group or EVERY_GROUP
        finally:
            self._syncing = False
        self.group_select.layout.display = "" if self.group_names else "none"

    def refresh(self) -> None:
        self._sync_group_select()
        self.status_html.value = f"<pre class='pagedkv-status'>{html.escape(self.status_text())}</pre>"
        self.message_html.value = f"<span class='pagedkv-message'>{html.escape(self.message)}</span>"
        self.map_html.value = (f"<pre class='pagedkv-map' style='{MAP_STYLE}'>{html.escape(self.map_text())}</pre>")
        if not self._displayed:
            return
        show_figure(self.output, self.figure())  # not `with self.output: plt.show()`: see widget_output.py

    def figure(self):
        """The block map over the timeline, as the widget draws them: also a still picture where widgets do
        not run (on GitHub, say)."""
        fig, (top, bottom) = plt.subplots(2, 1, figsize=FIGURE_SIZE, height_ratios=[3, 2])
        state = self.snapshot()
        colors = seq_colors(state)
        moment = f"after step {len(self.timeline.steps) - 1} and its update" if self.timeline.steps else "before step 0"
        draw_block_map(state, ax=top, colors=colors, title=f"block_size {state.block_size}, {moment}: "
                       f"{state.num_used('gpu')}/{state.num_gpu_blocks} GPU blocks used")
        draw_timeline(self.timeline, ax=bottom)
        key_below(fig, cached=bool(state.prefix_caching), null=state.null_block is not None,  # under both panels
                  sequences=colors if 0 < len(colors) <= 8 else None, shared=any(b.ref_count > 1 for b in state.blocks),
                  cpu=any(d == "cpu" for d in state.seq_devices.values()))
        return fig

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
        self._displayed = True
        self.refresh()


def hybrid_groups(block_size: int, sliding_window: int) -> list:
    """The KV cache groups of a stand-in model with one sliding and one full attention layer: two groups, one
    table each, over one pool (vLLM 0.33: ``get_kv_cache_groups`` in ``vllm/v1/core/kv_cache_planning.py``).
    One KV head of size 1: the scheduler never looks at a page's shape."""
    window = check_int("sliding_window", sliding_window, minimum=1)
    shape = dict(block_size=block_size, num_kv_heads=1, head_size=1)
    return get_kv_cache_groups([SlidingWindowSpec(**shape, sliding_window=window), FullAttentionSpec(**shape)])
