"""One KV cache group's block tables: full attention keeps every block, a sliding window gives old ones back.

vLLM 0.33: ``vllm/v1/core/single_type_kv_cache_manager.py`` (``SingleTypeKVCacheManager``,
``FullAttentionManager``, ``SlidingWindowManager``). Block tables hold block ids; a sliding group's table keeps its
length (position ``i`` is still block ``i`` of the request) but the blocks that left the window become the pool's
null block.

The sliding-window rules, as vLLM has them:

* **skipped tokens.** Before the token at position ``num_computed_tokens`` runs, the tokens it cannot see are
  ``get_num_skipped_tokens(n) = max(0, n - sliding_window + 1)``; the blocks wholly inside them are freed
  (``remove_skipped_blocks``, tail of that range first) and replaced by the null block.
* **allocation** counts only what the window still needs: skipped blocks are never allocated.
* **prefix hits** need only the last ``ceil((sliding_window - 1) / block_size)`` blocks before the hit point to be
  cached; ``find_longest_cache_hit`` searches from the right and stops at the first run that long.
* **retention** (``reachable_block_mask``): a sliding group *names* (hashes into the prefix cache) only the
  blocks a hit could end on. With ``prefix_cache_retention_interval=0`` (vLLM 0.33's default) that is the run of
  blocks just before each resume point, the prompt's replay boundary and the request's shared-prefix junction;
  ``None`` names every full block (dense); a positive interval adds a run before every multiple of it. An unnamed
  block goes to the head of the free queue when freed: nobody can hit it, so it is reused first.
"""

from __future__ import annotations

