"""Which of a prefix's blocks hold a prefix-cache name, one strip per (request, KV cache group).

A strip is a row of cells, cell ``i`` the request's logical block ``i``: filled when that block's hash is in the
group's hash -> block map (named, a later request can hit it), hatched when not. Vertical marks show token
boundaries: a shared-prefix junction, a replay boundary. The data are plain lists, read off the manager with its
public helpers (``KVCacheManager.block_hashes``, ``BlockPool.get_cached_block``); the real thing is vLLM 0.33's
``SlidingWindowManager.reachable_block_mask`` in ``vllm/v1/core/single_type_kv_cache_manager.py``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from ..errors import PagedKVValueError
from .block_map import EDGE, PALETTE

NAMED = PALETTE[4]
MARK_STYLES = {"junction": dict(color="#CC0000", linestyle="-"), "replay": dict(color="#7B3294", linestyle="--")}


def named_strips_text(strips: dict[str, list[bool]], marks: dict[str, dict[str, int]] | None = None,
                      block_size: int = 4) -> str:
    """The strips as text: ``#`` named, ``.`` not, ``|`` before the block where a mark falls (at or after it)."""
    marks = marks or {}
    width = max((len(s) for s in strips), default=0)
    lines = []
    for label, named in strips.items():
        cuts = {token // block_size for token in marks.get(label, {}).values()}
        row = "".join(("|" if i in cuts else "") + ("#" if on else ".") for i, on in enumerate(named))
        row += "|" if len(named) in cuts else ""
        ordered = sorted(marks.get(label, {}).items(), key=lambda mark: mark[1])
        where = ", ".join(f"{kind} {token}" for kind, token in ordered)
        lines.append(f"{label:<{width}}  {row}" + (f"   ({where})" if where else ""))
    return "\n".join(lines)


def draw_named_strips(strips: dict[str, list[bool]], marks: dict[str, dict[str, int]] | None = None,
                      block_size: int = 4, ax=None, title: str | None = None):
    """One strip per key of ``strips`` (a label -> named or not per logical block), top to bottom; ``marks``:
    label -> {``"junction"`` or ``"replay"``: token position}, drawn as a line at that token boundary, floored to
    a block. Returns the axes; the key is on it (``ax.get_legend()``)."""
    marks = marks or {}
    for label, kinds in marks.items():
        unknown = set(kinds) - set(MARK_STYLES)
        if label not in strips or unknown:
            raise PagedKVValueError(f"marks name {label!r} with {sorted(kinds)}; give marks for labels in strips "
                                    f"({sorted(strips)}) and kinds among {sorted(MARK_STYLES)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 0.4 * len(strips) + 1.3))
    for row, (label, named) in enumerate(strips.items()):
        for i, on in enumerate(named):
            ax.add_patch(Rectangle((i, row + 0.1), 0.92, 0.8, facecolor=NAMED if on else "white", edgecolor=EDGE,
                                   hatch=None if on else "////", linewidth=0.8))
        for kind, token in marks.get(label, {}).items():
            x = token // block_size - 0.04
            ax.plot([x, x], [row, row + 1], linewidth=2.5, **MARK_STYLES[kind])
    width = max((len(s) for s in strips.values()), default=1)
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(len(strips), 0)
    ax.set_yticks([r + 0.5 for r in range(len(strips))], list(strips))
    ax.set_xticks([i + 0.46 for i in range(width)], [str(i) for i in range(width)])
    ax.set_xlabel(f"logical block (block size {block_size})")
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title)
    handles = [Patch(facecolor=NAMED, edgecolor=EDGE, label="named: its hash is in the group's map"),
               Patch(facecolor="white", edgecolor=EDGE, hatch="////", label="no name (or not cached)"),
               Line2D([], [], linewidth=2.5, label="shared-prefix junction", **MARK_STYLES["junction"]),
               Line2D([], [], linewidth=2.5, label="replay boundary (floored to a block)", **MARK_STYLES["replay"])]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, frameon=False)
    return ax
