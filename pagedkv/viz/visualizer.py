"""The interactive block-table visualizer: buttons that drive a paged KV cache, and its live block map.

All logic is in plain methods (``add_sequence``, ``append``, ``fork``, ``free``,
``swap_out``, ``swap_in``, ``beam_step``, ``reset``) that the buttons call, so
tests drive it without a browser.  An action that fails shows its message in
the widget and changes nothing (every pagedkv error guarantees that).
The drawing is matplotlib into an ``ipywidgets.Output``: no front-end build,
so it works in JupyterLab, VS Code and Colab alike.
"""

from __future__ import annotations

import html
import random

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from ..decoding import GroupDecoding, synthetic_prompt, tiny_model
from ..engine import LLMEngine
from ..errors import PagedKVError, PagedKVValueError
from ..manager import BlockSpaceManager
from ..paged_cache import PagedKVCache
from ..sampling import BeamSearchParams
from ..state import seq_name
from ..validate import check_int
from .block_map import add_block_map_key, draw_block_map, key_beside, seq_colors
from .compact_png import compact_png
from .widget_output import show_figure

SEQUENCE_ACTIONS = ("append", "fork", "free", "swap out", "swap in")
BEAM_TOKENS = 64  # a beam search runs this many clicks, then its blocks are freed
MAX_POSITIONS = 1024  # the tiny Llama's context
FIGURE_WIDTH = 9.0  # inches: the map's figure (900 px at matplotlib's 100 dpi), wide enough for its key
CELL_INCHES = 0.36  # a block map cell's pitch: ~36 px, room for three rows of 8 pt text
TITLE_INCHES = 0.45  # the map's title above it
STILL_INCHES = (7.5, 3.6)  # a still (``show``): the map, and its key beside it in the right 40 %


def _count(n: int, one: str, many: str) -> str:
    """``1 block``, ``2 blocks``."""
    return f"{n} {one if n == 1 else many}"


def _kv(cache: PagedKVCache, tokens) -> torch.Tensor:
    """A hand-made sequence's keys: token ``t``'s key is ``t`` in every element."""
    engine = cache.engine
    keys = torch.as_tensor(list(tokens), dtype=engine.dtype).view(-1, 1, 1)
    return keys.expand(-1, engine.num_kv_heads, engine.head_size).contiguous()


def counters(state) -> dict:
    """Live figures shown under the map, computed from a snapshot."""
    stats = state.prefix_stats
    return {"blocks_used": state.num_used("gpu"), "num_gpu_blocks": state.num_gpu_blocks,
            "usage": state.usage, "internal_fragmentation": state.internal_fragmentation,
            "hit_rate": stats["hit_rate"] if stats else None}


