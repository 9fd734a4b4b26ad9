"""Draw a block map from a ``ManagerState`` snapshot (and nothing else).

Top: the physical pools as grids of cells (GPU, then CPU when swapping is on).
A cell is coloured by the sequence that owns it, striped when several share
it (with the ref count printed), filled from the bottom as far as its tokens
go; a free cell shows its place in the free queue (``#0`` is handed out next)
and, with prefix caching, the start of its hash.  Bottom: each sequence's
logical block table, entry ``i`` showing the physical block it maps to; a
hybrid v1 snapshot has one table per KV cache group (``seq r · sliding 8``),
and the null block, which stands for blocks that left a sliding window, is
drawn dark and marked ``null`` in the pool and in the tables. With prefix
caching, a sliding group's blocks that hold no prefix-cache name (nobody can
hit them; freed to the head of the free queue) are hatched, in the pool and
in the tables: under vLLM 0.33's default retention, all but the few a later
request can resume from.
"""

from __future__ import annotations

import math
from numbers import Integral

import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection

from ..errors import PagedKVValueError
from ..state import ManagerState, seq_name
from ..validate import check_int, is_list_like

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999933",
           "#882255", "#44AA99",
           # past 10 sequences: Paul Tol's muted and light schemes, still distinct from the first ten
           "#332288", "#88CCEE", "#117733", "#DDCC77", "#CC6677", "#AA4499", "#77AADD", "#EE8866", "#BBCC33",
           "#FFAABB"]
FREE, CACHED, EDGE, HIGHLIGHT, SOURCE = "#F4F4F4", "#C9C9C9", "#555555", "#CC0000", "#7B3294"
FREED = "#E69F00"  # dashed outline: a block given back this step
NULL = "#3A3A3A"  # the null block: a placeholder, never holds tokens
IN_USE = "#A6A6A6"  # a block in use that no table in the snapshot points at (a bare pool's)
CPU_HATCH = ".."  # a table entry on a CPU block (a swapped-out sequence)
STRIPES = "stripes, xN: shared by N sequences (ref count)"


def seq_colors(state: ManagerState, keep: dict | None = None) -> dict:
    """A colour per sequence, in the order the sequences appear in the snapshot. ``keep``: colours given
    earlier (e.g. the last drawing's), which the sequences still alive keep; new ones take unused colours."""
    keep = keep or {}
    colors = {seq: keep[seq] for seq in state.tables if seq in keep}
    unused = [c for c in PALETTE if c not in colors.values()] or PALETTE
    for i, seq in enumerate(s for s in state.tables if s not in colors):
        colors[seq] = unused[i % len(unused)]
    return colors


def _grid_columns(num_blocks: int) -> int:
    """About twice as wide as tall; at most 16 columns while cells carry labels (up to 128 blocks), 64 after,
    so a large pool is a wide grid rather than a thin column."""
    return max(1, min(16 if num_blocks <= 128 else 64, math.ceil(math.sqrt(num_blocks * 2))))


def _block_refs(name: str, refs) -> set:
    """``highlight``/``sources`` as ``{(device, block_id)}``: GPU block ids, or ``(device, id)`` pairs."""
    if not is_list_like(refs):
        raise PagedKVValueError(f"{name} must be a list of block ids or (device, block_id) pairs (() for none), "
                                f"got {refs!r}.")
    out = set()
    for ref in refs:
        device, block_id = ref if isinstance(ref, tuple) and len(ref) == 2 else ("gpu", ref)
        if device not in ("gpu", "cpu") or isinstance(block_id, bool) or not isinstance(block_id, Integral):
            raise PagedKVValueError(f"{name} holds {ref!r}; use GPU block ids (ints) or ('gpu'|'cpu', id) pairs.")
        out.add((device, int(block_id)))
    return out


