"""Every figure the README and the notebooks show, made from code: ``python -m pagedkv figures``.

Each function builds its scene with the package itself (no hand-drawn data)
and returns a Figure; ``make_all_figures`` writes them as PNG without
timestamps or version metadata, so re-running changes no bytes.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # figures are files: no window, no notebook needed

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from ..decoding import run_decoding, synthetic_prompt  # noqa: E402
from ..manager import BlockSpaceManager  # noqa: E402
from ..scheduler import Scheduler  # noqa: E402
from ..sim import PARTS, simulate  # noqa: E402
from .block_map import add_block_map_key, align_panels, draw_block_map  # noqa: E402
from .scheduler_widget import stand_in_model  # noqa: E402
from .timeline import Timeline, draw_timeline  # noqa: E402


def copy_on_write_figure():
    """Three moments: a prompt, the fork (shared, x2), the child's append (copy-on-write)."""
    m = BlockSpaceManager(block_size=4, num_gpu_blocks=12)
    m.allocate("parent", range(6))
    states = [("1. a 6-token prompt", m.snapshot(), [], [])]
    m.fork("parent", "child")
    states.append(("2. fork: every block shared (x2)", m.snapshot(), [], []))
    (src, dst), = m.append_slots("child", [100])
    states.append((f"3. child appends: block {src} copied to {dst}", m.snapshot(), [dst], [src]))
    fig, axes = plt.subplots(1, 3, figsize=(8.6, 4.9))
    for ax, (title, state, highlight, sources) in zip(axes, states):
        draw_block_map(state, ax=ax, title=title, highlight=highlight, sources=sources, columns=4)
    align_panels(axes)
    fig.suptitle("Copy-on-write (block_size 4): forked sequences share blocks\n"
                 "until one writes into a shared, partly filled block")
    add_block_map_key(fig, highlight="copy-on-write: the child's new private block",
                      source="its source: shared before, now the parent's alone")
    fig.tight_layout(rect=(0, 0.27, 1, 1))
    return fig


def prefix_caching_figure():
    """Three requests sharing a system prompt, then freed: cached blocks wait in the LRU queue."""
    m = BlockSpaceManager(block_size=4, num_gpu_blocks=16, watermark=0.0, enable_prefix_caching=True)
    system = list(range(100, 112))
    for i in range(3):
        m.allocate(f"req{i}", system + [500 + 10 * i + j for j in range(5)])
    live = m.snapshot()
    for i in range(3):
        m.free(f"req{i}")
    fig, axes = plt.subplots(1, 2, figsize=(8.6, 5.6))
    draw_block_map(live, ax=axes[0], title="3 requests (17-token prompts) share\na cached 3-block system prompt")
    draw_block_map(m.snapshot(), ax=axes[1], title="all freed: named blocks stay cached\n(#n = queue order)")
    align_panels(axes)
    fig.suptitle("Prefix caching (block_size 4): full blocks named by a chained hash, shared")
    add_block_map_key(fig, cached=True)
    fig.tight_layout(rect=(0, 0.22, 1, 0.96))
    return fig


def memory_waste_figure(num_requests: int = 600):
    """Where KV memory goes under four policies, beside the token states of the vLLM paper's Fig. 2."""
    paper = {"reserve_max": 0.204, "reserve_pow2": 0.268, "oracle": 0.382, "paged": 0.963}
    names = ["reserve the\nmaximum (2,048)", "reserve the next\npower of two", "reserve exactly\n(an oracle)",
             "paged\n(16-token blocks)"]
    colors = ["#009E73", "#F0E442", "#D55E00", "#999999"]
    results = {p: simulate(p, "sharegpt", num_requests=num_requests, progress=False).breakdown for p in paper}
    fig, ax = plt.subplots(figsize=(8, 3.8))
    bottom = np.zeros(len(paper))
    for part, color in zip(PARTS, colors):
        values = np.array([100 * results[p][part] for p in paper])
        ax.bar(names, values, bottom=bottom, color=color, label=part.replace("_", " "))
        bottom += values
    ax.scatter(names, [100 * v for v in paper.values()], marker="_", s=900, linewidths=2, color="black")
    ax.set_ylabel("% of KV memory")
    ax.set_ylim(0, 100)
    ax.tick_params(axis="x", labelsize=9)
    ax.set_title(f"Where KV memory goes: {num_requests} ShareGPT-like requests, 15,700 token slots", fontsize=10)
    handles, _ = ax.get_legend_handles_labels()
    handles = handles[::-1] + [Line2D([], [], color="black", linewidth=2, label="the paper's token states")]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
              borderaxespad=0)
    fig.tight_layout()
    return fig


