"""Free queues side by side: one row per engine (or rule), each the queue's block ids from the head (handed out
next) to the tail, so that the same steps under different free rules can be compared at a glance. Plain lists in,
as the engines' own queues list them (``free_block_ids()``; 0.6.3's ``deque`` of ids)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..errors import PagedKVValueError
from .block_map import CACHED, EDGE, FREE, HIGHLIGHT


def free_queues_text(queues: dict[str, list[int]], named: dict[str, set] | None = None) -> str:
    """One line per queue, head first; ``*`` after a block that still holds a prefix-cache name."""
    named = named or {}
    width = max((len(label) for label in queues), default=0)
    return "\n".join(f"{label:<{width}}  " + " ".join(f"{b}*" if b in named.get(label, ()) else str(b) for b in queue)
                     for label, queue in queues.items())


def draw_free_queues(queues: dict[str, list[int]], named: dict[str, set] | None = None, marked=(),
                     marked_label: str = "red outline: the blocks the last step freed", ax=None,
                     title: str | None = None):
    """Draw each queue of ``queues`` (label -> block ids, head first) as a row of cells, one row per label, top to
    bottom. ``named``: label -> the blocks of that queue that still hold a name (darker, like a cached free block
    on a block map); ``marked``: blocks outlined red in every row, named in the key by ``marked_label``. Returns the
    axes; the key is under it (``ax.get_legend()``)."""
    named = named or {}
    unknown = set(named) - set(queues)
    if unknown:
        raise PagedKVValueError(f"named gives blocks for {sorted(unknown)}, which are not among the queues "
                                f"({list(queues)}).")
    marked = set(marked)
    width = max((len(q) for q in queues.values()), default=1)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.5 * width + 3.2, 0.5 * len(queues) + 1.3))
    for row, (label, queue) in enumerate(queues.items()):
        for i, block_id in enumerate(queue):
            red = block_id in marked
            ax.add_patch(Rectangle((i, row + 0.1), 0.9, 0.8, facecolor=CACHED if block_id in named.get(label, ())
                                   else FREE, edgecolor=HIGHLIGHT if red else EDGE, linewidth=2.2 if red else 0.6))
            ax.text(i + 0.45, row + 0.5, str(block_id), ha="center", va="center", fontsize=9)
    ax.set_xlim(-0.1, width)
    ax.set_ylim(len(queues), -0.05)
    ax.set_yticks([r + 0.5 for r in range(len(queues))], list(queues))
    ax.set_xticks([0.45, width - 0.55], ["head: handed out next", "tail"])
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10)
    handles = [Patch(facecolor=FREE, edgecolor=EDGE, label="free block (its id)")]
    if any(named.values()):
        handles.append(Patch(facecolor=CACHED, edgecolor=EDGE, label="free, still holds a prefix-cache name"))
    if marked:
        handles.append(Patch(facecolor="none", edgecolor=HIGHLIGHT, linewidth=2, label=marked_label))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(handles), fontsize=8,
              frameon=False)
    return ax