class BlockTableVisualizer:
    """``BlockTableVisualizer()`` makes its own small cache; pass ``target`` to watch yours."""

    def __init__(self, target: PagedKVCache | BlockSpaceManager | None = None, *, block_size: int = 4,
                 num_gpu_blocks: int = 24, num_cpu_blocks: int = 8, watermark: float = 0.0,
                 enable_prefix_caching: bool = False, beam_width: int = 3, seed: int = 0):
        if target is not None and not isinstance(target, (PagedKVCache, BlockSpaceManager)):
            raise PagedKVValueError(f"target must be a PagedKVCache, a BlockSpaceManager or None (a new cache), "
                                    f"got {target!r}.")
        self.settings = dict(block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                             watermark=watermark, enable_prefix_caching=enable_prefix_caching)
        self.beam_width = check_int("beam_width", beam_width, minimum=1)
        self.rng = random.Random(check_int("seed", seed, minimum=0))
        self.message, self.message_is_error = "", False
        self.log: list[str] = []
        self.last_touched: list = []
        self._displayed = False  # draw into the Output widget only once it is on screen
        self._select = None  # the sequence the menu should show after the next refresh
        self._attach(target or self._new_cache())
        self._build_widgets()
        self.refresh()

    # ------------------------------------------------------------ the model
    def _new_cache(self, settings: dict | None = None) -> PagedKVCache:
        s = settings or self.settings
        return PagedKVCache(s["num_gpu_blocks"], s["block_size"], num_kv_heads=1, head_size=1,
                            num_cpu_blocks=s["num_cpu_blocks"], watermark=s["watermark"],
                            enable_prefix_caching=s["enable_prefix_caching"])

    def _attach(self, target) -> None:
        self.cache = target if isinstance(target, PagedKVCache) else None
        self.manager = self.cache.manager if self.cache else target
        self.engine: LLMEngine | None = None  # made at the first beam step, over this manager
        self.beam: GroupDecoding | None = None
        self.beam_output = None  # the last finished beam search's RequestOutput
        self.last_step = None  # the counts of the engine step the last beam-step click ran (a ``StepStats``)
        self._colors: dict = {}  # seq_id -> colour, kept from drawing to drawing
        self._last_prompt: list = []  # what "same prompt" repeats
        self._extent = None  # the map's axis limits, which only grow while the pool stays the same
        self._next_name = 0

    @property
    def seq_ids(self) -> list:
        return self.manager.seq_ids

    def snapshot(self):
        return self.manager.snapshot()

    def counters(self) -> dict:
        return counters(self.snapshot())

    def _act(self, description: str, action) -> bool:
        """Run one action; on a pagedkv error keep the state and show the message instead."""
        self.message, self.message_is_error = "", False  # an action may set an informative message of its own
        try:
            touched = action()
        except PagedKVError as error:
            self.message, self.message_is_error = f"{description} failed: {error}", True
            self.last_touched = []  # a failed action touched nothing: outline nothing
            self.refresh()
            return False
        self.last_touched = list(touched or [])
        self.log.append(description)
        self.refresh()
        return True

    def _name(self) -> str:
        """The next free sequence name: A, B, ..., Z, A1, B1, ..."""
        while True:
            n = self._next_name
            name = chr(ord("A") + n % 26) + ("" if n < 26 else str(n // 26))
            if not self.manager.has_seq(name):
                return name
            self._next_name += 1

    def _prompt(self, length: int, reuse: bool) -> list[int]:
        """``reuse``: start with the previous sequence's prompt (so prefix caching can hit its full blocks),
        cut to ``length`` or continued with fresh tokens; else fresh random tokens."""
        start = self._last_prompt[:length] if reuse else []
        prompt = start + [self.rng.randrange(1000, 32000) for _ in range(length - len(start))]
        self._last_prompt = prompt
        return prompt

    def add_sequence(self, prompt_len: int = 6, reuse_prompt: bool = False):
        name = self._name()

        def action():
            length = check_int("prompt length", prompt_len, minimum=1)
            tokens = self._prompt(length, reuse_prompt)
            if self.cache:  # token t's key and value are t and -t, so a gather shows whose data a block holds
                self.cache.add_sequence(name, _kv(self.cache, tokens), -_kv(self.cache, tokens), token_ids=tokens)
            else:
                self.manager.allocate(name, tokens)
            return self.manager.get_block_table(name)

        self._select = name
        return name if self._act(f"add {name} ({prompt_len} tokens)", action) else None

    def append(self, seq_id, num_tokens: int = 1) -> bool:
        def action():
            count = check_int("tokens to append", num_tokens, minimum=1)
            tokens = [self.rng.randrange(1000, 32000) for _ in range(count)]
            before = self._hand_made(seq_id, "append to")
            if self.cache:
                self.cache.append(seq_id, _kv(self.cache, tokens), -_kv(self.cache, tokens), token_id=tokens)
            else:
                self.manager.append_slots(seq_id, tokens)
            after = self.manager.get_block_table(seq_id)
            return [b for b in after if b not in before] or after[-1:]  # new or copied blocks, else the last

        return self._act(f"append {num_tokens} to {seq_id}", action)

    def fork(self, seq_id):
        child = self._name()
        self._select = child
        ok = self._act(f"fork {seq_id} -> {child}",
                       lambda: (self._hand_made(seq_id, "fork"), self._target.fork(seq_id, child),
                                self.manager.get_block_table(child))[2])
        return child if ok else None

    def free(self, seq_id) -> bool:
        def action():  # outline the blocks whose ref count fell to 0: the ones that joined the free queue
            table = self._hand_made(seq_id, "free")
            self._target.free(seq_id)
            free = set(self.snapshot().free_block_ids())
            return [b for b in table if b in free]

        return self._act(f"free {seq_id}", action)

    def swap_out(self, seq_id) -> bool:
        return self._act(f"swap out {seq_id}", lambda: (self._hand_made(seq_id, "swap out"),
                                                     [("cpu", c) for _, c in self._target.swap_out(seq_id)])[1])

    def swap_in(self, seq_id) -> bool:
        return self._act(f"swap in {seq_id}", lambda: (self._hand_made(seq_id, "swap in"),
                                                    [g for _, g in self._target.swap_in(seq_id)])[1])

    @property
    def _target(self):
        return self.cache or self.manager

    def _hand_made(self, seq_id, action: str) -> list[int]:
        """A sequence the buttons may change (the beam search's belong to the engine); its block table."""
        if self.beam is not None and seq_id in self.beam.seq_ids:
            raise PagedKVValueError(f"cannot {action} {seq_name(seq_id)}: the beam search's sequences belong to the "
                                    "engine, which forks and frees them; click 'beam step' to advance it.")
        return self.manager.get_block_table(seq_id)

    def beam_step(self, prompt_len: int = 6) -> bool:
        """Start a beam search on the tiny Llama (first click: its prompt prefilled, the beams forked from it), or
        advance it one engine step: the best ``beam_width`` candidates live on, a dropped beam's blocks go back."""
        def action():
            if self.beam is None or self.beam.finished:
                return self._start_beam_search(prompt_len)
            stats = self.last_step = self.beam.step()
            held, alone = self._beam_blocks()
            if self.beam.finished:
                self.beam_output = self.engine.pop_finished(self.beam.request_id)
                self.message = (f"beam search finished after {BEAM_TOKENS} tokens: its blocks are free again; the "
                                "next click starts a new one")
                return []
            copies = _count(stats.cow_copies, "copy-on-write copy", "copy-on-write copies")
            self.message = (f"beam step {stats.step - 1}: the {stats.num_seqs} beams hold {held} blocks "
                            f"(without sharing: {alone}), {copies}, "
                            f"{_count(stats.blocks_freed, 'block', 'blocks')} freed by dropped beams")
            return [table[-1] for table in self.beam.block_tables().values()]

        return self._act("beam search step", action)

    def _start_beam_search(self, prompt_len) -> list[int]:
        length = check_int("prompt length", prompt_len, minimum=1)
        limit = MAX_POSITIONS - BEAM_TOKENS
        if length > limit:
            raise PagedKVValueError(f"a beam search prompt of {length} tokens is too long for the tiny Llama "
                                    f"(at most {limit}, so that {BEAM_TOKENS} more fit its {MAX_POSITIONS} positions).")
        needed = -(-(length + 1) // self.manager.block_size) * self.beam_width
        if needed > self.manager.num_total_gpu_blocks:
            raise PagedKVValueError(f"{self.beam_width} beams of a {length}-token prompt need up to {needed} blocks "
                                    f"of {self.manager.block_size}, more than the pool's "
                                    f"{self.manager.num_total_gpu_blocks}; a shorter prompt or a larger pool.")
        if self.engine is None:
            s = self.settings
            m = self.manager
            self.engine = LLMEngine(tiny_model(), num_gpu_blocks=m.num_total_gpu_blocks, block_size=m.block_size,
                                    num_cpu_blocks=m.num_total_cpu_blocks, watermark=s["watermark"],
                                    enable_prefix_caching=s["enable_prefix_caching"], block_manager=m)
        params = BeamSearchParams(beam_width=self.beam_width, max_tokens=BEAM_TOKENS, ignore_eos=True)
        self.beam = GroupDecoding(self.engine, synthetic_prompt(length, self.rng.randrange(1000)), params, "beam")
        self.last_step = self.beam.step()
        if not self.beam.seq_ids:
            self.message = (f"beam search queued: its {length}-token prompt waits for free blocks (free a sequence, "
                            "then click again)")
            return []
        held, _ = self._beam_blocks()
        self.message = (f"beam search started: a {length}-token prompt in {held} blocks, prefilled once and forked "
                        f"into {len(self.beam.seq_ids)} beams that share them; each click extends the best "
                        f"{self.beam_width} beams by one token")
        return sorted({b for table in self.beam.block_tables().values() for b in table})

    def _beam_blocks(self) -> tuple[int, int]:
        """The beams' blocks: distinct ones (shared blocks once), and what each beam alone would hold."""
        tables = self.beam.block_tables().values()
        return len({b for table in tables for b in table}), sum(len(table) for table in tables)

    def reset(self, **settings) -> bool:
        """Start again with an empty cache; keyword arguments change the settings (block_size, ...).

        A bad setting is refused with its message shown, and the visualizer stays as it was.
        """
        unknown = sorted(set(settings) - set(self.settings))
        new = {**self.settings, **settings}
        try:
            if unknown:
                raise PagedKVValueError(f"unknown settings {unknown}; use {sorted(self.settings)}.")
            cache = self._new_cache(new)
        except PagedKVError as error:
            self.message, self.message_is_error = f"reset failed: {error}", True
            self.refresh()
            return False
        self.settings = new
        self._attach(cache)
        self.log, self.message, self.last_touched = ["reset"], "", []
        self.refresh()
        return True

    # ------------------------------------------------------------- the view
    def _build_widgets(self) -> None:
        w = widgets
        # min 0: a 0 typed in is refused with a message by the action, not silently made 1 by the widget
        self.prompt_len = w.BoundedIntText(value=6, min=0, max=4096, description="prompt len",
                                           layout=w.Layout(width="170px"))
        self.reuse = w.Checkbox(value=False, description="same prompt as the last", indent=False,
                                layout=w.Layout(width="auto"),
                                tooltip="start with the previous sequence's prompt: with prefix caching on, its full "
                                        "blocks are shared")
        self.num_tokens = w.BoundedIntText(value=1, min=0, max=4096, description="k tokens",
                                           layout=w.Layout(width="160px"))
        self.seq_menu = w.Dropdown(options=[], description="sequence", layout=w.Layout(width="200px"))
        self.buttons = {}
        for label, handler in (
            ("add sequence", lambda _: self.add_sequence(self.prompt_len.value, self.reuse.value)),
            ("append", lambda _: self.append(self.seq_menu.value, self.num_tokens.value)),
            ("fork", lambda _: self.fork(self.seq_menu.value)),
            ("free", lambda _: self.free(self.seq_menu.value)),
            ("swap out", lambda _: self.swap_out(self.seq_menu.value)),
            ("swap in", lambda _: self.swap_in(self.seq_menu.value)),
            ("beam step", lambda _: self.beam_step(self.prompt_len.value)),
            ("reset", lambda _: self._reset_from_controls()),
        ):
            button = w.Button(description=label, layout=w.Layout(width="120px"))
            button.on_click(handler)
            self.buttons[label] = button
        self.block_size = w.BoundedIntText(value=self.settings["block_size"], min=1, max=256, description="block size",
                                           layout=w.Layout(width="170px"))
        self.gpu_blocks = w.BoundedIntText(value=self.settings["num_gpu_blocks"], min=1, max=1024,
                                           description="GPU blocks", layout=w.Layout(width="170px"))
        self.cpu_blocks = w.BoundedIntText(value=self.settings["num_cpu_blocks"], min=0, max=1024,
                                           description="CPU blocks", layout=w.Layout(width="170px"))
        self.watermark = w.BoundedFloatText(value=self.settings["watermark"], min=0, max=0.5, step=0.01,
                                            description="watermark", layout=w.Layout(width="170px"))
        self.caching = w.Checkbox(value=self.settings["enable_prefix_caching"], description="prefix caching",
                                  indent=False)
        self.counters_html = w.HTML()
        self.message_html = w.HTML()
        self.log_area = w.Textarea(disabled=True, layout=w.Layout(width="auto", height="90px"))
        self.output = w.Output()
        b = self.buttons
        self.widget = w.VBox([
            w.HBox([self.prompt_len, self.reuse, b["add sequence"], self.seq_menu, self.num_tokens]),
            w.HBox([b["append"], b["fork"], b["free"], b["swap out"], b["swap in"], b["beam step"], b["reset"]]),
            self.message_html, self.counters_html, self.output,
            w.VBox([w.HTML("<b>log</b> (newest first)"), self.log_area], layout=w.Layout(padding="0 4px 4px 0")),
            w.Accordion([w.HBox([self.block_size, self.gpu_blocks, self.cpu_blocks, self.watermark, self.caching])],
                        titles=("settings (applied on reset)",)),
        ])

    def _reset_from_controls(self) -> None:
        self.reset(block_size=self.block_size.value, num_gpu_blocks=self.gpu_blocks.value,
                   num_cpu_blocks=self.cpu_blocks.value, watermark=self.watermark.value,
                   enable_prefix_caching=self.caching.value)

    def counters_text(self) -> str:
        c = self.counters()
        hit = "off" if c["hit_rate"] is None else f"{c['hit_rate']:.0%}"
        return (f"blocks used {c['blocks_used']}/{c['num_gpu_blocks']} | usage {c['usage']:.0%} | "
                f"internal fragmentation {c['internal_fragmentation']:.0%} | prefix hit rate {hit}")

    def refresh(self) -> None:
        """Redraw the map and update the counters, the menu, the message and the log."""
        if not hasattr(self, "output"):
            return
        state = self.snapshot()
        wanted = self._select or self.seq_menu.value  # a new sequence is selected at once
        self.seq_menu.options = [(seq_name(s), s) for s in state.tables]
        if state.tables:
            self.seq_menu.value = wanted if wanted in state.tables else list(state.tables)[-1]
        self._select = None
        self.counters_html.value = f"<code class='pagedkv-counters'>{html.escape(self.counters_text())}</code>"
        color = "#B00" if self.message_is_error else "#1A5E20"  # errors red, news green
        self.message_html.value = (f"<span class='pagedkv-message' style='color:{color}'>"
                                   f"{html.escape(self.message)}</span>" if self.message else "")
        for label in SEQUENCE_ACTIONS:  # nothing to act on until a sequence exists
            self.buttons[label].disabled = not state.tables
            self.buttons[label].tooltip = "" if state.tables else "add a sequence first"
        self.log_area.value = "\n".join(reversed(self.log[-50:]))
        self._colors = seq_colors(state, self._colors)  # a sequence keeps its colour while it lives
        if not self._displayed:
            return
        fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 6))
        draw_block_map(state, ax=ax, highlight=self.last_touched, colors=self._colors)
        self._keep_scale(ax)
        add_block_map_key(fig, highlight="red outline: the blocks the last action touched",
                          cached=bool(state.prefix_caching))
        self._fit(fig, ax)
        show_figure(self.output, fig)  # not `with self.output: plt.show()`: see widget_output.py

    def show(self, title: str, touched: str, sources=(), source: str | None = None) -> None:
        """A still of the map, for a stored notebook: the text map printed, then the drawing as a small PNG with
        its key beside it. ``touched`` says in the key what the red outline marks (the blocks the last action
        changed); ``sources``: blocks outlined in purple, which the key calls ``source``. Each sequence keeps the
        colour it got when it appeared; the text adds what only the drawing showed: each cached free block's hash,
        and the CPU pool's free queue."""
        from IPython.display import display

        state = self.snapshot()
        self._colors = seq_colors(state, self._colors)
        cached = [b for b in state.device_blocks("gpu") if b.is_free and b.block_hash]
        lines = []
        for line in str(state).splitlines():
            lines.append(line)
            if line.startswith("  free GPU queue") and state.num_cpu_blocks:
                cpu_queue = " ".join(map(str, state.free_block_ids("cpu"))) or "(empty)"
                lines.append(f"  free CPU queue (next first): {cpu_queue}")
            if line.startswith("  (* = "):
                lines += [f"    block {b.block_id}: hash {b.block_hash[:8]}" for b in cached]
        print("\n".join(lines))
        colors = {seq: self._colors[seq] for seq in state.tables}
        shared = [[colors[s] for s in b.seq_ids if s in colors] for b in state.blocks if len(b.seq_ids) > 1]
        fig, ax = plt.subplots(figsize=STILL_INCHES)
        draw_block_map(state, ax=ax, highlight=self.last_touched, sources=sources, title=title, colors=colors)
        key_beside(fig, width=0.4, highlight=f"red outline: {touched}", source=source, cached=bool(cached),
                   cpu=state.num_used("cpu") > 0, sequences=colors, shared=bool(shared),
                   stripes=tuple(shared[0][:2]) if shared and len(shared[0]) > 1 else None,
                   swatch=next(iter(colors.values()), None))
        display(compact_png(fig))  # a PNG of few colours: the stored notebook stays light

    def _keep_scale(self, ax) -> None:
        """At least 12 table entries wide, so a growing table does not move the pools; the limits only grow (a
        reset starts again), so a map does not jump as sequences come and go."""
        (x0, x1), (y1, y0) = ax.get_xlim(), ax.get_ylim()  # y is inverted: row 0 at the top
        x1 = max(x1, 12.2)
        if self._extent:
            x1, y1 = max(x1, self._extent[0]), max(y1, self._extent[1])
        self._extent = (x1, y1)
        ax.set_xlim(x0, x1)
        ax.set_ylim(y1, y0)

    @staticmethod
    def _fit(fig, ax) -> None:
        """Make the figure as tall as its map at ``CELL_INCHES`` a cell, plus the title and the key under it: cells
        keep one size from click to click, and the key sits right under the map (issue #46: a fixed 9 x 6 in
        figure, with room kept for eight block tables, left ~250 px of blank between map and key)."""
        key = fig.legends[-1]
        key_height = key.get_window_extent(fig.canvas.get_renderer()).height / fig.dpi
        (x0, x1), (y1, y0) = ax.get_xlim(), ax.get_ylim()
        map_height = min((y1 - y0) * CELL_INCHES, (FIGURE_WIDTH - 0.4) * (y1 - y0) / (x1 - x0))
        height = map_height + TITLE_INCHES + key_height
        fig.set_size_inches(FIGURE_WIDTH, height)
        fig.tight_layout(rect=(0, key_height / height, 1, 1), pad=0.2)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
        self._displayed = True
        self.refresh()