def beam_search_figure():
    """Blocks in use during a width-4 beam search on the tiny Llama, through the engine, with and without sharing."""
    result = run_decoding("beam", 4, synthetic_prompt(30), output_len=40, block_size=4)
    steps = [s.step for s in result.steps]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(steps, [s.blocks_without_sharing for s in result.steps], color="#D55E00", label="without sharing")
    ax.plot(steps, [s.blocks_in_use for s in result.steps], color="#0072B2", label="with fork + copy-on-write")
    ax.set_xlabel("decoding step")
    ax.set_ylabel("KV blocks in use")
    ax.set_title(f"Beam search, width 4: {result.savings:.0%} fewer blocks at the peak")
    ax.legend()
    fig.tight_layout()
    return fig


def scheduler_timeline_figure():
    """Five requests in a 12-block pool, served with preemption by recompute and by swap."""
    fig, axes = plt.subplots(2, 1, figsize=(8, 4.6), sharex=True)
    for ax, mode in zip(axes, ("recompute", "swap")):
        manager = BlockSpaceManager(block_size=4, num_gpu_blocks=12, num_cpu_blocks=16, watermark=0.0)
        scheduler = Scheduler(manager, max_num_seqs=8, max_num_batched_tokens=64, preemption_mode=mode)
        for i, (prompt_len, max_tokens) in enumerate(((6, 14), (9, 10), (4, 16), (7, 12), (5, 8))):
            scheduler.add_request(f"r{i}", list(range(prompt_len)), max_tokens)
        timeline = Timeline()
        while scheduler.has_unfinished_requests():
            out = scheduler.schedule()
            timeline.record(scheduler, out)
            scheduler.update(out, {r: stand_in_model(scheduler.requests[r].token_ids) for r in out.scheduled})
        draw_timeline(timeline, ax=ax, title=f"preemption by {mode}: {len(timeline.steps)} steps, "
                                             f"{scheduler.num_recomputed_tokens} tokens computed twice")
    axes[0].set_xlabel("")
    fig.suptitle("Continuous batching in a 12-block pool (block_size 4): five requests, one row each")
    fig.tight_layout()
    return fig


README_WIDTH_PX = 830  # the width GitHub shows a README image at (the column's width)
DPI = 110


def smallest_text_at_readme_width(fig) -> float:
    """The smallest text in ``fig``, in points as it reads once the PNG is scaled to README width.

    A PNG wider than the README column is shrunk to fit, and its text with it: a 13-inch figure shows
    9 pt labels at about 6 pt.  (CSS: 96 px to the inch, 72 pt to the inch.)
    """
    from matplotlib.text import Text

    fig.canvas.draw()
    width_px = fig.get_tightbbox(fig.canvas.get_renderer()).width * DPI
    scale = min(1.0, README_WIDTH_PX / width_px) * DPI / 96
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) * scale


FIGURES = {
    "copy_on_write.png": copy_on_write_figure,
    "prefix_caching.png": prefix_caching_figure,
    "memory_waste.png": memory_waste_figure,
    "beam_search_blocks.png": beam_search_figure,
    "scheduler_timeline.png": scheduler_timeline_figure,
}


def make_all_figures(out="figures/") -> list[Path]:
    """Write every figure into ``out``, as PNG and as SVG; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    plt.rcParams["svg.hashsalt"] = "pagedkv"  # SVG element ids from a fixed salt: same bytes every run
    for name, make in FIGURES.items():
        fig = make()
        png, svg = out / name, (out / name).with_suffix(".svg")
        fig.savefig(png, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
        fig.savefig(svg, bbox_inches="tight", metadata={"Date": None, "Creator": None})
        plt.close(fig)
        paths += [png, svg]
    return paths