def draw_block_map(state: ManagerState, ax=None, highlight=(), title: str | None = None,
                   show_tables: bool = True, labels: bool | None = None, sources=(), columns: int | None = None,
                   colors: dict | None = None, key: bool = False, ref_counts: bool = False, freed=()):
    """Draw ``state`` on ``ax`` (a new figure if None) and return the Axes.

    ``highlight``: block ids (GPU) or ``(device, block_id)`` pairs to outline in red, e.g.
    the blocks the last event touched; ``sources``: blocks to outline in purple, e.g. the
    source of a copy-on-write copy; ``freed``: blocks to outline dashed in orange, e.g. the blocks a step gave
    back.  ``labels`` (default: on up to 128 blocks
    in all) prints ids, ref counts and free positions in the cells; without them
    each block table is a bar of entries and its length.  Rectangles go into two collections
    (fills, outlines), which keeps a 256-block redraw fast.  ``columns``: cells per pool row
    (default: about twice as wide as tall).  ``colors``: seq_id -> colour to keep from an earlier drawing
    (``seq_colors(state, keep=...)``), so a sequence keeps its colour from one map to the next.  ``key``: a key
    under the figure for every mark used (for a figure of several maps, call :func:`add_block_map_key` once).
    ``ref_counts``: print every used block's ref count (``ref 1``, ``ref 2``), not only a shared block's ``xN``. A
    block in use that no table points at (a bare ``BlockPool``'s snapshot) is solid grey.
    """
    if not isinstance(state, ManagerState):
        raise PagedKVValueError(f"draw_block_map draws a snapshot, got {type(state).__name__}; pass "
                                "manager.snapshot() (or cache.snapshot()).")
    marked, copied = _block_refs("highlight", highlight), _block_refs("sources", sources)
    given_back = _block_refs("freed", freed)
    columns = None if columns is None else check_int("columns", columns, minimum=1)
    for name, value, allowed in (("title", title, (str, type(None))), ("show_tables", show_tables, (bool,)),
                                 ("labels", labels, (bool, type(None)))):
        if not isinstance(value, allowed):
            raise PagedKVValueError(f"{name} must be {' or '.join(t.__name__ for t in allowed)}, got {value!r}.")
    colors = seq_colors(state, colors if isinstance(colors, dict) else None)
    pools = [d for d, n in (("gpu", state.num_gpu_blocks), ("cpu", state.num_cpu_blocks)) if n]
    labels = labels if labels is not None else len(state.blocks) <= 128
    cols = {d: columns or _grid_columns(len(state.device_blocks(d))) for d in pools}
    rows = {d: math.ceil(len(state.device_blocks(d)) / cols[d]) for d in pools}
    rows_of_tables = _table_rows(state)
    table_rows = len(rows_of_tables) if show_tables else 0
    longest = max((len(t) for _, _, t in rows_of_tables), default=0)
    width = max(sum(cols.values()) + len(pools) - 1, (longest if labels else longest / 2 + 2) if table_rows else 0, 4)
    pitch = 1 if labels else max(1, round(width / 32))  # a wide unlabelled map: taller table rows, so names fit
    height = max(rows.values(), default=1) + (table_rows * pitch + 1.5 if table_rows else 0)
    if ax is None:
        _, ax = plt.subplots(figsize=(min(0.55 * width + 1, 16), min(0.55 * height + 1.2, 14)))

    fills, outlines, table_edges = _Rects("fills"), _Rects("block_outlines"), _Rects("table_outlines")
    freed_outlines = _Rects("freed_outlines")
    unnamed, hatched = (state.sliding_blocks(named=False) if state.prefix_caching else set()), _Rects("unnamed")
    on_cpu = _Rects("cpu_entries")  # table entries of a sequence swapped out: dotted, not pale (pale = empty slots)
    x0 = 0.0
    for device in pools:
        blocks = state.device_blocks(device)
        ax.text(x0, -0.35, f"{device.upper()} pool ({len(blocks)} blocks)", fontsize=9, weight="bold")
        for b in blocks:
            x, y = x0 + b.block_id % cols[device], b.block_id // cols[device]
            _cell(ax, b, x, y, state.block_size, colors, fills, labels, b.block_id == state.null_block, ref_counts)
            if device == "gpu" and b.block_id in unnamed:
                hatched.add(x, y, CELL, CELL, EDGE)
            ref = (device, b.block_id)
            color = HIGHLIGHT if ref in marked else SOURCE if ref in copied else EDGE
            outlines.add(x, y, CELL, CELL, color, 0.6 if color == EDGE else 2.2)
            if ref in given_back:
                freed_outlines.add(x + 0.06, y + 0.06, CELL - 0.12, CELL - 0.12, FREED, 2.0)
        x0 += cols[device] + 1
    if table_rows:
        _tables(ax, state, rows_of_tables, colors, max(rows.values(), default=1) + 1, fills, table_edges, labels,
                pitch, unnamed, hatched, on_cpu)
    ax.add_collection(fills.collection(zorder=1))
    if hatched.corners:
        ax.add_collection(hatched.collection(zorder=2, filled=False, hatch="////"))
    if on_cpu.corners:
        ax.add_collection(on_cpu.collection(zorder=2, filled=False, hatch=CPU_HATCH))
    ax.add_collection(outlines.collection(zorder=3, filled=False))
    ax.add_collection(table_edges.collection(zorder=3, filled=False))
    if freed_outlines.corners:
        ax.add_collection(freed_outlines.collection(zorder=3, filled=False, linestyle="--"))
    ax.set_xlim(-2.2 if table_rows else -0.5, width + 0.2)
    ax.set_ylim(height + 0.2, -0.8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"block_size {state.block_size}: {state.num_used('gpu')}/{state.num_gpu_blocks} "
                 f"GPU blocks used", fontsize=10)
    if key:
        add_block_map_key(ax.figure, highlight="red outline: the blocks the title is about" if marked else None,
                          source="purple outline: a copy's source" if copied else None,
                          freed="dashed orange outline: given back" if given_back else None,
                          cached=any(b.is_free and b.block_hash for b in state.blocks),
                          null=state.null_block is not None,
                          unnamed=bool(unnamed), shared=any(b.ref_count > 1 and (len(b.seq_ids) > 1 or not ref_counts)
                                                        for b in state.blocks),
                          sequences=colors if show_tables and 0 < len(colors) <= 8 else None,
                          cpu=any(d == "cpu" for d in state.seq_devices.values()),
                          hashes=any(b.block_hash for b in state.blocks), tables=bool(state.tables),
                          ref_counts=ref_counts, unowned=_any_unowned(state))
    return ax


