"""Layer 2 — physical blocks, their reference counts, and the free queue.

A *block* is a fixed-size page of KV cache.  The allocator hands blocks out
and takes them back; a block shared by several sequences (after a fork, or a
prefix-cache hit) carries a reference count and returns to the free queue only
when the last user lets go.

The free blocks wait in a doubly linked list (:class:`FreeBlockQueue`), as in
vLLM's ``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``): blocks
leave from the head, freed blocks join at the tail (or, as vLLM today (0.33)
does with blocks that hold no cached prefix, at the head), and a block that is
wanted again while still queued (a prefix-cache hit) can be pulled out of the
middle in O(1).  So the cached blocks wait least-recently-freed first: an LRU
order for free.
"""

from __future__ import annotations

from collections import Counter
from numbers import Integral

from .errors import DoubleFreeError, NoFreeBlocksError, PagedKVValueError
from .validate import check_int


class KVBlock:
    """Metadata of one physical block; the data lives in the cache tensors."""

    __slots__ = ("block_id", "ref_count", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.prev_free: KVBlock | None = None  # links, set only while in the free queue
        self.next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref_count={self.ref_count})"


class FreeBlockQueue:
    """A doubly linked list of free blocks with sentinel ends.

    ``popleft``, ``append``, ``appendleft`` and ``remove`` are all O(1): no list shifting, no search.
    """

    def __init__(self, blocks: list[KVBlock]):
        self._head = KVBlock(-1)  # sentinels: never handed out, never empty-checked
        self._tail = KVBlock(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev_free
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free_blocks += 1

    def appendleft(self, block: KVBlock) -> None:
        first = self._head.next_free
        self._head.next_free, block.prev_free = block, self._head
        block.next_free, first.prev_free = first, block
        self.num_free_blocks += 1

    def prepend_n(self, blocks: list[KVBlock]) -> None:
        """Put ``blocks`` at the head, keeping their order: ``blocks[0]`` is handed out next
        (vLLM 0.33: ``FreeKVCacheBlockQueue.prepend_n``)."""
        for block in reversed(blocks):
            self.appendleft(block)

    def popleft(self) -> KVBlock:
        if self.num_free_blocks == 0:
            raise NoFreeBlocksError("no free blocks are left; free a sequence or swap one out first.")
        block = self._head.next_free
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def __iter__(self):
        node = self._head.next_free
        while node is not self._tail:
            yield node
            node = node.next_free

    def __len__(self) -> int:
        return self.num_free_blocks


class BlockAllocator:
    """Hands out the blocks of one device pool and counts who uses each.

    ``allocate()`` gives the block at the head of the free queue with ref count 1;
    ``incref()`` adds a user (pulling the block out of the free queue if it was
    there); ``free()`` removes a user and queues the block at the tail once
    nobody uses it: first freed, first reused, as vLLM 0.10's ``vllm/v1/core/block_pool.py`` did for every
    block.  vLLM today (0.33) keeps that order only for blocks holding a cached prefix and puts the others at
    the head, last freed first reused (``BlockPool.free_blocks``; here ``free_blocks(..., reuse_first)``, which
    ``pagedkv.v1`` uses).  vLLM v0's allocators without prefix caching were last freed first reused too
    (``UncachedBlockAllocator`` in ``vllm/core/block_manager_v1.py`` pops and pushes at the end of a list;
    ``NaiveBlockAllocator`` uses ``popleft``/``appendleft``); with caching on, v0 kept freed named blocks in an
    LRU evictor instead.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = check_int("num_blocks", num_blocks, minimum=0)
        self.block_size = check_int("block_size", block_size, minimum=1)
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def allocate(self) -> int:
        """Take the block at the head of the free queue; its ref count becomes 1."""
        block = self.free_queue.popleft()
        block.ref_count = 1
        return block.block_id

    def incref(self, block_id: int) -> int:
        """One more user of ``block_id``; a free block is taken back out of the queue."""
        block = self._block(block_id)
        if block.ref_count == 0:
            self.free_queue.remove(block)
        block.ref_count += 1
        return block.ref_count

    def free(self, block_id: int, to_front: bool = False) -> int:
        """One user fewer; at 0 the block joins the tail of the free queue (the front if ``to_front``).

        Returns the new count.
        """
        block = self._block(block_id)
        self._check_freeable(block_id, 1)
        block.ref_count -= 1
        if block.ref_count == 0:
            (self.free_queue.appendleft if to_front else self.free_queue.append)(block)
        return block.ref_count

    def free_blocks(self, ordered_block_ids, reuse_first) -> None:
        """One user fewer for each block, given in the order they should be reused (vLLM 0.33:
        ``BlockPool.free_blocks``). Of the blocks nobody uses any more, those for which ``reuse_first(block_id)``
        is true go to the head of the free queue, the others to the tail, each group in the given order."""
        ordered_block_ids = list(ordered_block_ids)
        for block_id, count in Counter(ordered_block_ids).items():  # check all first: a failed call changes nothing
            self._check_freeable(block_id, count)
        first, last = [], []
        for block_id in ordered_block_ids:
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                (first if reuse_first(block_id) else last).append(block)
        self.free_queue.prepend_n(first)
        for block in last:
            self.free_queue.append(block)

    def _check_freeable(self, block_id: int, count: int) -> None:
        ref_count = self._block(block_id).ref_count
        if ref_count == 0:
            raise DoubleFreeError(
                f"block {block_id} is already free (ref count 0): each get_new_blocks() or touch() "
                "(allocate() or incref() on the allocator) is matched by exactly one free_blocks() (free())."
            )
        if ref_count < count:
            raise DoubleFreeError(f"block {block_id} has {ref_count} users but is freed {count} times: each "
                                  "get_new_blocks() or touch() (allocate() or incref() on the allocator) is matched "
                                  "by exactly one free_blocks() (free()).")

    def refcount(self, block_id: int) -> int:
        return self._block(block_id).ref_count

    def free_block_ids(self) -> list[int]:
        """The free blocks in the order ``allocate()`` will hand them out."""
        return [block.block_id for block in self.free_queue]

    def _block(self, block_id: int) -> KVBlock:
        if type(block_id) is int and 0 <= block_id < self.num_blocks:  # the common case, without ABC checks
            return self.blocks[block_id]
        if isinstance(block_id, bool) or not isinstance(block_id, Integral):
            raise PagedKVValueError(f"block ids are integers, got {block_id!r} ({type(block_id).__name__}).")
        if not self.num_blocks:
            raise PagedKVValueError(f"block id {block_id} does not exist: this pool has no blocks.")
        if not 0 <= block_id < self.num_blocks:
            raise PagedKVValueError(
                f"block id {block_id!r} is outside this pool of {self.num_blocks} blocks "
                f"(valid ids are 0..{self.num_blocks - 1})."
            )
        return self.blocks[int(block_id)]
