"""Pictures of the paged attention kernels (notebooks 08 and 11), each with the text it draws.

Every figure is computed from the package: the thread-group arithmetic from
``kernels.cuda_vllm.thread_group_layout``, block tables from a real cache, the
static estimates from ``static_report``'s rows (``pagedkv/data/static_estimates.json``).
Each ``*_figure`` function has a ``*_text`` twin that says the same in words, which is
what nbval compares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..kernels.cuda_device import WARP_SIZE
from ..kernels.cuda_vllm import WORD_BYTES, heads_per_block, thread_group_layout
from .block_map import PALETTE, _ink

STATIC_ESTIMATES = Path(__file__).resolve().parent.parent / "data" / "static_estimates.json"


def _box(ax, x, y, w, h, text="", color="#FFFFFF", edge="#333333", size=9, bold=False, lw=1.0, hatch=None):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, linewidth=lw, hatch=hatch))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                fontweight="bold" if bold else "normal")


def _arrow(ax, start, end, color="#555555"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9, color=color, linewidth=1))


# ------------------------------------------------------------------ who does what


def warp_blocks(num_blocks: int, num_warps: int) -> list[list[int]]:
    """The logical blocks each warp takes: ``w, w + num_warps, ...``."""
    return [list(range(w, num_blocks, num_warps)) for w in range(num_warps)]


class KernelMapping(NamedTuple):
    """Who reads what in the vLLM-shaped kernel's K pass, for one thread block (``kernel_mapping``)."""
    num_heads: int
    num_seqs: int
    num_warps: int
    seq_len: int
    block_size: int
    num_blocks: int  # the sequence's blocks
    words: int  # 64-bit words in one token's key row of one head
    warp_blocks: list  # the logical blocks each warp takes
    physical: list  # the physical block of each of those, through the block table
    group_size: int  # lanes per token (vLLM's THREAD_GROUP_SIZE)
    groups_per_warp: int
    loads_per_lane: int  # 64-bit loads one lane makes for one token's key row
    last_block_tokens: int  # tokens in the sequence's last block
    last_block_lanes: int  # lanes of the warp that takes the last block with a real token to work on


