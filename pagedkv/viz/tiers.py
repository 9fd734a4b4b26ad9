"""The two tiers of KV blocks side by side: the GPU pool and the CPU offloading tier, keyed by block content.

Both maps read only snapshots (``KVCacheManager.snapshot()`` and ``OffloadingConnector.snapshot()``). A block is
named by what it holds, not where: ``block_names`` turns a conversation's tokens into the block hashes the prefix
cache and the CPU tier key it by, and calls block ``i`` of conversation ``A`` "A2", so the same name in both maps
is the same K/V. In the GPU pool a block is in use (solid), free but still cached (pale: a prefix hit revives it, the
next allocation may evict it) or free and nameless (empty); in the CPU tier a chunk is stored (solid), being stored
(hatched: not readable yet) or pinned by a load (outlined). Each cell carries its block or chunk id in its corner;
a CPU chunk also carries ``ev k``, its place in the tier's eviction order (``ev 0`` goes first).
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

from ..errors import PagedKVValueError
from ..prefix import hash_block_tokens
from ..state import ManagerState, OffloadState
from .block_map import EDGE, FREE, HIGHLIGHT, PALETTE, _lighter


def block_names(token_ids, block_size: int, name: str) -> dict:
    """``{block hash: f"{name}{i}"}`` for each full block of ``token_ids`` (the hashes vLLM's prefix cache and the
    CPU tier key the blocks by)."""
    names, parent = {}, None
    for i in range(len(token_ids) // block_size):
        parent = hash_block_tokens(parent, token_ids[i * block_size:(i + 1) * block_size])
        names[parent] = f"{name}{i}"
    return names


def _owner(label: str) -> str:
    return label.rstrip("0123456789") or label


def _check(gpu, cpu, names) -> None:
    if not isinstance(gpu, ManagerState) or not isinstance(cpu, OffloadState):
        raise PagedKVValueError("pass engine.snapshot() (the GPU pool) and engine.scheduler.connector.snapshot() (the "
                                f"CPU tier), got {type(gpu).__name__} and {type(cpu).__name__}.")
    if not isinstance(names, dict):
        raise PagedKVValueError(f"names must be a dict {{block hash: name}} (from block_names), got {names!r}.")


def render_tiers(gpu: ManagerState, cpu: OffloadState, names: dict) -> str:
    """A text map of both tiers: each cell ``id:name`` (``?`` for a block no name covers, ``.`` empty, ``new`` in
    use but not named yet: being computed or loaded); in the GPU pool ``~`` marks a free block that still holds its
    cached K/V; in the CPU tier ``*`` a store not yet complete and ``^`` a chunk a load is reading. Then the order
    in which each tier gives blocks up."""
    _check(gpu, cpu, names)
    cells = []
    for b in gpu.device_blocks("gpu"):
        label = names.get(b.block_hash, "?") if b.block_hash else ("new" if not b.is_free else ".")
        cells.append(f"{b.block_id}:{label}{'~' if b.is_free and b.block_hash else ''}")
    lines = [f"GPU pool, {gpu.num_used('gpu')}/{gpu.num_gpu_blocks} blocks in use:", _wrap(cells)]
    by_id = {c.chunk_id: c for c in cpu.chunks}
    cells = []
    for i in range(cpu.num_cpu_blocks):
        c = by_id.get(i)
        cells.append(f"{i}:." if c is None else
                     f"{i}:{names.get(c.block_hash, '?')}{'' if c.ready else '*'}{'^' if c.ref_count else ''}")
    lines += [f"CPU tier, {len(cpu.chunks)}/{cpu.num_cpu_blocks} blocks stored:", _wrap(cells)]
    cached = [b for b in gpu.device_blocks("gpu") if b.is_free and b.block_hash]
    cached.sort(key=lambda b: b.free_position)
    lines.append("GPU cached blocks, evicted first to last: "
                 + (" ".join(names.get(b.block_hash, "?") for b in cached) or "(none)"))
    order = sorted(cpu.chunks, key=lambda c: c.evict_position)
    lines.append("CPU blocks, evicted first to last: "
                 + (" ".join(names.get(c.block_hash, "?") for c in order) or "(none)"))
    return "\n".join(lines)


def _wrap(cells: list, per_line: int = 8) -> str:
    width = max((len(c) for c in cells), default=0) + 1
    return "\n".join("  " + "".join(f"{c:<{width}}" for c in cells[i:i + per_line]).rstrip()
                     for i in range(0, len(cells), per_line))


# owners' colours: the course palette with its yellow moved back, so the first four owners (orange, sky blue,
# green, pink) stay apart even when pale
_OWNER_COLORS = [PALETTE[i] for i in (0, 1, 2, 6, 4, 5, 3)] + PALETTE[7:]


def draw_tiers(gpu: ManagerState, cpu: OffloadState, names: dict, ax=None, title: str | None = None,
               highlight=(), columns: int = 8, highlight_label: str = "red: highlighted", loads=None):
    """Both tiers as grids, each cell labelled with the name of the K/V it holds and coloured by its owner
    (``A`` for "A2"), its block or chunk id in the top corner; a CPU chunk shows ``ev k`` under its name, its place
    in the eviction order. ``highlight``: labels to outline in red (block names, or ``"new"`` for a GPU block in use
    that holds no named K/V yet), ``highlight_label`` the key's line for them. ``loads``: GPU block id -> the name
    of the CPU chunk a load copies into it, drawn ``A1↓`` in that block. Returns the Axes; the key, which names only
    what the picture shows, is drawn under it."""
    loads = dict(loads or {})
    _check(gpu, cpu, names)
    owners = list(dict.fromkeys(_owner(n) for n in names.values()))
    colors = {o: _OWNER_COLORS[i % len(_OWNER_COLORS)] for i, o in enumerate(owners)}
    gpu_blocks = gpu.device_blocks("gpu")
    rows = max(math.ceil(len(gpu_blocks) / columns), math.ceil(cpu.num_cpu_blocks / columns), 1)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.62 * (2 * columns + 1) + 1, 0.62 * rows + 1.8))
    marked = set(highlight)
    seen = set()  # what the picture shows, for the key
    pale = None

    def cell(x, y, label, fill, hatch=None, edge=EDGE, width=0.6, corner="", rank=None):
        ax.add_patch(Rectangle((x, y), 0.9, 0.9, facecolor=fill, edgecolor=edge, linewidth=width, hatch=hatch))
        ax.text(x + 0.45, y + 0.5, label, ha="center", va="center", fontsize=9)
        ax.text(x + 0.86, y + 0.05, corner, ha="right", va="top", fontsize=7.5, color="#333333")
        if rank is not None:
            ax.text(x + 0.45, y + 0.86, f"ev {rank}", ha="center", va="bottom", fontsize=7, color="#333333")

    ax.text(0, -0.35, f"GPU pool ({len(gpu_blocks)} blocks)", fontsize=9, weight="bold")
    for b in gpu_blocks:
        x, y = b.block_id % columns, b.block_id // columns
        name = names.get(b.block_hash, "?") if b.block_hash else None
        owner = colors.get(_owner(name)) if name else None
        if owner is not None:
            fill = _lighter(owner) if b.is_free else owner
            seen.add(_owner(name))
            if b.is_free:
                seen.add("pale")
                pale = pale or _lighter(owner)  # the key's swatch: a pale cell the picture shows
        else:
            fill = FREE if b.is_free and not b.block_hash else "#E0E0E0" if b.is_free else "#BBBBBB"
            if b.is_free or b.block_id not in loads:  # a load target has its own key line
                seen.add("empty" if b.is_free and not b.block_hash else "new" if not b.is_free else "other")
        label = name or ("" if b.is_free else "new")
        edge, width = (HIGHLIGHT, 2.0) if label and label in marked else (EDGE, 0.6)
        if label == "new" and b.block_id in loads:
            label = f"{loads[b.block_id]}↓"
            seen.add("load")
        cell(x, y, label, fill, edge=edge, width=width, corner=str(b.block_id))
    x0 = columns + 1
    ax.text(x0, -0.35, f"CPU tier ({cpu.num_cpu_blocks} blocks)", fontsize=9, weight="bold")
    by_id = {c.chunk_id: c for c in cpu.chunks}
    for i in range(cpu.num_cpu_blocks):
        x, y = x0 + i % columns, i // columns
        c = by_id.get(i)
        if c is None:
            cell(x, y, "", FREE, corner=str(i))
            seen.add("empty")
            continue
        name = names.get(c.block_hash, "?")
        fill = colors.get(_owner(name), "#BBBBBB")
        seen.add(_owner(name))
        seen.add("rank")
        if not c.ready:
            seen.add("hatched")
        if c.ref_count and name not in marked:
            seen.add("pinned")
        edge, width = (HIGHLIGHT, 2.0) if name in marked else ("#000000", 2.0) if c.ref_count else (EDGE, 0.6)
        cell(x, y, name, fill, hatch=None if c.ready else "///", edge=edge, width=width, corner=str(i),
             rank=c.evict_position)
    ax.set_xlim(-0.2, 2 * columns + 1.2)
    ax.set_ylim(rows + 0.2, -0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    handles = [Patch(facecolor=colors[o], edgecolor=EDGE, label=f"{o}: {o}'s K/V")
               for o in owners if o in seen]
    keys = [("pale", dict(facecolor=pale, edgecolor=EDGE),
             "pale: GPU block free but cached (solid: in use)"),
            ("new", dict(facecolor="#BBBBBB", edgecolor=EDGE), "new: GPU block in use, not yet named"),
            ("load", dict(facecolor="#BBBBBB", edgecolor=EDGE),
             "X↓: GPU block in use, the load copies CPU chunk X into it"),
            ("empty", dict(facecolor=FREE, edgecolor=EDGE), "white: free, no name"),
            ("hatched", dict(facecolor="white", edgecolor=EDGE, hatch="///"), "hatched: store not yet complete"),
            ("pinned", dict(facecolor="white", edgecolor="#000000", linewidth=2), "thick: pinned by a load")]
    handles += [Patch(label=label, **style) for key, style, label in keys if key in seen]
    if "rank" in seen:
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label="ev k: the CPU tier evicts it k-th (ev 0 first); corner: block / chunk id"))
    if marked:
        handles.append(Patch(facecolor="white", edgecolor=HIGHLIGHT, linewidth=2, label=highlight_label))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, fontsize=8, frameon=False)
    return ax
