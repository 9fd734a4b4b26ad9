"""One pool of blocks for every KV cache group: the free queue, the prefix-cache names, and the null block.

vLLM 0.33: ``vllm/v1/core/block_pool.py`` (``BlockPool``: ``get_new_blocks``, ``touch``, ``free_blocks``,
``get_cached_block``, ``cache_full_blocks``, ``null_block``). Here it runs over this repo's ``BlockAllocator``
(ref counts, the free queue) and one ``PrefixCache`` per group: vLLM keys its hash -> block map by
``(block hash, group id)``, since the same tokens name one block in every group.

The **null block** is a reserved block id that stands in a sliding-window group's table for a block that left the
window: never allocated, never freed, never counted in use. vLLM always reserves block 0 for it; pagedkv reserves
it only when a sliding group exists, so a full-attention-only manager keeps every block it had.
"""

from __future__ import annotations

from ..blocks import BlockAllocator
from ..errors import NoFreeBlocksError
from ..prefix import PrefixCache, PrefixCacheStats
from ..state import BlockState, ManagerState


class BlockPool:
    """The blocks of one device shared by ``num_groups`` KV cache groups."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool, num_groups: int = 1,
                 use_null_block: bool = False):
        self.allocator = BlockAllocator(num_gpu_blocks, block_size)
        self.enable_caching = enable_caching
        self.stats = PrefixCacheStats()
        self.prefix_caches = [PrefixCache(duplicates=True) for _ in range(num_groups)] if enable_caching else None
        for cache in self.prefix_caches or ():
            cache.stats = self.stats  # one count for the whole pool
        self.null_block = self.allocator.allocate() if use_null_block else None  # block 0, held forever

    @property
    def num_gpu_blocks(self) -> int:
        """Blocks that can hold tokens (the null block is not one of them)."""
        return self.allocator.num_blocks - (self.null_block is not None)

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Blocks from the head of the free queue; a cached block handed out loses its name. Too few free blocks:
        an error, and nothing taken (vLLM 0.33 raises ``ValueError``; ``NoFreeBlocksError`` is one)."""
        if num_blocks > self.num_free_blocks:
            raise NoFreeBlocksError(f"cannot get {num_blocks} free blocks from the pool: {self.num_free_blocks} are "
                                    "free; ask allocate_slots, which returns None instead, or free a request first.")
        new = []
        for _ in range(num_blocks):
            block_id = self.allocator.allocate()
            for cache in self.prefix_caches or ():
                cache.evict(block_id)
            new.append(block_id)
        return new

    def touch(self, block_ids) -> None:
        """One more user of each block (a prefix hit); a free one leaves the free queue."""
        for block_id in block_ids:
            if block_id != self.null_block:
                self.allocator.incref(block_id)

    def free_blocks(self, ordered_block_ids) -> None:
        """One user fewer of each block, in eviction order (the first is evicted first); the null block is
        skipped. Blocks nobody uses any more go to the head of the free queue if they hold no cached prefix
        (reused first), else to its tail (kept longest), each kind in the given order."""
        real = [b for b in ordered_block_ids if b != self.null_block]
        self.allocator.free_blocks(real, reuse_first=lambda block_id: self.block_hash(block_id) is None)

    def is_evictable(self, block_id: int) -> bool:
        """A cached block waiting in the free queue: a hit on it takes a free block."""
        return block_id != self.null_block and self.allocator.refcount(block_id) == 0

    def get_cached_block(self, block_hash, group_ids) -> list[int] | None:
        """The block named ``block_hash`` (``(hash, parent, tokens)``) in each group, or None if any misses."""
        found = []
        for group_id in group_ids:
            block_id = self.prefix_caches[group_id].lookup(*block_hash)
            if block_id is None:
                return None
            found.append(block_id)
        return found

    def cache_full_blocks(self, group_id: int, block_ids: list[int], block_hashes: list, start: int,
                          end: int, block_mask: list[bool] | None = None) -> None:
        """Name blocks ``start .. end - 1`` of a group's table by their hashes; null blocks stay nameless, and so
        do those ``block_mask`` (one flag per block from ``start``; None: all) leaves out."""
        for i in range(start, end):
            if block_ids[i] != self.null_block and (block_mask is None or block_mask[i - start]):
                block_hash, parent, tokens = block_hashes[i]
                self.prefix_caches[group_id].insert(block_ids[i], block_hash, parent, tokens)

    def block_hash(self, block_id: int) -> str | None:
        """The name a block holds in any group, or None."""
        for cache in self.prefix_caches or ():
            if block_id in cache.block_to_hash:
                return cache.block_to_hash[block_id]
        return None

    def snapshot(self) -> ManagerState:
        """The pool alone, for drawing: every block's ref count and place in the free queue, and no tables (a pool
        knows which blocks are in use, not by whom; ``KVCacheManager.snapshot()`` adds the requests). pagedkv's
        addition: vLLM's ``BlockPool`` has no snapshot."""
        free_pos = {b: i for i, b in enumerate(self.allocator.free_block_ids())}
        blocks = tuple(BlockState(b, "gpu", self.allocator.refcount(b), (), 0, self.block_hash(b), free_pos.get(b))
                       for b in range(self.allocator.num_blocks))
        return ManagerState(block_size=self.allocator.block_size, blocks=blocks, tables={}, seq_devices={},
                            num_gpu_blocks=self.allocator.num_blocks, prefix_caching=self.enable_caching,
                            null_block=self.null_block)
