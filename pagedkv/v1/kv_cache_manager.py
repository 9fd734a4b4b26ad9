"""vLLM v1's KV cache manager, readable: a block list per request, slots for any number of new tokens.

vLLM 0.33 does this in ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager``: ``get_computed_blocks``,
``allocate_slots``, ``free``) over ``vllm/v1/core/block_pool.py`` (the free queue and the hash -> block map).
Here it runs over this repo's own pieces: ``BlockAllocator`` (ref counts, the free queue, ``blocks.py``)
and ``PrefixCache`` (chained block hashes, ``prefix.py``).

What changed since v0's ``BlockSpaceManager``:

* ``allocate_slots(request, num_new_tokens)`` reserves slots for a *number* of tokens, a prefill chunk or one
  decode token alike; it returns None when the pool cannot hold them, and then nothing changed. No watermark,
  no ``can_allocate``, no swap.
* Sharing is only through the prefix cache: full blocks, named by a hash, never written again. No request
  shares a partly filled block, so there is no copy-on-write.
* A prefix hit is capped at ``num_tokens - 1`` and rounded down to whole blocks: the model must run on at least
  one token to produce logits, so a fully cached prompt recomputes its whole last block.
* A block that fills with content already cached is cached too: a hash may name several blocks (0.33's
  block pool does not de-duplicate, says ``BlockHashToBlockMap``'s docstring, so block tables stay
  append-only), and the content stays cached until its last copy is evicted.
* ``full_sequence_must_fit``: the scheduler admits a waiting request only if its full input sequence fits
  (``can_fit_full_sequence``: ``request.num_tokens``, the prompt plus any outputs a resumed request has),
  not just its first chunk.
* ``free`` returns blocks tail first: those with a hash join the tail of the free queue (reused last, so a
  cached prefix stays longest), those without go to the head (reused first), as ``BlockPool.free_blocks``.
"""

from __future__ import annotations

from ..blocks import BlockAllocator
from ..errors import PagedKVValueError, UnknownSequenceError
from ..prefix import PrefixCache, hash_block_tokens
from ..state import BlockState, ManagerState
from ..validate import check_int