from .block_pool import BlockPool
from .kv_cache_interface import AttentionSpec, SlidingWindowSpec


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeKVCacheManager:
    """The block tables of one KV cache group; a full-attention group skips nothing."""

    def __init__(self, kv_cache_spec: AttentionSpec, block_pool: BlockPool, kv_cache_group_id: int):
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.req_to_blocks: dict = {}  # request_id -> its block ids in logical order (null for skipped ones)
        self.num_cached_block: dict = {}  # request_id -> how many of its leading blocks are named (or null)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens the next token cannot see; full attention sees them all."""
        return 0

    def get_num_blocks_to_allocate(self, request_id, num_tokens: int, new_computed_blocks: list,
                                   total_computed_tokens: int, max_blocks: int | None = None) -> int:
        """Free blocks needed so the request has slots for ``num_tokens`` tokens: new blocks for what its table
        and its hits do not cover (skipped blocks excepted), plus hits that must leave the free queue.
        ``max_blocks``: vLLM's admission cap (a sliding group never holds more)."""
        num_required = cdiv(num_tokens, self.block_size)
        if max_blocks is not None:
            num_required = min(num_required, max_blocks)
        num_held = len(self.req_to_blocks.get(request_id, ()))
        num_skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(num_required - max(num_skipped, len(new_computed_blocks) + num_held), 0)
        kept_hits = new_computed_blocks[max(0, num_skipped - num_held):]
        return num_new + sum(1 for b in kept_hits if self.block_pool.is_evictable(b))

    def add_local_computed_blocks(self, request_id, new_computed_blocks: list, num_computed_tokens: int) -> None:
        """A new request's prefix hits: the skipped ones as null blocks, the rest touched (ref count + 1)."""
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        kept = list(new_computed_blocks[num_skipped:])
        self.block_pool.touch(kept)
        self.req_to_blocks[request_id] = [self.block_pool.null_block] * num_skipped + kept
        self.num_cached_block[request_id] = len(self.req_to_blocks[request_id])

    def allocate_new_blocks(self, request_id, num_tokens: int) -> list[int]:
        """Fresh blocks so the table covers ``num_tokens`` tokens; returns them."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        new = self.block_pool.get_new_blocks(max(cdiv(num_tokens, self.block_size) - len(blocks), 0))
        blocks.extend(new)
        return new

    def cache_blocks(self, request, block_hashes: list, num_tokens: int, retention_interval: int | None = None, *,
                     replay_boundaries=()) -> None:
        """Name the blocks that are full once ``num_tokens`` tokens are computed, those the mask keeps (vLLM 0.33:
        ``SingleTypeKVCacheManager.cache_blocks``). The resume points: ``replay_boundaries`` and the request's
        shared-prefix junction (``request.shared_prefix_boundary``, 0 for none)."""
        if self.block_pool.prefix_caches is None:
            return
        start = self.num_cached_block.get(request.request_id, 0)
        end = min(num_tokens // self.block_size, len(block_hashes))
        if end <= start:
            return
        boundaries = [*replay_boundaries]
        if request.shared_prefix_boundary:
            boundaries.append(request.shared_prefix_boundary)
        block_mask = self.reachable_block_mask(start, end, self.kv_cache_spec, retention_interval, boundaries)
        self.block_pool.cache_full_blocks(self.kv_cache_group_id, self.req_to_blocks[request.request_id],
                                          block_hashes, start, end, block_mask)
        self.num_cached_block[request.request_id] = end

    @classmethod
    def reachable_block_mask(cls, start_block: int, end_block: int, kv_cache_spec: AttentionSpec,
                             retention_interval: int | None, reachable_boundaries) -> list[bool] | None:
        """Which of blocks ``start_block .. end_block - 1`` to name; None names them all (full attention)."""
        return None

    def remove_skipped_blocks(self, request_id, num_computed_tokens: int) -> list[int]:
        """Free the blocks wholly before the next token's window, tail of that range first, and put the null block
        in their place. Returns the freed block ids, in the order they were freed."""
        blocks = self.req_to_blocks.get(request_id)
        num_skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        if not blocks or num_skipped <= 0:
            return []
        freed = []
        for i in range(min(num_skipped, len(blocks)) - 1, -1, -1):  # backwards, as vLLM iterates
            if blocks[i] == self.block_pool.null_block:
                break  # everything before it was freed in an earlier step
            freed.append(blocks[i])
            blocks[i] = self.block_pool.null_block
        self.block_pool.free_blocks(freed)
        return freed

    def free(self, request_id) -> list[int]:
        """Give back the request's blocks, last block first (leading null blocks are not blocks)."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        real = [b for b in blocks if b != self.block_pool.null_block]
        self.block_pool.free_blocks(reversed(real))
        return real

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: list, max_length: int, group_ids: list, block_pool: BlockPool,
                               kv_cache_spec: AttentionSpec) -> tuple[list[list[int]], int]:
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    """Every block stays until the request finishes."""

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, block_pool, kv_cache_spec):
        """The longest run of cached blocks from the start (a miss ends it: hashes are chained)."""
        hits = [[] for _ in group_ids]
        for block_hash in block_hashes[:max_length // kv_cache_spec.block_size]:
            cached = block_pool.get_cached_block(block_hash, group_ids)
            if cached is None:
                break
            for group_hits, block_id in zip(hits, cached):
                group_hits.append(block_id)
        return hits, len(hits[0]) * kv_cache_spec.block_size


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Blocks that slid out of the window go back to the pool while the request still runs."""

    def __init__(self, kv_cache_spec: SlidingWindowSpec, block_pool: BlockPool, kv_cache_group_id: int):
        super().__init__(kv_cache_spec, block_pool, kv_cache_group_id)
        self.sliding_window = kv_cache_spec.sliding_window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """With window 4 and 7 tokens computed, token 7 sees tokens 4..7: tokens 0..3 are skipped."""
        return max(0, num_computed_tokens - self.sliding_window + 1)

    @classmethod
    def reachable_block_mask(cls, start_block, end_block, kv_cache_spec, retention_interval, reachable_boundaries):
        """Name a block only if some hit can end on the run it belongs to (vLLM 0.33:
        ``SlidingWindowManager.reachable_block_mask``, without EAGLE's extra block). A hit at token ``t`` (a
        multiple of the block size) needs the ``need`` blocks just before it. ``None``: a hit may end at any block,
        so every block is named. ``0``: only at the given boundaries (each floored to a block). A positive
        interval: also at every multiple of it.

        A window of 1 needs no block (``need == 0``): nothing is ever named, so the group never serves a hit. No
        real model has such a window; vLLM's mask does this, so pagedkv's does too."""
        block_size = kv_cache_spec.block_size
        need = cdiv(kv_cache_spec.sliding_window - 1, block_size)
        mask = [False] * (end_block - start_block)
        segment_tokens = block_size if retention_interval is None else retention_interval or None
        if segment_tokens is not None:  # a run before every segment boundary
            per_segment = segment_tokens // block_size
            if need >= per_segment:
                return None  # the runs cover every block
            for i in range(start_block, end_block):
                mask[i - start_block] = i % per_segment >= per_segment - need
        if retention_interval is not None:  # and a run before each resume point
            for boundary in reachable_boundaries:
                end = boundary // block_size
                for j in range(max(start_block, end - need), min(end_block, end)):
                    mask[j - start_block] = True
        return mask

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, block_pool, kv_cache_spec):
        """Search from the right for ``ceil((sliding_window - 1) / block_size)`` cached blocks in a row: a hit up
        to their end needs nothing before them (null blocks stand there). A shorter run that reaches block 0 is a
        hit too."""
        block_size = kv_cache_spec.block_size
        needed = cdiv(kv_cache_spec.sliding_window - 1, block_size)
        max_num_blocks = max_length // block_size
        hits = [[block_pool.null_block] * max_num_blocks for _ in group_ids]
        run = 0
        for i in range(max_num_blocks - 1, -1, -1):
            cached = block_pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                run = 0
                continue
            for group_hits, block_id in zip(hits, cached):
                group_hits[i] = block_id
            run += 1
            if run >= needed:
                for group_hits in hits:
                    del group_hits[i + run:]  # the blocks after the run are not part of the hit
                return hits, (i + run) * block_size
        for group_hits in hits:  # no run long enough: only a run from block 0 counts
            del group_hits[run:]
        return hits, run * block_size


def get_manager_for_kv_cache_spec(kv_cache_spec: AttentionSpec, block_pool: BlockPool,
                                  kv_cache_group_id: int) -> SingleTypeKVCacheManager:
    manager_class = SlidingWindowManager if isinstance(kv_cache_spec, SlidingWindowSpec) else FullAttentionManager
    return manager_class(kv_cache_spec, block_pool, kv_cache_group_id)