CELL = 0.9  # a cell's side; the grid pitch is 1


class _Rects:
    """Rectangles gathered into one PolyCollection: one artist instead of hundreds of patches."""

    def __init__(self, name: str):
        self.name, self.corners, self.colors, self.widths = name, [], [], []

    def add(self, x, y, w, h, color, width=0.0):
        self.corners.append(((x, y), (x + w, y), (x + w, y + h), (x, y + h)))
        self.colors.append(color)
        self.widths.append(width)

    def collection(self, zorder, filled=True, hatch=None, linestyle="solid"):
        if hatch:  # edges drawn thin: the hatch takes the edge colour
            rects = PolyCollection(self.corners, facecolors="none", edgecolors=self.colors, linewidths=0,
                                   hatch=hatch, zorder=zorder)
        elif filled:
            rects = PolyCollection(self.corners, facecolors=self.colors, edgecolors="none", zorder=zorder)
        else:
            rects = PolyCollection(self.corners, facecolors="none", edgecolors=self.colors,
                                   linewidths=self.widths, linestyles=linestyle, zorder=zorder)
        rects.set_gid(self.name)
        return rects


def _any_unowned(state) -> bool:
    """A block in use that no table of the snapshot points at (a bare pool's snapshot has no tables)."""
    return any(not b.is_free and not b.seq_ids and b.block_id != state.null_block for b in state.blocks)


def _cell(ax, b, x, y, block_size, colors, fills, labels, is_null=False, ref_counts=False):
    if is_null:
        fills.add(x, y, CELL, CELL, NULL)
        if labels:
            ax.text(x + 0.04, y + 0.04, str(b.block_id), fontsize=8, va="top", color="white", zorder=4)
            ax.text(x + 0.45, y + 0.55, "null", fontsize=8, ha="center", va="center", color="white", zorder=4)
        return
    if b.is_free:
        fills.add(x, y, CELL, CELL, CACHED if b.block_hash else FREE)
    elif not b.seq_ids:  # in use, but no table here says by whom
        fills.add(x, y, CELL, CELL, IN_USE)
    else:
        owners = [s for s in b.seq_ids if s in colors] or [None]
        stripe = CELL / len(owners)
        filled = CELL * b.num_tokens / block_size
        for i, seq in enumerate(owners):  # one vertical stripe per sharing sequence
            color = colors.get(seq, "#BBBBBB")
            fills.add(x + i * stripe, y, stripe, CELL, _lighter(color))
            fills.add(x + i * stripe, y + CELL - filled, stripe, filled, color)  # slots holding tokens
    if not labels:
        return
    # Text in a cell: id (top left), xN (top right), #n or ref N (middle), hash (bottom, black on a white patch, so
    # it reads on any fill); 8 pt reads at README width.
    ax.text(x + 0.04, y + 0.04, str(b.block_id), fontsize=8, va="top", zorder=4)
    if b.is_free:
        ax.text(x + 0.5, y + 0.5, f"#{b.free_position}", fontsize=8, ha="center", va="center", color="#555555",
                zorder=4)
    elif ref_counts:
        ax.text(x + 0.5, y + 0.5, f"ref {b.ref_count}", fontsize=8, ha="center", va="center", weight="bold",
                zorder=4)
    elif b.ref_count > 1:
        ax.text(x + CELL - 0.04, y + 0.04, f"x{b.ref_count}", fontsize=8, ha="right", va="top", weight="bold",
                zorder=4)
    if b.block_hash:
        ax.text(x + 0.45, y + 0.8, b.block_hash[:4], fontsize=8, ha="center", va="center", color="black", zorder=4,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})


