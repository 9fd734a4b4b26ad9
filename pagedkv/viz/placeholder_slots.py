"""One request's token positions at a few moments of the async loop: which hold a known token, which are tokens a
step in flight samples (placeholders), with a KV slot already or not yet, and which slots are still free in the
blocks the request holds.

A moment is plain data, ``(label, num_tokens, num_output_placeholders, num_slots)``, read off the scheduler after a
``schedule()`` or an ``update_from_output``: the request's known tokens (``Request.num_tokens``), the tokens steps
in flight will sample (``Request.num_output_placeholders``, vLLM 0.33's name, ``vllm/v1/request.py``) and the slots
allocated to it (``KVCacheManager.num_slots``; vLLM keeps only the blocks, ``req_to_blocks``). Position ``p`` is a
known token while ``p < num_tokens``, a placeholder for the next ``num_output_placeholders`` positions (with a slot
while ``p < num_slots``), and a free slot up to the end of the request's last block.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..errors import PagedKVValueError
from .block_map import EDGE, FREE, PALETTE

KNOWN, PLACEHOLDER = PALETTE[1], PALETTE[0]
WORDS = {"#": "known token, with its slot", "?": "placeholder with a slot: a token nobody has seen yet",
         "o": "placeholder with no slot yet", ".": "free slot, in a block the request holds"}
GAP = 0.35  # between two blocks, in slot widths


def _kinds(num_tokens: int, num_placeholders: int, num_slots: int, block_size: int) -> list[str]:
    """One mark per position, up to the end of the request's last block or of its last placeholder."""
    if num_tokens > num_slots:
        raise PagedKVValueError(f"{num_tokens} known tokens but {num_slots} slots: these strips draw the async loop, "
                                "where every known token already has a slot.")
    held = math.ceil(num_slots / block_size) * block_size
    end = max(held, num_tokens + num_placeholders)

    def kind(p):
        if p < num_tokens:
            return "#"
        if p < num_tokens + num_placeholders:
            return "?" if p < num_slots else "o"
        return "."
    return [kind(p) for p in range(end)]


def placeholder_slots_text(moments, block_size: int) -> str:
    """The strips as text, one line per moment, ``|`` between the blocks the request holds (a placeholder past them
    stands after a space); the key is the last lines."""
    width = max(len(label) for label, *_ in moments)
    lines = []
    for label, num_tokens, num_placeholders, num_slots in moments:
        kinds = "".join(_kinds(num_tokens, num_placeholders, num_slots, block_size))
        held = math.ceil(num_slots / block_size) * block_size
        blocks = "|".join(kinds[i:i + block_size] for i in range(0, held, block_size))
        lines.append(f"{label:<{width}}  {blocks}" + (f" {kinds[held:]}" if kinds[held:] else ""))
    lines += [f"  {mark} {words}" for mark, words in WORDS.items()]
    return "\n".join(lines)


def draw_placeholder_slots(moments, block_size: int, ax=None, title: str | None = None):
    """One strip per moment, top to bottom, a cell per position (its number under it), the request's blocks apart;
    a placeholder carries a ``?``, drawn dashed while it has no slot. Returns the axes; the key is below them."""
    rows = [_kinds(num_tokens, num_placeholders, num_slots, block_size)
            for _, num_tokens, num_placeholders, num_slots in moments]
    width = max(len(kinds) for kinds in rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.42 * width + 3.6, 0.42 * len(rows) + 1.3))
    x_of = [p + GAP * (p // block_size) for p in range(width)]
    for row, kinds in enumerate(rows):
        for p, kind in enumerate(kinds):
            face = {"#": KNOWN, "?": PLACEHOLDER, "o": "white", ".": FREE}[kind]
            ax.add_patch(Rectangle((x_of[p], row + 0.1), 0.9, 0.8, facecolor=face,
                                   edgecolor=PLACEHOLDER if kind == "o" else EDGE,
                                   linestyle="--" if kind == "o" else "-", linewidth=1.2 if kind == "o" else 0.8))
            if kind in "?o":
                ax.text(x_of[p] + 0.45, row + 0.52, "?", ha="center", va="center", fontsize=10, fontweight="bold",
                        color="black" if kind == "?" else PLACEHOLDER)
    ax.set_xlim(-0.2, x_of[-1] + 1.1)
    ax.set_ylim(len(rows), 0)
    ax.set_yticks([r + 0.5 for r in range(len(rows))], [label for label, *_ in moments])
    ax.set_xticks([x + 0.45 for x in x_of], [str(p) for p in range(width)], fontsize=8)
    ax.set_xlabel(f"position in the request (block size {block_size})")
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title)
    handles = [Patch(facecolor=KNOWN, edgecolor=EDGE, label=WORDS["#"]),
               Patch(facecolor=PLACEHOLDER, edgecolor=EDGE, label=WORDS["?"]),
               Patch(facecolor="white", edgecolor=PLACEHOLDER, linestyle="--", label=WORDS["o"]),
               Patch(facecolor=FREE, edgecolor=EDGE, label=WORDS["."])]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.4, -0.2), ncol=2, fontsize=8, frameon=False)
    return ax
