"""Layer 4 — the block space manager: one block table per sequence.

The manager never touches K/V data.  It decides *which* physical block holds
each logical block of each sequence, and returns the copies the cache must do
(copy-on-write, swap).  It follows vLLM v0's ``vllm/core/block_manager_v1.py``
(fork, copy-on-write, swap, watermark) with vLLM v1's prefix caching
(``vllm/v1/core/kv_cache_manager.py``: chained hashes, an LRU free queue).

Every method checks everything first and only then changes state, so a call
that raises leaves the manager exactly as it was.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from numbers import Real

from .blocks import BlockAllocator
from .errors import (
    DuplicateSequenceError,
    EmptyPromptError,
    NoFreeBlocksError,
    PagedKVValueError,
    UnknownSequenceError,
    WrongDeviceError,
)
from .prefix import PrefixCache, hash_block_tokens
from .sizing import blocks_needed
from .state import BlockState, ManagerState
from .validate import check_choice, check_hashable, check_int, check_token_ids

DEVICES = ("gpu", "cpu")


class AllocStatus(enum.Enum):
    """Answer of ``can_allocate`` (vLLM: ``vllm/core/interfaces.py``)."""

    OK = "ok"  # allocate now
    LATER = "later"  # not enough free blocks now; wait for others to finish
    NEVER = "never"  # the prompt can never fit in this pool


@dataclass(slots=True)
class _Sequence:
    token_ids: list
    block_table: list
    device: str = "gpu"
    block_hashes: list = field(default_factory=list)  # one per full block (prefix caching only)
    num_cached_tokens: int = 0


class BlockSpaceManager:
    """Maps each sequence's logical blocks to physical blocks on the GPU or CPU."""

    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int = 0,
                 watermark: float = 0.01, enable_prefix_caching: bool = False, unnamed_blocks_first: bool = False):
        """``unnamed_blocks_first``: with prefix caching, a freed block that has no name goes to the *front* of
        the free queue, to be reused before any cached block (newer vLLM's order); by default every freed
        block joins the tail, as in vLLM v1's first versions."""
        if isinstance(watermark, bool) or not isinstance(watermark, Real) or not 0 <= watermark < 1:
            raise PagedKVValueError(f"watermark must be a number in [0, 1) (the fraction of GPU blocks kept free "
                                    f"for appends; vLLM's default is 0.01), got {watermark!r}.")
        for name, value in (("enable_prefix_caching", enable_prefix_caching),
                            ("unnamed_blocks_first", unnamed_blocks_first)):
            if not isinstance(value, bool):
                raise PagedKVValueError(f"{name} must be True or False, got {value!r}.")
        for name, value, minimum in (("block_size", block_size, 1), ("num_gpu_blocks", num_gpu_blocks, 0),
                                     ("num_cpu_blocks", num_cpu_blocks, 0)):
            check_int(name, value, minimum)
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.allocators = {"gpu": BlockAllocator(num_gpu_blocks, block_size),
                           "cpu": BlockAllocator(num_cpu_blocks, block_size)}
        self.prefix_cache = PrefixCache() if enable_prefix_caching else None
        self.unnamed_blocks_first = bool(unnamed_blocks_first)
        self._seqs: dict = {}

    # ------------------------------------------------------------------ queries
    @property
    def enable_prefix_caching(self) -> bool:
        return self.prefix_cache is not None

    @property
    def num_free_gpu_blocks(self) -> int:
        return self.allocators["gpu"].num_free_blocks

    @property
    def num_free_cpu_blocks(self) -> int:
        return self.allocators["cpu"].num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of GPU blocks in use (cached-but-free blocks count as free)."""
        total = self.num_total_gpu_blocks
        return (total - self.num_free_gpu_blocks) / total if total else 0.0

    @property
    def seq_ids(self) -> list:
        return list(self._seqs)

    def has_seq(self, seq_id) -> bool:
        return seq_id in self._seqs

    def get_block_table(self, seq_id) -> list[int]:
        return list(self._get(seq_id).block_table)

    def get_token_ids(self, seq_id) -> list[int]:
        return list(self._get(seq_id).token_ids)

    def get_num_tokens(self, seq_id) -> int:
        return len(self._get(seq_id).token_ids)

    def get_device(self, seq_id) -> str:
        return self._get(seq_id).device

    def get_slot_mapping(self, seq_id) -> list[int]:
        """Physical slot of every token: ``table[pos // block_size] * block_size + pos % block_size``."""
        seq, bs = self._get(seq_id), self.block_size
        return [seq.block_table[pos // bs] * bs + pos % bs for pos in range(len(seq.token_ids))]

    def free_block_ids(self, device: str = "gpu") -> list[int]:
        """Free blocks of ``device`` in the order they will be handed out."""
        return self._allocator(device).free_block_ids()

    def refcount(self, block_id: int, device: str = "gpu") -> int:
        return self._allocator(device).refcount(block_id)

    def num_cached_tokens(self, seq_id) -> int:
        """Prompt tokens whose K/V came from the prefix cache (0 without caching)."""
        return self._get(seq_id).num_cached_tokens

    def count_cached_tokens(self, token_ids) -> int:
        """Tokens of a prompt not yet allocated whose K/V the prefix cache holds (0 without caching).

        Read only: what ``num_cached_tokens`` would say after ``allocate``.  vLLM v1 calls
        this ``get_computed_blocks`` (``vllm/v1/core/kv_cache_manager.py``).
        """
        return len(self._blocks_to_take(list(token_ids))[1]) * self.block_size

    @property
    def prefix_stats(self) -> dict | None:
        return self.prefix_cache.stats.as_dict() if self.prefix_cache else None

    # ------------------------------------------------------------- allocation
    def can_allocate(self, prompt) -> AllocStatus:
        """The scheduler's admission test, keeping ``watermark_blocks`` free for appends.

        ``prompt`` is a number of tokens or the token ids themselves.  Given the ids,
        with prefix caching on, only the blocks the prompt would really take count:
        fresh blocks, plus cached blocks that must leave the free queue.  (vLLM v0's
        ``block_manager_v1.can_allocate`` counts every block, hits included.)
        NEVER depends on the prompt's own size: it holds that many distinct blocks.
        """
        if isinstance(prompt, (int, Real)) or prompt is None:  # a number of tokens (bools and floats refused)
            num_tokens = check_int("num_tokens", prompt, minimum=1)
            taken = blocks_needed(num_tokens, self.block_size)
        else:
            tokens = check_token_ids("prompt", prompt)
            num_tokens, taken = len(tokens), sum(self._blocks_to_take(tokens)[2:])
        if self.num_total_gpu_blocks - blocks_needed(num_tokens, self.block_size) < self.watermark_blocks:
            return AllocStatus.NEVER
        if self.num_free_gpu_blocks - taken >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, seq_id, token_ids) -> list[int]:
        """Give a new sequence a block table for its prompt; returns the table.

        With prefix caching, the prompt's leading full blocks that are already
        cached (in use or waiting in the free queue) are shared instead of filled again.
        """
        check_hashable("seq_id", seq_id)
        if seq_id in self._seqs:
            raise DuplicateSequenceError(
                f"sequence {seq_id!r} already exists; free it first or pick a new id.")
        tokens = check_token_ids("token_ids", token_ids, allow_empty=True)
        if not tokens:
            raise EmptyPromptError(
                f"sequence {seq_id!r} has an empty prompt; a sequence needs at least one token.")
        hashes, hits, num_new, revived = self._blocks_to_take(tokens)
        self._require_free("gpu", num_new + revived, f"allocate sequence {seq_id!r} ({len(tokens)} tokens)")

        gpu = self.allocators["gpu"]
        for block_id in hits:
            gpu.incref(block_id)
        table = hits + [self._allocate_gpu_block() for _ in range(num_new)]
        seq = _Sequence(tokens, table, num_cached_tokens=len(hits) * self.block_size)
        if self.prefix_cache:
            self.prefix_cache.stats.hits += len(hits)
            self.prefix_cache.stats.misses += len(hashes) - len(hits)
            seq.block_hashes = hashes
            self._register_full_blocks(seq, start=len(hits))
        self._seqs[seq_id] = seq
        return list(table)

    def can_append_slots(self, seq_id, num_tokens: int = 1) -> bool:
        return self.num_blocks_to_append(seq_id, num_tokens) <= self.allocators["gpu"].num_free_blocks

    def num_blocks_to_append(self, seq_id, num_tokens: int = 1) -> int:
        """GPU blocks that appending ``num_tokens`` takes now: fresh ones, plus a copy of a shared last block."""
        fresh, copy = self._blocks_for_append(self._get(seq_id), check_int("num_tokens", num_tokens, minimum=0))
        return fresh + copy

    def append_slots(self, seq_id, token_ids) -> list[tuple[int, int]]:
        """Make room for new tokens; returns the copy-on-write copies ``(src, dst)`` to perform.

        A partly filled last block that other sequences share is copied to a
        private block first; a full last block needs no copy, the new tokens
        simply start a fresh block.  Most appends (every running sequence, every
        step) just fill a slot of a private last block: no block, no copy.
        """
        seq = self._get(seq_id)
        if seq.device != "gpu":
            self._require_device(seq_id, seq, "gpu", "append to it")
        tokens = check_token_ids("token_ids", token_ids, allow_empty=True)
        room = len(seq.block_table) * self.block_size - len(seq.token_ids)  # empty slots of its last block
        if len(tokens) <= room and self.allocators["gpu"].blocks[seq.block_table[-1]].ref_count == 1:
            copies = []  # the common case: the tokens fill slots of a private last block
        else:
            copies = self._take_blocks_for_append(seq_id, seq, len(tokens))
        seq.token_ids += tokens
        if self.prefix_cache:
            start = len(seq.block_hashes)
            seq.block_hashes = self._full_block_hashes(seq.block_hashes, seq.token_ids)
            self._register_full_blocks(seq, start)
        return copies

    def _take_blocks_for_append(self, seq_id, seq: _Sequence, num_tokens: int) -> list:
        """Copy a shared, partly filled last block to a private one; add the fresh blocks the tokens need."""
        fresh, copy = self._blocks_for_append(seq, num_tokens)
        self._require_free("gpu", fresh + copy, f"append {num_tokens} tokens to sequence {seq_id!r}")
        copies = []
        if copy:
            src = seq.block_table[-1]
            dst = self._allocate_gpu_block()
            self.allocators["gpu"].free(src)
            seq.block_table[-1] = dst
            copies.append((src, dst))
        for _ in range(fresh):
            seq.block_table.append(self._allocate_gpu_block())
        return copies

    def fork(self, parent_seq_id, child_seq_id) -> None:
        """The child shares every block of the parent; each block's ref count goes up by one."""
        parent = self._get(parent_seq_id)
        check_hashable("child_seq_id", child_seq_id)
        if child_seq_id in self._seqs:
            raise DuplicateSequenceError(
                f"cannot fork into {child_seq_id!r}: that sequence already exists; pick a new id.")
        allocator = self.allocators[parent.device]
        for block_id in parent.block_table:
            allocator.incref(block_id)
        self._seqs[child_seq_id] = _Sequence(
            list(parent.token_ids), list(parent.block_table), parent.device,
            list(parent.block_hashes), parent.num_cached_tokens)

    def free(self, seq_id, tail_first: bool = True) -> None:
        """Release the sequence's blocks tail first, so shared prefixes stay cached longest (vLLM 0.33's
        ``SingleTypeKVCacheManager.free`` frees in reverse order too). ``tail_first=False`` frees them head first,
        the wrong order, kept so notebook 04 can show what it costs."""
        seq = self._get(seq_id)
        allocator = self.allocators[seq.device]
        named = self.prefix_cache.block_to_hash if self.prefix_cache and seq.device == "gpu" else {}
        for block_id in (reversed(seq.block_table) if tail_first else seq.block_table):
            allocator.free(block_id, to_front=self.unnamed_blocks_first and block_id not in named)
        del self._seqs[seq_id]

    # ------------------------------------------------------------------- swap
    def can_swap_out(self, seq_id) -> bool:
        return self.can_swap_out_group([seq_id])

    def swap_out(self, seq_id) -> list[tuple[int, int]]:
        """Move the sequence to CPU blocks; returns ``(gpu_block, cpu_block)`` copies to perform."""
        return self.swap_out_group([seq_id])

    def can_swap_in(self, seq_id) -> bool:
        return self.can_swap_in_group([seq_id])

    def swap_in(self, seq_id) -> list[tuple[int, int]]:
        """Move the sequence back to GPU blocks; returns ``(cpu_block, gpu_block)`` copies."""
        return self.swap_in_group([seq_id])

    # A sequence group (the samples or beams of one request) swaps as one, as vLLM v0's block manager does:
    # a block its sequences share moves once and keeps its ref count on the other side.
    def num_group_blocks(self, seq_ids) -> int:
        """Distinct blocks the sequences hold (a block they share counts once)."""
        return len({b for seq_id in seq_ids for b in self._get(seq_id).block_table})

    def can_swap_out_group(self, seq_ids) -> bool:
        on_gpu = all(self._get(s).device == "gpu" for s in seq_ids)
        return on_gpu and self.num_group_blocks(seq_ids) <= self.num_free_cpu_blocks

    def can_swap_in_group(self, seq_ids) -> bool:
        on_cpu = all(self._get(s).device == "cpu" for s in seq_ids)
        return on_cpu and self.num_free_gpu_blocks - self.num_group_blocks(seq_ids) >= self.watermark_blocks

    def swap_out_group(self, seq_ids) -> list[tuple[int, int]]:
        """Move the sequences to CPU blocks together; ``(gpu_block, cpu_block)`` copies, one per distinct block."""
        return self._swap(list(seq_ids), "gpu", "cpu")

    def swap_in_group(self, seq_ids) -> list[tuple[int, int]]:
        """Move the sequences back to GPU blocks together; ``(cpu_block, gpu_block)`` copies."""
        return self._swap(list(seq_ids), "cpu", "gpu")

    def _swap(self, seq_ids: list, src: str, dst: str) -> list[tuple[int, int]]:
        seqs = [self._get(seq_id) for seq_id in seq_ids]
        for seq_id, seq in zip(seq_ids, seqs):
            self._require_device(seq_id, seq, src, f"swap it {'out' if src == 'gpu' else 'in'}")
        what = f"sequence {seq_ids[0]!r}" if len(seq_ids) == 1 else f"sequences {seq_ids}"
        self._require_free(dst, self.num_group_blocks(seq_ids), f"swap {what} to the {dst.upper()}")
        mapping: dict = {}  # src block -> dst block, shared by every sequence that holds it
        for seq in seqs:
            new_table = []
            for block_id in seq.block_table:
                if block_id in mapping:
                    self.allocators[dst].incref(mapping[block_id])
                elif dst == "gpu":
                    mapping[block_id] = self._allocate_gpu_block()
                else:
                    mapping[block_id] = self.allocators["cpu"].allocate()
                new_table.append(mapping[block_id])
            for block_id in reversed(seq.block_table):
                self.allocators[src].free(block_id)
            seq.block_table, seq.device = new_table, dst
            if dst == "gpu" and self.prefix_cache:
                self._register_full_blocks(seq, start=0)
        return list(mapping.items())

    # --------------------------------------------------------------- snapshot
    def snapshot(self) -> ManagerState:
        """Plain, immutable data describing every block and table right now."""
        users: dict = {}
        tokens_in: dict = {}
        for seq_id, seq in self._seqs.items():
            for i, block_id in enumerate(seq.block_table):
                key = (seq.device, block_id)
                users.setdefault(key, []).append(seq_id)
                tokens_in[key] = min(self.block_size, len(seq.token_ids) - i * self.block_size)
        named = self.prefix_cache.block_to_hash if self.prefix_cache else {}
        blocks = []
        for device in DEVICES:
            allocator = self.allocators[device]
            free_pos = {block_id: i for i, block_id in enumerate(allocator.free_block_ids())}
            for block_id in range(allocator.num_blocks):
                block_hash = named.get(block_id) if device == "gpu" else None
                num_tokens = tokens_in.get((device, block_id), self.block_size if block_hash else 0)
                blocks.append(BlockState(block_id, device, allocator.refcount(block_id),
                                         tuple(users.get((device, block_id), ())), num_tokens,
                                         block_hash, free_pos.get(block_id)))
        return ManagerState(
            block_size=self.block_size,
            blocks=tuple(blocks),
            tables={s: list(seq.block_table) for s, seq in self._seqs.items()},
            seq_devices={s: seq.device for s, seq in self._seqs.items()},
            seq_lens={s: len(seq.token_ids) for s, seq in self._seqs.items()},
            num_gpu_blocks=self.num_total_gpu_blocks,
            num_cpu_blocks=self.num_total_cpu_blocks,
            watermark_blocks=self.watermark_blocks,
            prefix_caching=self.enable_prefix_caching,
            prefix_stats=self.prefix_stats,
        )

    def __repr__(self) -> str:
        return (f"BlockSpaceManager(block_size={self.block_size}, num_gpu_blocks={self.num_total_gpu_blocks}, "
                f"num_cpu_blocks={self.num_total_cpu_blocks}, free_gpu={self.num_free_gpu_blocks}, "
                f"seqs={len(self._seqs)}, prefix_caching={self.enable_prefix_caching})")

    # ---------------------------------------------------------------- helpers
    def _get(self, seq_id) -> _Sequence:
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            known = list(self._seqs)[:10]
            raise UnknownSequenceError(
                f"unknown sequence {seq_id!r}; known sequences: {known}. "
                "Allocate it first (or check for a typo).") from None

    def _allocator(self, device: str) -> BlockAllocator:
        return self.allocators[check_choice("device", device, tuple(self.allocators))]

    def _require_free(self, device: str, needed: int, what: str) -> None:
        free = self.allocators[device].num_free_blocks
        if needed > free:
            total = self.num_total_gpu_blocks if device == "gpu" else self.num_total_cpu_blocks
            if needed > total:  # freeing cannot help: the pool itself is too small
                hint = (f"The whole {device.upper()} pool holds only {total} blocks: use a bigger pool ("
                        f"num_{device}_blocks) or fewer tokens.")
            elif device == "gpu":
                hint = "Free or swap out a sequence first, or use a bigger pool."
            else:
                hint = (f"The CPU pool holds {total} blocks: swap a sequence back in or free one, "
                        "or give the manager more num_cpu_blocks (vLLM: --swap-space).")
            raise NoFreeBlocksError(
                f"cannot {what}: needs {needed} free {device.upper()} blocks but only {free} are free. {hint}")

    @staticmethod
    def _require_device(seq_id, seq: _Sequence, device: str, action: str) -> None:
        if seq.device != device:
            hint = "swap it in first" if seq.device == "cpu" else "it is already on the GPU"
            raise WrongDeviceError(
                f"sequence {seq_id!r} is on the {seq.device.upper()}, so you cannot {action}; {hint}.")

    def _blocks_for_append(self, seq: _Sequence, num_tokens: int) -> tuple[int, int]:
        """``(fresh blocks, copy-on-write copies)`` that appending ``num_tokens`` tokens takes.

        Only a partly filled last block that other sequences share is copied (this runs for every running
        sequence in every step, hence the plain arithmetic).
        """
        bs, filled = self.block_size, len(seq.token_ids)
        fresh = (filled + num_tokens + bs - 1) // bs - len(seq.block_table)  # blocks_needed(...) - held
        if num_tokens == 0 or filled % bs == 0:  # nothing to add, or a full last block (or none): no copy
            return fresh, 0
        shared = self.allocators[seq.device].blocks[seq.block_table[-1]].ref_count > 1
        return fresh, int(shared)

    def _allocate_gpu_block(self) -> int:
        """A fresh GPU block from the queue's head; a cached name it still carries is evicted."""
        block_id = self.allocators["gpu"].allocate()
        if self.prefix_cache:
            self.prefix_cache.evict(block_id)
        return block_id

    def _blocks_to_take(self, tokens: list) -> tuple[list, list[int], int, int]:
        """``(hashes, cached hits, fresh blocks, revived hits)`` for a prompt; reads, changes nothing.

        A revived hit is a cached block waiting in the free queue: reusing it takes it out.
        """
        hashes = self._full_block_hashes([], tokens)
        hits = self._cached_prefix(tokens, hashes) if hashes else []
        gpu = self.allocators["gpu"]
        revived = sum(1 for b in hits if gpu.refcount(b) == 0)
        return hashes, hits, blocks_needed(len(tokens), self.block_size) - len(hits), revived

    def _full_block_hashes(self, known: list, tokens: list) -> list:
        """Chained hashes of every full block of ``tokens``, reusing the ``known`` ones."""
        if not self.prefix_cache:
            return []
        hashes, bs = list(known), self.block_size
        for i in range(len(hashes), len(tokens) // bs):
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, tokens[i * bs:(i + 1) * bs]))
        return hashes

    def _cached_prefix(self, tokens: list, hashes: list) -> list[int]:
        """Blocks holding the longest run of leading full blocks already cached."""
        hits, bs = [], self.block_size
        for i, block_hash in enumerate(hashes):
            parent = hashes[i - 1] if i else None
            block_id = self.prefix_cache.lookup(block_hash, parent, tokens[i * bs:(i + 1) * bs])
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _register_full_blocks(self, seq: _Sequence, start: int) -> None:
        bs = self.block_size
        for i in range(start, len(seq.block_hashes)):
            parent = seq.block_hashes[i - 1] if i else None
            self.prefix_cache.insert(seq.block_table[i], seq.block_hashes[i], parent,
                                     seq.token_ids[i * bs:(i + 1) * bs])