def kernel_mapping(block_table, seq_len: int, num_heads: int, num_seqs: int, block_size: int = 16,
                   num_threads: int = 128, head_size: int = 128, element_bytes: int = 2) -> KernelMapping:
    """The grid, one thread block's warps and their blocks, one warp's thread groups: what the figure draws."""
    num_warps = num_threads // WARP_SIZE
    num_blocks = -(-seq_len // block_size)
    words = head_size * element_bytes // WORD_BYTES
    layout = thread_group_layout(block_size, words)
    blocks = warp_blocks(num_blocks, num_warps)
    last_tokens = seq_len - (num_blocks - 1) * block_size
    # group g takes tokens g, g + groups_per_warp, ... of a block: those with one below last_tokens have work
    groups_with_a_token = min(layout.groups_per_warp, last_tokens)
    return KernelMapping(num_heads, num_seqs, num_warps, seq_len, block_size, num_blocks, words, blocks,
                         [[int(block_table[b]) for b in bs] for bs in blocks], layout.group_size,
                         layout.groups_per_warp, layout.words_per_thread, last_tokens,
                         groups_with_a_token * layout.group_size)


def kernel_mapping_text(block_table, seq_len: int, num_heads: int, num_seqs: int, block_size: int = 16,
                        num_threads: int = 128, head_size: int = 128, element_bytes: int = 2) -> str:
    """In words: the grid, one thread block's warps and their blocks, one warp's thread groups."""
    m = kernel_mapping(block_table, seq_len, num_heads, num_seqs, block_size, num_threads, head_size,
                       element_bytes)
    lines = [f"grid (num_heads, num_seqs) = ({num_heads}, {num_seqs}): {num_heads * num_seqs} thread blocks; "
             f"thread block (head 0, seq 0) has {num_threads} threads = {m.num_warps} warps",
             f"sequence 0: {seq_len} tokens in {m.num_blocks} blocks of {block_size}"]
    for w, (blocks, physical) in enumerate(zip(m.warp_blocks, m.physical)):
        lines.append(f"  warp {w}: logical blocks {', '.join(map(str, blocks)) or '-'} -> physical "
                     f"{', '.join(map(str, physical)) or '-'}")
    tokens = "token g" if block_size <= m.groups_per_warp else f"tokens g, g + {m.groups_per_warp}, ..."
    lines.append(f"inside a warp: {m.groups_per_warp} thread groups of {m.group_size} lanes; group g takes {tokens} "
                 f"of a block; a key row is {m.words} words of {WORD_BYTES} bytes")
    for lane in range(min(m.group_size * 2, WARP_SIZE)):
        group, rank = lane // m.group_size, lane % m.group_size
        first = ", ".join(map(str, range(rank, m.words, m.group_size)[:2]))
        lines.append(f"  lane {lane}: thread group {group}, rank {rank}: words {first}, ... of the row "
                     f"({m.loads_per_lane} loads of {WORD_BYTES} bytes per token)")
    lines.append(f"  so a thread group fetches {m.group_size * WORD_BYTES} bytes of a key row at a time")
    last = m.num_blocks - 1
    head = (f"last block: logical {last} (warp {last % m.num_warps}) holds {m.last_block_tokens} of its "
            f"{block_size} slots")
    if m.last_block_tokens == block_size:
        lines.append(f"{head}: every lane has a real token")
    elif m.last_block_lanes < WARP_SIZE:
        lines.append(f"{head}: {m.last_block_lanes} of the warp's {WARP_SIZE} lanes work on a real token; the "
                     "others' logits are masked (seq_lens)")
    else:
        lines.append(f"{head}: every lane has a real token; the logits past seq_lens are masked")
    return "\n".join(lines)


def kernel_mapping_figure(block_table, seq_len: int, num_heads: int, num_seqs: int, block_size: int = 16,
                          num_threads: int = 128, head_size: int = 128, element_bytes: int = 2):
    """Grid -> one thread block -> its warps -> the block table -> one warp's thread groups and lanes."""
    m = kernel_mapping(block_table, seq_len, num_heads, num_seqs, block_size, num_threads, head_size,
                       element_bytes)
    num_warps, num_blocks, words, group_size, groups_per_warp = (m.num_warps, m.num_blocks, m.words, m.group_size,
                                                                 m.groups_per_warp)
    fig, ax = plt.subplots(figsize=(8.6, 6.4))
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 76)
    ax.axis("off")

    ax.text(0, 74, f"1. grid (num_heads, num_seqs)\n    = ({num_heads}, {num_seqs})", fontsize=10,
            fontweight="bold", va="top")
    for h in range(num_heads):
        for s in range(num_seqs):
            chosen = h == 0 and s == 0
            _box(ax, 2 + 7 * h, 60 - 5 * s, 6.4, 4.4, f"{h},{s}", "#FFD27F" if chosen else "#F2F2F2", size=8.5)
    ax.text(2, 60 - 5 * num_seqs + 3.5, "a thread block per\n(query head, sequence)", fontsize=9, va="top")

    ax.text(46, 74, f"2. thread block (head 0, seq 0): {num_warps} warps\n"
                    f"    take its {num_blocks} blocks in turn", fontsize=10, fontweight="bold", va="top")
    for w, (blocks, physical) in enumerate(zip(m.warp_blocks, m.physical)):
        y = 60 - 5.2 * w
        color = PALETTE[w % len(PALETTE)]
        _box(ax, 46, y, 9, 4.2, f"warp {w}", color, size=9)
        for k, (b, p) in enumerate(zip(blocks, physical)):
            x = 60 + 12 * k
            if b == num_blocks - 1 and m.last_block_tokens < block_size:  # filled as far as its tokens go
                _box(ax, x, y, 11, 4.2, color="#F2F2F2")
                _box(ax, x, y, 11 * m.last_block_tokens / block_size, 4.2, color=color, edge="none")
                _box(ax, x, y, 11, 4.2, f"L{b} -> P{p}", "none", size=8.5)
            else:
                _box(ax, x, y, 11, 4.2, f"L{b} -> P{p}", color, size=8.5)
        if blocks:
            _arrow(ax, (55, y + 2.1), (60, y + 2.1))
    partial = (f"; L{num_blocks - 1} is filled to {m.last_block_tokens} of {block_size} slots"
               if m.last_block_tokens < block_size else "")
    ax.text(46, 60 - 5.2 * num_warps + 1.5, "logical block L -> physical block P: one block-table read\n"
                                             f"per warp and block{partial}", fontsize=9, va="top")

    y0 = 29
    ax.text(0, y0 + 5, f"3. inside one warp: {groups_per_warp} thread groups of {group_size} lanes "
                       f"(max(32 // block_size, 1));\n    group g takes token g of the block", fontsize=10,
            fontweight="bold", va="top")
    cell = 100 / WARP_SIZE
    for lane in range(WARP_SIZE):
        group = lane // group_size
        _box(ax, lane * cell, y0 - 6, cell * 0.92, 4, str(lane), PALETTE[group % len(PALETTE)], size=8)
    tokens_shown = min(block_size, groups_per_warp, 8)
    tokens_started = min(block_size, groups_per_warp)
    rest = (f"; groups {tokens_shown}-{tokens_started - 1} take tokens {tokens_shown}-{tokens_started - 1} "
            f"(not drawn)") if tokens_started > tokens_shown else ""
    ax.text(0, y0 - 8.5, "lanes, coloured by thread group" + rest, fontsize=9, va="top")
    for t in range(tokens_shown):
        x = t * 12.5
        _box(ax, x, 6, 11.5, 6, f"token {t}\n{words} words", PALETTE[t % len(PALETTE)], size=8.5)
        lane = t * group_size
        _arrow(ax, (lane * cell + cell / 2, y0 - 6), (x + 5.75, 12))
    ax.text(0, 3, f"lane rank r of a group reads words r, r + {group_size}, ... of its token's row "
                  f"({WORD_BYTES} bytes each): the group fetches {group_size * WORD_BYTES} bytes at a time",
            fontsize=9, va="top")
    fig.suptitle(f"Who reads what: the vLLM-shaped kernel, block_size {block_size}, head {head_size}, "
                 f"{num_threads} threads", fontsize=11)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ cache layouts


