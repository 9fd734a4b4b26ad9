"""Notebook 01's two larger pictures, drawn from numbers the notebook computes: one KV block as a grid of cells, and
where an 80 GiB card goes in each engine beside what the CUDA-graph assumption does to the comparison."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from ..sizing import GiB
from .compact_png import compact_png

BUDGET_COLORS = {"weights": "#999999", "activations": "#E69F00", "CUDA graphs": "#CC79A7", "KV cache": "#009E73",
                 "left free": "#FFFFFF"}


def draw_block_grid(num_layers: int, num_kv_heads: int, block_size: int, slot: int, cell_bytes: int):
    """One block: a part per layer and K or V, a row per KV head, a column per slot; ``slot``'s column darker."""
    width = block_size + 1  # a part's slots, then a gap
    grid = np.full((num_kv_heads, 2 * num_layers * width - 1), np.nan)
    for part in range(2 * num_layers):  # layer 0 K, layer 0 V, layer 1 K, ...
        grid[:, part * width:part * width + block_size] = part % 2  # 0: K, 1: V
        grid[:, part * width + slot] = part % 2 + 2  # 2: K of the slot, 3: V of the slot
    fig, ax = plt.subplots(figsize=(8, 2.6), dpi=110)
    ax.imshow(grid, cmap=ListedColormap(["#9ED3F0", "#F3C97A", "#0072B2", "#B35900"]), aspect="auto", vmin=0, vmax=3)
    ax.set_xticks([part * width + (block_size - 1) / 2 for part in range(2 * num_layers)],
                  [f"layer {part // 2}\n{'KV'[part % 2]}" for part in range(2 * num_layers)], fontsize=8)
    ax.set_yticks(range(num_kv_heads), [f"KV head {head}" for head in range(num_kv_heads)], fontsize=7)
    ax.set_xticks(np.arange(-0.5, grid.shape[1]), minor=True)
    ax.set_yticks(np.arange(-0.5, num_kv_heads), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel(f"each part's {block_size} columns are the block's {block_size} slots, one token each; "
                  f"dark: slot {slot}", fontsize=8)
    num_cells = 2 * num_layers * num_kv_heads * block_size
    ax.set_title(f"One block of the toy model: {num_cells} cells of {cell_bytes} bytes (K blue, V orange)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def draw_memory_budget(rows: dict, what_if: dict, assumed: float, total: float = 80 * GiB):
    """Above, ``rows`` ({model: {engine: budget}}, each budget's parts in bytes as ``BUDGET_COLORS`` names them and
    its ``tokens``) as stacked bars, an engine a bar; below, ``what_if`` ({CUDA-graph estimate in GiB: 0.33's KV
    cache less v0.6.3's, in GiB}) as a line, the ``assumed`` estimate marked. Returned as a small PNG
    (``compact_png``): the stored notebook stays light."""
    fig, (bars, line) = plt.subplots(2, 1, figsize=(8.4, 7), dpi=110, height_ratios=(2.6, 1))
    for y, engines in enumerate(rows.values()):
        for dy, (engine, row) in zip((-0.21, 0.21), engines.items()):
            left = 0
            for part, color in BUDGET_COLORS.items():
                bars.barh(y + dy, row[part] / GiB, height=0.4, left=left / GiB, color=color, edgecolor="#333333",
                          label=part if (y, engine) == (0, "0.33") else None)
                left += row[part]
            bars.text(total / GiB + 1, y + dy, f"{engine}: {row['tokens']:,} tokens", va="center", fontsize=8)
    bars.set_yticks(range(len(rows)), list(rows), fontsize=9)
    bars.set_xlim(0, total / GiB)
    bars.invert_yaxis()
    bars.set_xlabel("GiB of one 80 GiB GPU (v0.6.3 the upper bar, 0.33 the lower)")
    bars.set_title(f"A model of where the card goes: 16-bit, block_size 16, assumed activations and a {assumed:g} GiB "
                   "CUDA-graph estimate", fontsize=10)
    bars.legend(fontsize=8.5, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    estimates = list(what_if)
    line.plot(estimates, list(what_if.values()), "o-", color="#009E73")
    line.axhline(0, color="#333333", linewidth=0.8)
    line.plot([assumed], [what_if[assumed]], "o", color="#CC79A7", markersize=9, zorder=3)
    line.annotate(f"the assumed {assumed:g} GiB: {what_if[assumed]:+.1f} GiB", (assumed, what_if[assumed]),
                  xytext=(10, 4), textcoords="offset points", fontsize=8)
    tie = next((g for g, delta in what_if.items() if abs(delta) < 0.05), None)
    if tie is not None:
        line.annotate(f"a tie at {tie:g} GiB", (tie, 0), xytext=(8, 8), textcoords="offset points", fontsize=8)
    line.set_xticks(estimates, [f"{g:g}" for g in estimates])
    line.set_xlabel("0.33's CUDA-graph estimate (GiB)")
    line.set_ylabel("0.33 less v0.6.3\n(GiB of KV cache)", fontsize=9)
    line.set_title("The same comparison for other CUDA-graph estimates: above 0, 0.33 holds more", fontsize=10)
    fig.tight_layout()
    return compact_png(fig)