def _table_rows(state) -> list[tuple]:
    """``(seq, label, table)`` per row: one per sequence, or one per sequence and KV cache group (hybrid v1)."""
    if not state.group_tables:
        return [(seq, f"seq {seq_name(seq)}", table) for seq, table in state.tables.items()]
    return [(seq, f"seq {seq_name(seq)} · {name}", table) for seq, tables in state.group_tables.items()
            for name, table in zip(state.group_names, tables)]


def _tables(ax, state, rows, colors, top, fills, outlines, labels, pitch=1, unnamed=frozenset(), hatched=None,
            on_cpu_entries=None):
    """One row per sequence (and group): entry i is the physical block of logical block i ('c' and dotted: a CPU
    block; 'null': the null block, for a block that left the sliding window; hatched: an unnamed sliding block)."""
    ax.text(0, top - 0.35, "block tables", fontsize=9, weight="bold")
    for r, (seq, label, table) in enumerate(rows):
        y = top + r * pitch
        on_cpu = state.seq_devices[seq] == "cpu"
        count = "" if labels else f" ({len(table)})"  # large maps: no ids, so say how many entries
        ax.text(-0.1, y + 0.5 * pitch, f"{label}{count}", ha="right", va="center", fontsize=9)
        suffix = "c" if on_cpu else ""
        color = colors[seq]
        if not labels:  # large maps: a thin coloured bar per entry (text is slow to render)
            for i, block_id in enumerate(table):
                fills.add(i * 0.5, y + 0.3 * pitch, 0.45, 0.4 * pitch, NULL if block_id == state.null_block else color)
                if block_id in unnamed and "sliding" in label:
                    hatched.add(i * 0.5, y + 0.3 * pitch, 0.45, 0.4 * pitch, EDGE)
                if on_cpu and on_cpu_entries is not None:
                    on_cpu_entries.add(i * 0.5, y + 0.3 * pitch, 0.45, 0.4 * pitch, "#777777")
            continue
        for i, block_id in enumerate(table):
            is_null = block_id == state.null_block
            fills.add(i, y + 0.1, CELL, 0.8, NULL if is_null else color)
            if block_id in unnamed and "sliding" in label:
                hatched.add(i, y + 0.1, CELL, 0.8, EDGE)
            if on_cpu and on_cpu_entries is not None:
                on_cpu_entries.add(i, y + 0.1, CELL, 0.8, "#777777")
            outlines.add(i, y + 0.1, CELL, 0.8, EDGE, 0.6)
            ax.text(i + 0.45, y + 0.5, "null" if is_null else f"{block_id}{suffix}", ha="center", va="center",
                    fontsize=7 if is_null else 8, color="white" if is_null else "black", zorder=4)


STRIPES = "stripes, xN: shared by N sequences (ref count)"


