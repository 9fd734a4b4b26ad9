"""Snapshots: the manager's state as plain, immutable data.

Notebooks print a snapshot (``print(state)`` draws a text block map that
nbval can compare) and the drawings in ``pagedkv.viz`` read nothing else, so
the view never reaches into the allocator's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BlockState:
    """One physical block at the moment of the snapshot."""

    block_id: int
    device: str  # "gpu" or "cpu"
    ref_count: int
    seq_ids: tuple  # the sequences whose tables point at this block
    num_tokens: int  # filled slots (a full block holds block_size)
    block_hash: str | None  # prefix-cache name, None unless cached
    free_position: int | None  # place in the free queue (0 = handed out next), None when used

    @property
    def is_free(self) -> bool:
        return self.free_position is not None


@dataclass(frozen=True)
class ManagerState:
    """Everything needed to draw or check a :class:`BlockSpaceManager`."""

    block_size: int
    blocks: tuple  # BlockState for every GPU block, then every CPU block
    tables: dict  # seq_id -> [block ids] on the sequence's device
    seq_devices: dict  # seq_id -> "gpu" | "cpu"
    seq_lens: dict = field(default_factory=dict)  # seq_id -> number of tokens
    num_gpu_blocks: int = 0
    num_cpu_blocks: int = 0
    watermark_blocks: int = 0
    prefix_caching: bool = False
    prefix_stats: dict | None = None  # hits, misses, evictions, hit_rate
    group_tables: dict = field(default_factory=dict)  # hybrid v1: seq_id -> one table per KV cache group
    group_names: tuple = ()  # hybrid v1: each group's name ("full", "sliding 1024")
    null_block: int | None = None  # hybrid v1: the reserved block standing for skipped ones

    def device_blocks(self, device: str = "gpu") -> list[BlockState]:
        return [b for b in self.blocks if b.device == device]

    def free_block_ids(self, device: str = "gpu") -> list[int]:
        free = [b for b in self.device_blocks(device) if b.is_free]
        return [b.block_id for b in sorted(free, key=lambda b: b.free_position)]

    def sliding_blocks(self, named: bool) -> set:
        """Hybrid v1: the real blocks in sliding-window tables that hold a prefix-cache name (``named``) or none.
        A named one can serve a later request's hit; an unnamed one cannot, so when freed it goes to the head of
        the free queue (under vLLM 0.33's default retention most of a sliding group's blocks; a block still
        filling is unnamed in every mode)."""
        hashes = {b.block_id: b.block_hash for b in self.device_blocks("gpu")}
        return {block_id for tables in self.group_tables.values()
                for name, table in zip(self.group_names, tables) if name.startswith("sliding")
                for block_id in table if block_id != self.null_block and bool(hashes.get(block_id)) == named}

    def num_used(self, device: str = "gpu") -> int:
        """Blocks holding tokens (the null block is reserved, not used)."""
        null = self.null_block if device == "gpu" else None
        return sum(1 for b in self.device_blocks(device) if not b.is_free and b.block_id != null)

    @property
    def usage(self) -> float:
        return self.num_used("gpu") / self.num_gpu_blocks if self.num_gpu_blocks else 0.0

    @property
    def internal_fragmentation(self) -> float:
        """Empty slots inside used blocks, as a fraction of all slots in used blocks."""
        used = [b for b in self.blocks if not b.is_free]
        slots = len(used) * self.block_size
        return 1 - sum(b.num_tokens for b in used) / slots if slots else 0.0

    def render(self) -> str:
        return render_state(self)

    def __str__(self) -> str:
        return render_state(self)


def _fill_bar(num_tokens: int, block_size: int, width: int = 8) -> str:
    """``[####....]``: filled slots as '#', scaled to at most ``width`` characters."""
    cells = min(block_size, width)
    filled = round(num_tokens * cells / block_size)
    return "[" + "#" * filled + "." * (cells - filled) + "]"


def seq_name(seq_id) -> str:
    """How a sequence is written on a map: ``"A"``, or ``"beam.2"`` for sequence 2 of request ``"beam"``."""
    if isinstance(seq_id, tuple) and len(seq_id) == 2:
        return f"{seq_name(seq_id[0])}.{seq_id[1]}"
    return str(seq_id)


def _seq_label(seq_ids: tuple) -> str:
    return ",".join(seq_name(s) for s in seq_ids) or "-"


def render_state(state: ManagerState) -> str:
    """A text block map: one line per used block, then the free queue and the tables."""
    lines = [f"block_size={state.block_size}  GPU {state.num_used('gpu')}/{state.num_gpu_blocks} "
             f"blocks used ({state.usage:.0%})"
             + (f"  CPU {state.num_used('cpu')}/{state.num_cpu_blocks} used" if state.num_cpu_blocks else "")]
    for device in ("gpu", "cpu"):
        used = [b for b in state.device_blocks(device) if not b.is_free]
        if not used:
            continue
        lines.append(f"  {device.upper()} block  ref  tokens      seqs")
        for b in used:
            if device == "gpu" and b.block_id == state.null_block:
                lines.append(f"  {b.block_id:>9}    -  null block (stands for blocks that left a sliding window)")
                continue
            cached = f"  hash {b.block_hash[:8]}" if b.block_hash else ""
            lines.append(f"  {b.block_id:>9}  {b.ref_count:>3}  {_fill_bar(b.num_tokens, state.block_size)}"
                         f" {b.num_tokens:>2}/{state.block_size:<2} {_seq_label(b.seq_ids)}{cached}")
    free = state.free_block_ids("gpu")
    cached_free = {b.block_id for b in state.device_blocks("gpu") if b.is_free and b.block_hash}
    shown = " ".join(f"{i}*" if i in cached_free else str(i) for i in free[:24])
    more = f" ... (+{len(free) - 24})" if len(free) > 24 else ""
    lines.append(f"  free GPU queue (next first): {shown or '(empty)'}{more}")
    if cached_free:
        lines.append("  (* = still holds a cached prefix block; evicted when handed out)")
    named = state.sliding_blocks(named=True) if state.prefix_caching else set()
    for seq_id, table in state.tables.items():
        device = state.seq_devices[seq_id]
        if seq_id in state.group_tables:  # hybrid v1: one table per KV cache group
            lines.append(f"  seq {seq_name(seq_id)} on {device}: {state.seq_lens.get(seq_id, '?')} tokens")
            width = max(len(name) for name in state.group_names)
            for name, group_table in zip(state.group_names, state.group_tables[seq_id]):
                shown = ", ".join("null" if b == state.null_block else f"{b}*" if b in named and
                                  name.startswith("sliding") else str(b) for b in group_table)
                lines.append(f"    {name:<{width}} -> [{shown}]")
            continue
        lines.append(f"  seq {seq_name(seq_id)} on {device}: {state.seq_lens.get(seq_id, '?')} tokens -> {table}")
    if state.group_tables and state.prefix_caching and any(n.startswith("sliding") for n in state.group_names):
        lines.append("  (sliding tables: * = named, a later request can hit it; unmarked = unnamed, freed to the "
                     "head of the free queue)")
    if state.prefix_stats is not None:
        s = state.prefix_stats
        lines.append(f"  prefix cache: {s['hits']} hits, {s['misses']} misses, "
                     f"{s['evictions']} evictions, hit rate {s['hit_rate']:.0%}")
    return "\n".join(lines)


@dataclass(frozen=True)
class ChunkState:
    """One chunk of a CPU offloading tier at the moment of the snapshot."""

    chunk_id: int
    block_hash: str  # the key: the hash of the GPU block it copies
    ready: bool  # its store completed (a lookup answers HIT, not HIT_PENDING)
    ref_count: int  # loads reading it now
    evict_position: int  # 0 = evicted first when the tier needs room


@dataclass(frozen=True)
class OffloadState:
    """Everything needed to draw a CPU offloading tier (``OffloadingConnector.snapshot()``)."""

    num_cpu_blocks: int
    block_size: int
    chunks: tuple  # ChunkState of every stored key, in chunk-id order
    num_stored: int = 0  # chunks stored so far (tokens: times block_size)
    num_loaded: int = 0
    num_evicted: int = 0

    def chunk_of(self, block_hash: str) -> int | None:
        return next((c.chunk_id for c in self.chunks if c.block_hash == block_hash), None)