class KVCacheManager:
    """The GPU blocks of every running request, and the prefix cache (on by default, as in vLLM v1)."""

    def __init__(self, block_size: int, num_gpu_blocks: int, enable_caching: bool = True):
        if not isinstance(enable_caching, bool):
            raise PagedKVValueError(f"enable_caching must be True or False, got {enable_caching!r}.")
        self.block_size = check_int("block_size", block_size, minimum=1)
        self.allocator = BlockAllocator(check_int("num_gpu_blocks", num_gpu_blocks, minimum=1), block_size)
        self.prefix_cache = PrefixCache(duplicates=True) if enable_caching else None
        self.req_to_blocks: dict = {}  # request_id -> its block ids, logical order
        self.req_to_hashes: dict = {}  # request_id -> hashes of its full blocks (grows as they fill)
        self.num_slots: dict = {}  # request_id -> tokens its blocks have slots for

    @property
    def num_gpu_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    @property
    def usage(self) -> float:
        return 1 - self.num_free_blocks / self.num_gpu_blocks

    def get_block_ids(self, request_id) -> list[int]:
        try:
            return list(self.req_to_blocks[request_id])
        except (KeyError, TypeError):
            raise UnknownSequenceError(f"request {request_id!r} holds no blocks; running ones: "
                                       f"{list(self.req_to_blocks)[:8]}.") from None

    # ---------------------------------------------------------------- prefix hits
    def get_computed_blocks(self, request) -> tuple[list[int], int]:
        """The longest run of the request's leading full blocks already cached, and the tokens they hold.

        At most ``num_tokens - 1`` tokens, in whole blocks (vLLM: ``max_cache_hit_length``). Reads only.
        """
        if self.prefix_cache is None:
            return [], 0
        tokens, bs = request.all_token_ids, self.block_size
        hits, parent = [], None
        for i in range((request.num_tokens - 1) // bs):
            block_tokens = tokens[i * bs:(i + 1) * bs]
            block_hash = hash_block_tokens(parent, block_tokens)
            block_id = self.prefix_cache.lookup(block_hash, parent, block_tokens)
            if block_id is None:
                break
            hits.append(block_id)
            parent = block_hash
        return hits, len(hits) * bs

    # ---------------------------------------------------------------- slots
    def can_fit_full_sequence(self, request, new_computed_block_ids=None) -> bool:
        """Whether the free blocks hold the request's whole sequence: all ``request.num_tokens`` (prompt, and
        outputs for a resumed request) less its prefix hit, counting the hit blocks it would revive from the
        free queue (vLLM 0.33: ``KVCacheManager.allocate_slots(..., full_sequence_must_fit=True)``, the
        admission gate of ``scheduler_reserve_full_isl``). Reads only."""
        hits = list(new_computed_block_ids or [])
        return self._num_blocks_to_allocate(request, request.num_tokens, hits) <= self.num_free_blocks

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_block_ids=None, full_sequence_must_fit: bool = False) -> list[int] | None:
        """Slots for ``num_new_tokens`` after the request's computed tokens (and its new cache hits).

        Returns the blocks newly taken from the free queue, or None (and changes nothing) when there are
        not enough free blocks, or, with ``full_sequence_must_fit``, when ``can_fit_full_sequence`` says no.
        """
        check_int("num_new_tokens", num_new_tokens, minimum=0)
        hits = list(new_computed_block_ids or [])
        if full_sequence_must_fit and not self.can_fit_full_sequence(request, hits):
            return None
        num_slots = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        if self._num_blocks_to_allocate(request, num_slots, hits) > self.num_free_blocks:
            return None
        for block_id in hits:
            self.allocator.incref(block_id)
        if self.prefix_cache is not None and request.request_id not in self.req_to_blocks:
            self.prefix_cache.stats.hits += len(hits)
            self.prefix_cache.stats.misses += request.num_tokens // self.block_size - len(hits)
        blocks = self.req_to_blocks.get(request.request_id, []) + hits
        new = [self._allocate() for _ in range(-(-num_slots // self.block_size) - len(blocks))]
        self.req_to_blocks[request.request_id] = blocks + new
        self.num_slots[request.request_id] = num_slots
        self._cache_full_blocks(request, min(num_slots, request.num_tokens))
        return new

    def free(self, request) -> None:
        """Give the request's blocks back, last block first (vLLM 0.33: ``KVCacheManager.free`` and
        ``BlockPool.free_blocks``): blocks without a hash go to the head of the free queue, to be reused first;
        cached ones join the tail, so a shared prefix stays cached longest."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        named = self.prefix_cache.block_to_hash if self.prefix_cache is not None else {}
        self.allocator.free_blocks(reversed(blocks), reuse_first=lambda block_id: block_id not in named)
        self.req_to_hashes.pop(request.request_id, None)
        self.num_slots.pop(request.request_id, None)

    def _num_blocks_to_allocate(self, request, num_tokens: int, hits: list[int]) -> int:
        """Free blocks that slots for ``num_tokens`` would take: new ones, and cached hits waiting in the free
        queue (vLLM 0.33: ``get_num_blocks_to_allocate``)."""
        held = len(self.req_to_blocks.get(request.request_id, [])) + len(hits)
        revived = sum(1 for b in hits if self.allocator.refcount(b) == 0)
        return max(-(-num_tokens // self.block_size) - held, 0) + revived

    def _allocate(self) -> int:
        block_id = self.allocator.allocate()
        if self.prefix_cache is not None:  # a cached block leaving the free queue loses its name
            self.prefix_cache.evict(block_id)
        return block_id

    def _cache_full_blocks(self, request, num_tokens: int) -> None:
        """Name every block that will be full once ``num_tokens`` are computed (vLLM: ``cache_blocks``)."""
        if self.prefix_cache is None:
            return
        hashes, bs = self.req_to_hashes.setdefault(request.request_id, []), self.block_size
        tokens, blocks = request.all_token_ids, self.req_to_blocks[request.request_id]
        for i in range(len(hashes), num_tokens // bs):
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs]))
            self.prefix_cache.insert(blocks[i], hashes[-1], parent, tokens[i * bs:(i + 1) * bs])

    # ---------------------------------------------------------------- drawing
    def snapshot(self) -> ManagerState:
        """The same plain data as ``BlockSpaceManager.snapshot()``, so every drawing works on v1 too."""
        users, filled = {}, {}
        for request_id, blocks in self.req_to_blocks.items():
            for i, block_id in enumerate(blocks):
                users.setdefault(block_id, []).append(request_id)
                filled[block_id] = min(self.block_size, self.num_slots[request_id] - i * self.block_size)
        named = self.prefix_cache.block_to_hash if self.prefix_cache else {}
        free_pos = {b: i for i, b in enumerate(self.allocator.free_block_ids())}
        blocks = tuple(BlockState(b, "gpu", self.allocator.refcount(b), tuple(users.get(b, ())),
                                  filled.get(b, self.block_size if b in named else 0), named.get(b), free_pos.get(b))
                       for b in range(self.num_gpu_blocks))
        return ManagerState(block_size=self.block_size, blocks=blocks,
                            tables={r: list(b) for r, b in self.req_to_blocks.items()},
                            seq_devices={r: "gpu" for r in self.req_to_blocks}, seq_lens=dict(self.num_slots),
                            num_gpu_blocks=self.num_gpu_blocks, prefix_caching=self.prefix_cache is not None,
                            prefix_stats=self.prefix_cache.stats.as_dict() if self.prefix_cache else None)

    def __repr__(self) -> str:
        return (f"KVCacheManager(block_size={self.block_size}, num_gpu_blocks={self.num_gpu_blocks}, "
                f"free={self.num_free_blocks}, caching={self.prefix_cache is not None})")