def layout_orders(block_size: int, head_size: int, element_bytes: int = 2) -> dict[str, list[tuple[int, int]]]:
    """(token, dim) of each element of one KV head's block, in memory order, for each layout."""
    x = 16 // element_bytes  # vLLM's x: elements in a 16-byte vector
    return {
        "pagedkv K and V [block, token, kv_head, dim]": [(t, d) for t in range(block_size) for d in range(head_size)],
        "vLLM key [block, kv_head, dim // x, token, x]": [(t, v * x + i) for v in range(head_size // x)
                                                          for t in range(block_size) for i in range(x)],
        "vLLM value [block, kv_head, dim, token]": [(t, d) for d in range(head_size) for t in range(block_size)],
    }


def cache_layout_text(block_size: int = 4, head_size: int = 16, element_bytes: int = 2, first: int = 20) -> str:
    lines = []
    for name, order in layout_orders(block_size, head_size, element_bytes).items():
        shown = " ".join(f"t{t}d{d}" for t, d in order[:first])
        lines.append(f"{name}:\n  {shown} ...")
    return "\n".join(lines)


def cache_layout_figure(block_size: int = 4, head_size: int = 16, element_bytes: int = 2):
    """One KV head's block in memory order under each layout, each element coloured by its token."""
    orders = layout_orders(block_size, head_size, element_bytes)
    fig, axes = plt.subplots(len(orders), 1, figsize=(8.6, 3.9))
    n = block_size * head_size
    for ax, (name, order) in zip(axes, orders.items()):
        for i, (t, _) in enumerate(order):
            ax.add_patch(Rectangle((i, 0), 1, 1, facecolor=PALETTE[t % len(PALETTE)], edgecolor="white",
                                   linewidth=0.5))
        starts = [0] + [i for i in range(1, n) if order[i][0] != order[i - 1][0]]
        by_token = [(s, (starts[k + 1] if k + 1 < len(starts) else n)) for k, s in enumerate(starts)]
        if any(e - s >= 4 for s, e in by_token):  # runs of one token: "t1 d0-15"
            for s, e in by_token:
                if e - s >= 4:
                    t, d = order[s]
                    ax.text((s + e) / 2, 0.5, f"t{t} d{d}-{order[e - 1][1]}", ha="center", va="center",
                            fontsize=8.5)
        else:  # one element per token: label the runs of one dim instead, "d0" over t0 t1 t2 t3
            for s in range(0, n, block_size):
                ax.text(s + block_size / 2, 0.5, f"d{order[s][1]}", ha="center", va="center", fontsize=8.5)
            name += f"  (each d: t0 ... t{block_size - 1} in turn)"
        ax.set_xlim(0, n)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_xticks([0, n // 2, n])
        ax.tick_params(labelsize=8.5)
        ax.set_title(name, fontsize=9.5, loc="left")
    axes[-1].set_xlabel(f"element offset in one KV head's block (block_size {block_size}, head {head_size}, "
                        f"fp16: x = {16 // element_bytes}); colour = token", fontsize=9)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ v2 partitions


def partition_stats(logits: torch.Tensor, partition_size: int) -> list[dict]:
    """Per partition: its tokens, max logit m_p, sum s_p = sum exp(l - m_p), and weight s_p exp(m_p - M) / total."""
    parts = [(s, min(s + partition_size, len(logits))) for s in range(0, len(logits), partition_size)]
    global_max = float(logits.max())
    stats = [dict(start=s, end=e, m=float(logits[s:e].max()),
                  s=float(torch.exp(logits[s:e] - logits[s:e].max()).sum())) for s, e in parts]
    total = sum(p["s"] * np.exp(p["m"] - global_max) for p in stats)
    for p in stats:
        p["weight"] = p["s"] * np.exp(p["m"] - global_max) / total
    return stats


def v2_partitions_text(logits: torch.Tensor, partition_size: int) -> str:
    lines = [f"{len(logits)} tokens, partitions of {partition_size}: "
             f"{-(-len(logits) // partition_size)} thread blocks per (head, sequence), then one reduce"]
    for i, p in enumerate(partition_stats(logits, partition_size)):
        lines.append(f"  partition {i}: tokens {p['start']}-{p['end'] - 1}, m_p {p['m']:+.2f}, s_p {p['s']:.2f}, "
                     f"weight in the reduce {p['weight']:.2f}")
    return "\n".join(lines)


def v2_partitions_figure(logits: torch.Tensor, partition_size: int):
    """Top: each partition's logits and its own max. Bottom: how much of the output each partition carries."""
    stats = partition_stats(logits, partition_size)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.2, 4.6), gridspec_kw=dict(height_ratios=(2, 1)))
    for i, p in enumerate(stats):
        tokens = range(p["start"], p["end"])
        top.bar(tokens, logits[p["start"]:p["end"]].numpy(), color=PALETTE[i % len(PALETTE)],
                label=f"partition {i}")
        top.hlines(p["m"], p["start"] - 0.4, p["end"] - 0.6, colors="#333333", linestyles="--")
        top.text(p["end"] - 0.5, p["m"], f" m{i}", va="bottom", fontsize=9)
    low, high = float(logits.min()), float(logits.max())
    top.set_ylim(low - 0.3 * (high - low), high + 0.15 * (high - low))  # room for the legend and the labels
    top.set_ylabel("logit q.k / sqrt(d)", fontsize=9)
    top.set_xlabel("token", fontsize=9)
    top.set_title(f"v2: one thread block per partition of {partition_size} tokens; each keeps its max m_p, "
                  f"its sum s_p, its output o_p", fontsize=9.5)
    top.legend(fontsize=8.5, ncol=len(stats), loc="lower left")
    names = [f"partition {i}" for i in range(len(stats))]
    bottom.barh(names, [p["weight"] for p in stats], color=[PALETTE[i % len(PALETTE)] for i in range(len(stats))])
    bottom.set_xlim(0, 1)
    bottom.set_xlabel("weight in the reduce: s_p exp(m_p - M) / sum over partitions (M = max m_p)", fontsize=9)
    bottom.tick_params(labelsize=8.5)
    top.tick_params(labelsize=8.5)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ GQA grouping


def gqa_reads(num_heads: int, num_kv_heads: int, seq_len: int, head_size: int = 128,
              element_bytes: int = 2) -> dict[str, tuple[int, int]]:
    """Per vLLM-shaped flavour: (thread blocks per sequence, bytes of K they load for one sequence of ``seq_len``
    tokens). Each thread block loads its KV head's keys once, for every query head it computes
    (``cuda_vllm.heads_per_block``); how much of a repeat L2 serves is not counted."""
    group = num_heads // num_kv_heads
    reads = {}
    for flavour in ("vllm", "vllm-gqa"):
        blocks = num_heads // heads_per_block(flavour, group)
        reads[flavour] = (blocks, blocks * seq_len * head_size * element_bytes)
    return reads


def gqa_text(num_heads: int, num_kv_heads: int, seq_len: int | None = None, head_size: int = 128,
             element_bytes: int = 2) -> str:
    group = num_heads // num_kv_heads
    reads = gqa_reads(num_heads, num_kv_heads, seq_len or 1, head_size, element_bytes)
    lines = [f"{num_heads} query heads, {num_kv_heads} KV heads: query heads {group}k..{group}k+{group - 1} "
             "read KV head k"]
    for k in range(num_kv_heads):
        heads = ", ".join(str(h) for h in range(k * group, (k + 1) * group))
        lines.append(f"  KV head {k}: query heads {heads}")
    blocks, gqa_blocks = reads["vllm"][0], reads["vllm-gqa"][0]
    lines.append(f"vllm (a thread block per query head): {blocks} thread blocks per sequence; each KV head's "
                 f"K/V is read {blocks // num_kv_heads} times")
    lines.append(f"vllm-gqa (a thread block per KV head): {gqa_blocks} thread blocks per sequence; read once, "
                 f"multiplied into {group} dot products")
    if seq_len:
        precision = {2: "fp16", 4: "fp32"}.get(element_bytes, f"{element_bytes}-byte values")
        lines.append(f"K loaded for one sequence of {seq_len:,} tokens (head {head_size}, {precision}): "
                     f"vllm {reads['vllm'][1]:,} bytes, vllm-gqa {reads['vllm-gqa'][1]:,} bytes")
    return "\n".join(lines)


def gqa_figure(num_heads: int = 8, num_kv_heads: int = 2):
    """Which query heads read which KV head, and which thread block does it, in the two vLLM-shaped flavours."""
    group = num_heads // num_kv_heads
    fig, axes = plt.subplots(1, 2, figsize=(8.6, 3.4))
    width = 100 / num_heads
    for ax, grouped in zip(axes, (False, True)):
        ax.set_xlim(0, 100)
        ax.set_ylim(0, 40)
        ax.axis("off")
        for k in range(num_kv_heads):
            x = (k * group + group / 2) * width - 12
            _box(ax, x, 2, 24, 7, f"KV head {k}\nK, V", "#DDDDDD", size=9)
        for h in range(num_heads):
            k = h // group
            color = PALETTE[k % len(PALETTE)]
            _box(ax, h * width + 0.5, 28, width - 1, 7, f"q{h}", color, size=9)
            if not grouped:
                _box(ax, h * width + 0.5, 26.5, width - 1, 10, "", "none", edge="#222222", lw=1.6)
                _arrow(ax, (h * width + width / 2, 26.5), ((k * group + group / 2) * width, 9))
        if grouped:
            for k in range(num_kv_heads):
                _box(ax, k * group * width + 0.2, 26.5, group * width - 0.4, 10, "", "none", edge="#222222", lw=1.6)
                _arrow(ax, ((k * group + group / 2) * width, 26.5), ((k * group + group / 2) * width, 9))
        title = (f"vllm-gqa: {num_kv_heads} thread blocks, each K/V\nelement loaded once for {group} heads"
                 if grouped else f"vllm: {num_heads} thread blocks (outlined),\neach KV head loaded {group} times")
        ax.set_title(title, fontsize=9.5)
    fig.suptitle(f"Grouped-query attention: {num_heads} query heads share {num_kv_heads} KV heads", fontsize=10.5)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ static estimates


def load_static_estimates(path=STATIC_ESTIMATES) -> list[dict]:
    """The rows ``python -m pagedkv.kernels.static_report --json`` wrote (sm_90, head 128, fp16)."""
    return json.loads(Path(path).read_text())


def estimate_points(rows: list[dict], kernel: str = "v1", gqa_values=(1, 4)) -> list[dict]:
    """One point per (flavour, gqa): warp instructions and K/V bytes per (query head, token)."""
    from ..kernels.static_report import hbm_fraction

    points = []
    for row in rows:
        if row.get("kernel") != kernel:  # the unified kernel's rows have tiles, not kernels
            continue
        for gqa in gqa_values:
            if row["flavour"] == "vllm-gqa" and row["gqa"] != gqa:
                continue
            instructions = round(sum(per for _, _, per in row["loops"]), 1)  # as printed: the % follows from it
            kv_bytes = 2 * row["head_size"] * 2 / gqa
            points.append(dict(flavour=row["flavour"], gqa=gqa, instructions=instructions, bytes=kv_bytes,
                               hbm=hbm_fraction(instructions, row["head_size"], gqa),
                               occupancy=row["occupancy"], registers=row["registers"]))
    return points


def static_estimates_text(rows: list[dict]) -> str:
    """One line per point; instructions to a tenth (the percentage is computed from that figure, not a rounding)."""
    lines = ["static estimate, not measured (sm_90, head 128, fp16, v1):"]
    for p in estimate_points(rows):
        lines.append(f"  {p['flavour']:<8} gqa {p['gqa']}: {p['instructions']:5.1f} warp instructions and "
                     f"{p['bytes']:3.0f} bytes of K/V per (query head, token) -> issue allows {p['hbm']:5.0%} of "
                     f"H100 HBM")
    return "\n".join(lines)


def unified_estimates_text(rows: list[dict]) -> str:
    """The unified kernel's rows (``static_report --kernel unified``): a decode tile and a prefill tile per group."""
    from ..kernels.static_report import hbm_fraction

    lines = ["static estimate, not measured (sm_90, head 128, fp16, unified kernel; warp instructions):"]
    for row in rows:
        if "tile" not in row:
            continue
        loops = row["loops"]
        total = round(sum(loops.values()), 1)  # as printed: the percentage follows from it
        queries = "1 query" if row["block_q"] == 1 else f"{row['block_q']} queries"
        heads = "1 head" if row["gqa"] == 1 else f"{row['gqa']} heads"
        tile = f"{row['tile']} tile ({queries} x {heads}):"
        kv_bytes = 2 * row["head_size"] * 2 // (row["block_q"] * row["gqa"])  # K and V, fp16, shared by the tile
        lines.append(f"  {tile:<34} {loops['K']:4.1f} K + {loops['V']:4.1f} V + {loops['load']:3.1f} page loads = "
                     f"{total:4.1f} per (query head, key), on {kv_bytes:3d} bytes of K/V: issue allows "
                     f"{hbm_fraction(total, row['head_size'], row['block_q'] * row['gqa']):4.0%} of H100 HBM")
    return "\n".join(lines)


def static_estimates_figure(rows: list[dict]):
    """A roofline in instructions: bytes per warp instruction against the bandwidth the issue rate allows."""
    from ..kernels.static_report import H100_HBM_BYTES_PER_S, H100_WARP_INSTRUCTIONS_PER_S

    points = estimate_points(rows)
    fig, ax = plt.subplots(figsize=(7.6, 4.4))
    intensity = np.logspace(-1, 1.5, 200)  # bytes per warp instruction
    roof = np.minimum(intensity * H100_WARP_INSTRUCTIONS_PER_S, H100_HBM_BYTES_PER_S) / 1e12
    ax.plot(intensity, roof, color="#333333")
    ax.text(0.12, 0.16, "issue-bound:\n1.05e12 warp instr/s x bytes/instr", fontsize=8.5, rotation=0)
    ax.text(0.12, 3.9, "H100 HBM3: 3.35 TB/s (memory-bound)", fontsize=8.5)
    ax.set_ylim(0.07, 7)
    markers = {"tree": "o", "vllm": "s", "vllm-gqa": "D"}
    for i, p in enumerate(points):
        if p["flavour"] == "vllm-gqa" and p["gqa"] == 1:
            continue  # the same kernel as vllm (one query head per thread block)
        x = p["bytes"] / p["instructions"]
        y = min(x * H100_WARP_INSTRUCTIONS_PER_S, H100_HBM_BYTES_PER_S) / 1e12
        ax.scatter([x], [y], marker=markers[p["flavour"]], s=60, color=PALETTE[i % len(PALETTE)], zorder=3,
                   edgecolor="#222222",
                   label=f"{p['flavour']}, gqa {p['gqa']}: {p['instructions']:.0f} instr, {p['bytes']:.0f} B")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes of K/V per warp instruction (per query head and token)", fontsize=9)
    ax.set_ylabel("TB/s the kernel could stream", fontsize=9)
    ax.set_title("Static estimate, not measured: SASS loop counts on an issue-rate model", fontsize=10)
    ax.set_yticks([0.1, 0.3, 1, H100_HBM_BYTES_PER_S / 1e12], ["0.1", "0.3", "1", "3.35"])
    ax.set_yticks([], minor=True)
    ax.tick_params(labelsize=8.5)
    ax.legend(fontsize=8.5, loc="lower right", title="vllm-gqa, gqa 1: the vllm point (same kernel)",
              title_fontsize=8.5)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ a chunk of queries


def chunk_reads(cu_seqlens_q, seq_lens, sliding_window: int | None = None) -> list[dict]:
    """Per query row of a flat batch: its sequence, its position, and the key positions it attends.

    The rule of the kernel over query chunks (vLLM 0.33: ``kernel_unified_attention`` in
    ``vllm/v1/attention/ops/triton_unified_attention.py``): a sequence's rows are its *last* ``q_len`` tokens, so
    ``context_len = seq_len - q_len`` and row ``i`` sits at position ``context_len + i``; it attends keys
    ``j <= position``, and with a window only ``j > position - sliding_window``.
    """
    rows = []
    for s in range(len(seq_lens)):
        start, end = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        context_len = int(seq_lens[s]) - (end - start)
        for i in range(end - start):
            position = context_len + i
            first = 0 if sliding_window is None else max(0, position - sliding_window + 1)
            rows.append({"row": start + i, "seq": s, "position": position, "keys": range(first, position + 1)})
    return rows


def chunk_reads_text(cu_seqlens_q, seq_lens, block_tables, block_size: int, sliding_window=None) -> str:
    """Each query row's position, the keys it reads and the pages (physical blocks) they sit in."""
    rows = chunk_reads(cu_seqlens_q, seq_lens, sliding_window)
    window = f", sliding window {sliding_window}" if sliding_window else ""
    lines = [f"{len(rows)} query rows, cu_seqlens_q {[int(x) for x in cu_seqlens_q]}, "
             f"seq_lens {[int(x) for x in seq_lens]}{window}:"]
    for r in rows:
        keys = r["keys"]
        pages = sorted({int(block_tables[r["seq"]][j // block_size]) for j in keys},
                       key=lambda p: list(map(int, block_tables[r["seq"]])).index(p))
        lines.append(f"  row {r['row']:>2} (seq {r['seq']}, position {r['position']:>2}): keys {keys[0]:>2}-"
                     f"{keys[-1]:<2} ({len(keys):>2}) in pages {pages}")
    lines.append(f"key positions read in all: {sum(len(r['keys']) for r in rows)}")
    unread = unread_pages(cu_seqlens_q, seq_lens, block_tables, block_size, sliding_window)
    if unread:
        lines.append(f"pages the sequences hold that no row reads: {unread}")
    return "\n".join(lines)


PAST_END = "#E4E4E4"  # a key position past a sequence's seq_len: no key there


# pages by id, without Tol's light blues (too close to Okabe-Ito's sky blue beside them)
PAGE_PALETTE = [c for c in PALETTE if c not in ("#88CCEE", "#77AADD")]
UNREAD = "#F6D5D5"  # a key cut by the mask on a page no row reads: held, never read


def chunk_reads_figure(cu_seqlens_q, seq_lens, block_tables, block_size: int, sliding_window=None, ax=None):
    """Query rows (down) against key positions (across): a cell a row reads is coloured by the page it sits in,
    numbered where the row enters the page; a key of the sequence the mask cuts is hatched, on a pink tint and
    numbered where its page is one no row reads (held, never read: a window's old pages); a position past the
    sequence's end grey; a black frame marks each row's own position."""
    rows = chunk_reads(cu_seqlens_q, seq_lens, sliding_window)
    unread = set(unread_pages(cu_seqlens_q, seq_lens, block_tables, block_size, sliding_window))
    width = int(max(seq_lens))
    if ax is None:
        _, ax = plt.subplots(figsize=(0.42 * width + 2.6, 0.42 * len(rows) + 1.4))
    pages_seen = {}
    for y, r in enumerate(rows):
        table = [int(b) for b in block_tables[r["seq"]]]
        seq_len = int(seq_lens[r["seq"]])
        for j in range(width):
            if j >= seq_len:  # no key there: past this sequence's end
                ax.add_patch(Rectangle((j, y), 1, 1, facecolor=PAST_END, edgecolor="white", linewidth=0.8))
                continue
            page = table[j // block_size]
            if j in r["keys"]:
                color = PAGE_PALETTE[page % len(PAGE_PALETTE)]
                pages_seen[page] = color
                ax.add_patch(Rectangle((j, y), 1, 1, facecolor=color, edgecolor="white", linewidth=0.8))
                if j == r["keys"][0] or j % block_size == 0:  # the page's number where the row enters it
                    ax.text(j + 0.5, y + 0.5, str(page), ha="center", va="center", fontsize=7.5, fontweight="bold",
                            color=_ink(color))
            else:
                ax.add_patch(Rectangle((j, y), 1, 1, facecolor=UNREAD if page in unread else "white",
                                       edgecolor="#BBBBBB", hatch="///", linewidth=0.5))
                if page in unread and j % block_size == 0:
                    ax.text(j + 0.5, y + 0.5, str(page), ha="center", va="center", fontsize=7.5, fontweight="bold",
                            color="#8B1A1A")
        ax.add_patch(Rectangle((r["position"] + 0.06, y + 0.06), 0.88, 0.88, facecolor="none", edgecolor="black",
                               linewidth=1.3))
    for s in range(1, len(seq_lens)):  # sequence boundaries in the flat batch
        ax.axhline(int(cu_seqlens_q[s]), color="black", linewidth=1.5)
    for x in range(block_size, width, block_size):  # page boundaries (logical blocks)
        ax.axvline(x, color="#444444", linewidth=0.8, linestyle=":")
    ax.set_xlim(0, width)
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([x + 0.5 for x in range(width)], [str(x) for x in range(width)], fontsize=8)
    ax.set_yticks([y + 0.5 for y in range(len(rows))],
                  [f"row {r['row']}: seq {r['seq']}, pos {r['position']}" for r in rows], fontsize=8)
    ax.set_xlabel(f"key position (dotted lines: block boundaries every {block_size} tokens)")
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, label=f"page {p}") for p, c in sorted(pages_seen.items())]
    if unread:
        handles.append(Rectangle((0, 0), 1, 1, facecolor=UNREAD, edgecolor="#BBBBBB", hatch="///",
                                 label=f"page{'s' if len(unread) > 1 else ''} {', '.join(map(str, sorted(unread)))}: "
                                       "held, never read"))
    handles.append(Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="#BBBBBB", hatch="///",
                             label="cut by the mask"))
    handles.append(Rectangle((0, 0), 1, 1, facecolor=PAST_END, edgecolor="#BBBBBB", label="past its seq_len"))
    handles.append(Rectangle((0, 0), 1, 1, facecolor="none", edgecolor="black", linewidth=1.3,
                             label="the row's own position"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    window = f", sliding window {sliding_window}" if sliding_window else " (causal)"
    ax.set_title(f"which keys each query row reads{window}", fontsize=10)
    return ax


def unread_pages(cu_seqlens_q, seq_lens, block_tables, block_size: int, sliding_window=None) -> list[int]:
    """The pages the sequences hold that no query row of the step reads (a window's old pages), in table order."""
    read = {int(block_tables[r["seq"]][j // block_size])
            for r in chunk_reads(cu_seqlens_q, seq_lens, sliding_window) for j in r["keys"]}
    held = [int(block_tables[s][b]) for s in range(len(seq_lens)) for b in range(-(-int(seq_lens[s]) // block_size))]
    return [p for p in held if p not in read]


# ------------------------------------------------------------------ the unified kernel's launch grid


class UnifiedGrid(NamedTuple):
    """One launch of the unified kernel, program by program (``unified_grid``)."""
    names: list  # each sequence's name
    q_lens: list
    seq_lens: list
    num_heads: int
    num_kv_heads: int
    plan: object  # cuda_unified.LaunchPlan: block_q, partition_size, segment_len, grid
    tiles: list  # per query tile: (sequence, first query row, rows), or None for a spare tile
    decode_tiles: bool  # a one-query tile runs the grouped decode phases (else the prefill tile's path)
    label: str = ""  # what the batch is, for the figure's title


def unified_grid(cu_seqlens_q, seq_lens, num_heads: int, num_kv_heads: int, head_size: int, block_size: int,
                 dtype: str = "float32", names=None, num_threads: int = 128, label: str = "") -> UnifiedGrid:
    """How ``unified_paged_attention(backend="cuda")`` launches this batch on a GPU (``num_threads`` a block): the
    rules of ``cuda_unified.launch_plan`` and, per tile, the kernel's own ``find_seq_idx`` (``tile_owner``)."""
    from ..kernels.cuda_unified import launch_plan, tile_owner
    from ..kernels.validate import UnifiedShape

    cu = [int(x) for x in cu_seqlens_q]
    lens = [int(x) for x in seq_lens]
    q_lens = [b - a for a, b in zip(cu, cu[1:])]
    shape = UnifiedShape(cu[-1], len(lens), num_heads, num_kv_heads, head_size,
                         sum(-(-n // block_size) for n in lens), block_size, max(q_lens), max(lens),
                         head_size ** -0.5, None)
    plan = launch_plan(shape, num_threads, dtype)
    tiles = [tile_owner(cu, t, plan.block_q) for t in range(plan.grid[0])]
    return UnifiedGrid(list(names) if names else [f"seq {s}" for s in range(len(lens))], q_lens, lens, num_heads,
                       num_kv_heads, plan, tiles, plan.partition_size > 0, label)


def _tile_keys(grid: UnifiedGrid, tile) -> int:
    """Keys the tile's last query reads (causal): a tile walks its sequence's pages up to there."""
    seq, first, rows = tile
    cu_start = sum(grid.q_lens[:seq])
    return grid.seq_lens[seq] - grid.q_lens[seq] + (first - cu_start) + rows


def _segments(grid: UnifiedGrid, seq: int) -> int:
    """Segments of a 3-D launch that find keys of this sequence (the others return at once)."""
    return -(-grid.seq_lens[seq] // grid.plan.segment_len)


def unified_grid_text(grid: UnifiedGrid) -> str:
    """The grid in words: each query tile's sequence, rows and keys; with segments, each one's keys; the reduce."""
    plan = grid.plan
    tiles, kv_heads, segments = plan.grid
    group = grid.num_heads // grid.num_kv_heads
    mode = f"3-D, segments of {plan.segment_len} keys" if segments > 1 else "2-D"
    queries = "1 query" if plan.block_q == 1 else f"{plan.block_q} queries"
    axes = f"{tiles} query tiles, {kv_heads} KV heads" + (f", {segments} segments" if segments > 1 else "")
    label = f"{grid.label}: " if grid.label else ""
    lines = [f"{label}BLOCK_Q = {queries} x {group} query heads a tile; grid ({axes}) = "
             f"{tiles * kv_heads * segments} programs, {mode}:"]
    for t, tile in enumerate(grid.tiles):
        if tile is None:
            lines.append(f"  tile {t}: spare, returns at once")
            continue
        seq, first, rows = tile
        name = grid.names[seq]
        which = f"row {first}" if rows == 1 else f"rows {first}-{first + rows - 1}"
        kind = "decode tile" if rows == 1 and grid.q_lens[seq] == 1 and grid.decode_tiles else "prefill tile"
        if segments == 1:
            lines.append(f"  tile {t}: {name}, {which}: {rows} of its {plan.block_q} queries, {kind}, "
                         f"keys 0-{_tile_keys(grid, tile) - 1}")
        else:
            n = _segments(grid, seq)
            last = grid.seq_lens[seq] - (n - 1) * plan.segment_len
            rest = f"; segments {n}-{segments - 1} return" if n < segments else ""
            lines.append(f"  tile {t}: {name}, {which}, {grid.seq_lens[seq]:,} keys: segments 0-{n - 1}, the last "
                         f"with {last}{rest}")
    lines.append(f"  each tile runs once per KV head: KV head k with query heads {group}k to {group}k + {group - 1}")
    if segments > 1:
        parts = ", ".join(str(_segments(grid, s)) for s in range(len(grid.seq_lens)))
        lines.append(f"then the reduce: {grid.num_heads} query heads x {sum(grid.q_lens)} query rows = "
                     f"{grid.num_heads * sum(grid.q_lens)} programs, each merging its row's partial max, sum and "
                     f"output ({parts} segments) into one")
    return "\n".join(lines)


def _spare(ax, x, y, w=1.0, h=1.0, text=""):
    _box(ax, x, y, w, h, text, color="#F4F4F4", edge="#BBBBBB", size=7.5, hatch="///")


def unified_grid_figure(*grids: UnifiedGrid):
    """Each grid as a panel: a 2-D grid as query tiles (across) x KV heads (down); a 3-D one as its query tiles
    (down) x segments (across) for KV head 0, then the reduce. A cell is coloured by its sequence; spare tiles and
    segments past a context are hatched."""
    widths = [1.4 * g.plan.grid[0] if g.plan.grid[2] == 1 else g.plan.grid[2] + 3 for g in grids]
    fig, axes = plt.subplots(1, len(grids), figsize=(10, 3.3), gridspec_kw={"width_ratios": widths}, squeeze=False)
    for ax, grid in zip(axes[0], grids):
        tiles, kv_heads, segments = grid.plan.grid
        colors = [PALETTE[s % len(PALETTE)] for s in range(len(grid.names))]
        if segments == 1:
            for t, tile in enumerate(grid.tiles):
                for h in range(kv_heads):
                    if tile is None:
                        _spare(ax, t, h, text="spare")
                        continue
                    seq, first, rows = tile
                    which = f"row {first}" if rows == 1 else f"rows\n{first}-{first + rows - 1}"
                    _box(ax, t, h, 1, 1, f"{grid.names[seq]}\n{which}\n{rows}/{grid.plan.block_q} q", colors[seq],
                         edge="white", size=7.5)
                    ax.texts[-1].set_color(_ink(colors[seq]))
            ax.set_xlim(0, tiles)
            ax.set_ylim(kv_heads, 0)
            ax.set_xticks([t + 0.5 for t in range(tiles)], [str(t) for t in range(tiles)], fontsize=8)
            ax.set_yticks([h + 0.5 for h in range(kv_heads)], [f"KV head {h}" for h in range(kv_heads)], fontsize=8)
            ax.set_xlabel(f"query tile (program_id 0); n/{grid.plan.block_q} q: its real queries", fontsize=8.5)
            ax.set_title(f"{grid.label}: 2-D grid\n({tiles} tiles, {kv_heads} KV heads), BLOCK_Q {grid.plan.block_q}",
                         fontsize=9)
        else:
            for t, tile in enumerate(grid.tiles):
                if tile is None:
                    _spare(ax, 0, t, segments, 1, "returns at once")
                    continue
                seq = tile[0]
                n = _segments(grid, seq)
                for k in range(segments):
                    if k < n:
                        _box(ax, k, t, 1, 1, color=colors[seq], edge="white")
                    else:
                        _spare(ax, k, t)
                _box(ax, segments + 0.6, t + 0.1, 2.3, 0.8, f"{n} -> 1", "#FFFFFF", size=8)
                _arrow(ax, (segments, t + 0.5), (segments + 0.6, t + 0.5))
            ax.text(segments + 1.75, -0.15, "reduce", ha="center", va="bottom", fontsize=8)
            ax.set_xlim(0, segments + 3)
            ax.set_ylim(tiles, 0)
            ax.set_xticks([k + 0.5 for k in range(segments)], [str(k) for k in range(segments)], fontsize=7)
            ax.set_yticks([t + 0.5 for t in range(tiles)],
                          [f"tile {t}: spare" if tile is None else
                           f"tile {t}: {grid.names[tile[0]]}, {grid.seq_lens[tile[0]]:,} keys"
                           for t, tile in enumerate(grid.tiles)], fontsize=8)
            ax.set_xlabel(f"segment (program_id 2), {grid.plan.segment_len} keys each; hatched: returns at once",
                          fontsize=8.5)
            ax.set_title(f"{grid.label}: 3-D grid ({tiles} tiles, {kv_heads} KV heads, {segments} segments),\n"
                         f"KV head 0 drawn (the other the same), BLOCK_Q {grid.plan.block_q}", fontsize=9)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.tick_params(length=0)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ one kernel or a split: a layer's attention calls


def _rows_owned(q_lens, names, rows: range) -> list:
    """The names of the requests whose query rows fall in ``rows`` (of the flat batch), in batch order."""
    starts = [sum(q_lens[:s]) for s in range(len(q_lens))]
    return [n for n, a, q in zip(names, starts, q_lens) if a < rows.stop and a + q > rows.start]


def split_calls_text(q_lens, names, calls: dict, num_layers: int, label: str = "the step") -> str:
    """Each backend's attention calls in one layer, in the order its ``forward`` makes them: the rows each covers,
    and whose they are; then the count over ``num_layers`` layers. ``calls``: backend -> [(call, rows), ...]."""
    width = max(map(len, calls)) + 1
    lines = [f"{label}: {sum(q_lens)} query rows, q_lens {list(q_lens)} ({', '.join(names)}); one layer's attention "
             "calls, in order:"]
    for backend, made in calls.items():
        for i, (call, rows) in enumerate(made, 1):
            head = f"{backend}:" if i == 1 else ""
            lines.append(f"  {head:<{width}} {i}. {call}, rows {rows.start}-{rows.stop - 1} "
                         f"({', '.join(_rows_owned(q_lens, names, rows))})")
        lines.append(f"  {'':<{width}} -> {len(made)} call{'s' if len(made) > 1 else ''} a layer, "
                     f"{num_layers * len(made)} over {num_layers} layers")
    return "\n".join(lines)


def split_calls_figure(q_lens, names, calls: dict, num_layers: int, label: str = "the step"):
    """The step's query rows (top, coloured by request), and under them each backend's attention calls in one
    layer: a box over the rows each call covers, numbered in the order ``forward`` makes them."""
    num_rows = sum(q_lens)
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.8 * (len(calls) + 1)))
    colors = [PALETTE[s % len(PALETTE)] for s in range(len(q_lens))]
    row = 0
    for s, q in enumerate(q_lens):
        for _ in range(q):
            _box(ax, row, 0.1, 1, 0.8, str(row), colors[s], edge="white", size=7.5)
            ax.texts[-1].set_color(_ink(colors[s]))
            row += 1
        ax.text(row - q / 2, -0.05, names[s], ha="center", va="bottom", fontsize=8)
    for y, made in enumerate(calls.values(), 1):
        for i, (call, rows) in enumerate(made, 1):
            _box(ax, rows.start + 0.05, y + 0.15, len(rows) - 0.1, 0.7,
                 f"{i}. {call}\nrows {rows.start}-{rows.stop - 1}", "#FFFFFF", size=8, lw=1.3)
        ax.text(num_rows + 0.3, y + 0.5, f"{len(made)} a layer\n{num_layers * len(made)} a step", va="center",
                fontsize=8)
    ax.set_xlim(0, num_rows + 3)
    ax.set_ylim(len(calls) + 1, -0.5)
    ax.set_yticks([0.5] + [y + 0.5 for y in range(1, len(calls) + 1)], ["query rows", *calls], fontsize=9)
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    ax.set_title(f"{label}: one layer's attention calls (boxes, numbered in the order forward makes them), "
                 f"x {num_layers} layers", fontsize=9.5)
    fig.tight_layout()
    return fig