def add_block_map_key(fig, highlight: str | None = None, source: str | None = None, cached: bool = False,
                      ncol: int = 2, null: bool = False, sequences: dict | None = None, unnamed: bool = False,
                      shared: bool = True, filled: str = "slots with tokens", cpu: bool = False, hashes: bool = False,
                      tables: bool = True, ref_counts: bool = False, unowned: bool = False, freed: str | None = None,
                      stripes: tuple | None = None, swatch: str | None = None):
    """A key under the figure for every mark a block map uses (and the optional outlines given); ``sequences``
    (seq_id -> colour, e.g. ``seq_colors(state)``) adds one entry per sequence. Returns nothing, so a cell that
    ends with it shows no legend object; the key is ``fig.legends[-1]``. ``shared=False`` leaves out the stripes'
    entry, for a figure where no block is shared; ``filled`` names the dark slots (e.g. "slots allocated", where a
    slot is held for a token not yet known); ``cpu=True`` adds the mark of a table entry on a CPU block; ``hashes=True``
    explains the text at a cell's bottom (a named block's hash); ``tables=False`` leaves out the sequence and table
    entries, for a map with no sequences; ``ref_counts=True`` explains a used block's ``ref N``; ``unowned=True`` the
    solid grey of a block in use that no table points at (a bare pool's); ``freed`` labels the dashed orange outline
    of ``draw_block_map(freed=...)``; ``stripes``: the two colours of the stripes' entry (default: the palette's
    first two), e.g. those of two sequences that share a block in the map; ``swatch``: the colour of the entries for
    a sequence's block (default: the palette's first), e.g. a sequence's that the map shows."""
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def blank(label):
        return Line2D([], [], linestyle="none", label=label)

    swatch = swatch or PALETTE[0]
    handles = [*([Patch(facecolor=swatch, edgecolor=EDGE, label=f"a sequence's block: dark = {filled}"),
                  Patch(facecolor=_lighter(swatch), edgecolor=EDGE, label="pale = empty slots")] if tables else []),
               Patch(facecolor=FREE, edgecolor=EDGE, label="free block"),
               *([tuple(Patch(facecolor=c, edgecolor=EDGE) for c in (stripes or PALETTE[:2]))] if shared else []),
               blank("#n: place in the free queue (#0 goes next)"),
               blank("top-left number: physical block id"),
               *([blank("block table entry i: the physical block of logical block i")] if tables else [])]
    if unowned:
        handles.append(Patch(facecolor=IN_USE, edgecolor=EDGE, label="grey: in use (the pool alone: no tables)"))
    if ref_counts:
        handles.append(blank("ref N: the block's ref count (its users)"))
    if hashes:
        handles.append(blank("bottom text: the block's name (first 4 hex digits of its hash)"))
    if cached:
        handles += [Patch(facecolor=CACHED, edgecolor=EDGE, label="free but cached: keeps its hash (bottom)")]
    if null:
        handles += [Patch(facecolor=NULL, edgecolor=EDGE, label="null block: stands for a block that left the window")]
    if unnamed:
        handles += [Patch(facecolor="white", edgecolor=EDGE, hatch="////", label="hatched: a sliding block with no "
                          "hash (nobody can hit it; freed to the queue's head)"),
                    blank("sliding block not hatched: named (hashed), a later request can resume from it")]
    if cpu:
        handles += [Patch(facecolor="white", edgecolor=EDGE, hatch=CPU_HATCH,
                          label="dotted table entry, Nc: on CPU block N (swapped out)")]
    if sequences:
        handles += [Patch(facecolor=color, edgecolor=EDGE, label=f"colour of seq {seq_name(seq)}")
                    for seq, color in sequences.items()]
    if highlight:
        handles.append(Patch(facecolor="none", edgecolor=HIGHLIGHT, linewidth=2, label=highlight))
    if source:
        handles.append(Patch(facecolor="none", edgecolor=SOURCE, linewidth=2, label=source))
    if freed:
        handles.append(Patch(facecolor="none", edgecolor=FREED, linewidth=2, linestyle="--", label=freed))
    labels = [STRIPES if isinstance(h, tuple) else h.get_label() for h in handles]
    fig.legend(handles=handles, labels=labels, loc="lower center", ncol=ncol, fontsize=9, frameon=False,
               handlelength=1.4, bbox_to_anchor=(0.5, -0.02), handler_map={tuple: HandlerTuple(ndivide=None, pad=0)})


def key_below(fig, **key_options):
    """``add_block_map_key``, with the figure's axes laid out above it, so the key covers no tick label or block
    table (``tight_layout`` keeping the key's height free). Returns the key."""
    add_block_map_key(fig, **key_options)
    key = fig.legends[-1]
    height = key.get_window_extent(fig.canvas.get_renderer()).height / fig.bbox.height
    fig.tight_layout(rect=(0, height, 1, 1))
    return key


def key_beside(fig, width: float = 0.36, **key_options):
    """``add_block_map_key`` in one column at the figure's right, the axes laid out in the rest (``width``: the
    share of the figure's width the key takes). For a single map with room beside it. Returns the key."""
    add_block_map_key(fig, ncol=1, **key_options)
    key = fig.legends[-1]
    key.set_loc("center left")
    key.set_bbox_to_anchor((1 - width, 0.5), transform=fig.transFigure)
    fig.tight_layout(rect=(0, 0, 1 - width, 1))
    return key


def align_panels(axes) -> None:
    """Give every block-map panel the same extent, so cells have one size and the grids line up."""
    xs = [ax.get_xlim() for ax in axes]
    ys = [ax.get_ylim() for ax in axes]
    for ax in axes:
        ax.set_xlim(min(x[0] for x in xs), max(x[1] for x in xs))
        ax.set_ylim(max(y[0] for y in ys), min(y[1] for y in ys))


def _lighter(hex_color: str, amount: float = 0.6) -> tuple:
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def _ink(color: str) -> str:
    """Black or white text, whichever reads on ``color``."""
    r, g, b = (int(color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
