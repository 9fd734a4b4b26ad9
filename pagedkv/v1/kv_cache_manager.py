"""vLLM v1's KV cache manager, readable: a block list per request, slots for any number of new tokens.

vLLM 0.33 does this in ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager``: ``get_computed_blocks``,
``allocate_slots``, ``free``) over ``vllm/v1/core/block_pool.py`` (the free queue and the hash -> block map).
Here it runs over this repo's own pieces: ``BlockAllocator`` (ref counts, the free queue, ``blocks.py``)
and ``PrefixCache`` (chained block hashes, ``prefix.py``), gathered in ``block_pool.py``.

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
  not just its first chunk; a sliding-window group counts at most the blocks it can ever hold
  (``SlidingWindowSpec.max_admission_blocks_per_request``: its window plus ``max_in_flight_tokens``, one step's
  ``max_num_batched_tokens`` unless given; the engine gives two steps' with async scheduling, as vLLM 0.33).
* ``num_external_computed_tokens``: tokens a KV connector supplies after the prefix hit (a CPU tier's blocks, say)
  get fresh blocks like any new token, and count against the admission gate like them; with
  ``delay_cache_blocks`` (an asynchronous load) their blocks are named only once the load lands (``cache_blocks``).
* ``free`` returns blocks tail first: those with a hash join the tail of the free queue (reused last, so a
  cached prefix stays longest), those without go to the head (reused first), as ``BlockPool.free_blocks``.
* A hybrid model's layers fall into KV cache groups (``kv_cache_interface.py``), each with its own block table per
  request over one pool; a sliding-window group gives back the blocks that left the window while the request runs
  (``single_type_kv_cache_manager.py``), and the groups agree on one prefix hit (``kv_cache_coordinator.py``).
  With the default single full-attention group, everything is as it was.
* ``prefix_cache_retention_interval`` (vLLM 0.33's ``CacheConfig`` setting, ``vllm/config/cache.py``, copied into
  the ``KVCacheConfig`` by ``vllm/v1/core/kv_cache_planning.py``): which full blocks a sliding-window group names in
  the prefix cache. ``0``, the default, names only the blocks a later request can resume from: the ones before the
  prompt's replay boundary and before the request's shared-prefix junction (``shared_prefix_boundary``, set at
  each lookup). The rest stay unnamed and go to the head of the free queue when they leave the window, since no
  hit could use them. ``None`` names every full block (dense); a positive multiple of the block size adds a resume
  point at each multiple. Full-attention groups always name every full block.
"""

from __future__ import annotations

from ..errors import PagedKVValueError, UnknownSequenceError
from ..prefix import hash_block_tokens
from ..state import BlockState, ManagerState
from ..validate import check_int
from .kv_cache_coordinator import KVCacheCoordinator
from .kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec


class KVCacheManager:
    """The GPU blocks of every running request, and the prefix cache (on by default, as in vLLM v1).

    ``kv_cache_groups``: the model's KV cache groups (``get_kv_cache_groups``); None is one full-attention group.
    Block ids come as one list per request for a single group (as always), one list per group for several.
    """

    def __init__(self, block_size: int, num_gpu_blocks: int, enable_caching: bool = True,
                 kv_cache_groups: list[KVCacheGroupSpec] | None = None, max_num_batched_tokens: int | None = None,
                 prefix_cache_retention_interval: int | None = 0, max_in_flight_tokens: int | None = None):
        if not isinstance(enable_caching, bool):
            raise PagedKVValueError(f"enable_caching must be True or False, got {enable_caching!r}.")
        self.block_size = check_int("block_size", block_size, minimum=1)
        check_int("num_gpu_blocks", num_gpu_blocks, minimum=1)
        if kv_cache_groups is None:  # the manager needs only block_size; the page shape is the engine's business
            kv_cache_groups = [KVCacheGroupSpec((0,), FullAttentionSpec(block_size, 1, 1))]
        self.kv_cache_groups = _check_groups(kv_cache_groups, block_size, num_gpu_blocks)
        self.prefix_cache_retention_interval = _check_retention_interval(prefix_cache_retention_interval, block_size,
                                                                         self.kv_cache_groups)
        # vLLM's admission cap per group (sliding groups only): the tokens scheduled but not yet processed, one
        # step's budget unless given (vLLM: VllmConfig.max_in_flight_tokens, two steps' with async scheduling)
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_num_batched_tokens
        else:
            check_int("max_in_flight_tokens", max_in_flight_tokens, minimum=1)
        self.max_in_flight_tokens = max_in_flight_tokens
        self.max_admission_blocks = [
            g.kv_cache_spec.max_admission_blocks_per_request(max_in_flight_tokens, float("inf"))
            if g.sliding_window is not None and max_in_flight_tokens is not None else None
            for g in self.kv_cache_groups]
        self.coordinator = KVCacheCoordinator(self.kv_cache_groups, num_gpu_blocks, enable_caching,
                                              self.prefix_cache_retention_interval)
        self.block_pool = self.coordinator.block_pool
        self.num_slots: dict = {}  # request_id -> tokens its blocks have slots for
        self.req_to_hashes: dict = {}  # request_id -> (hash, parent, tokens) of its full blocks, grown as they fill

    @property
    def is_hybrid(self) -> bool:
        return len(self.kv_cache_groups) > 1

    @property
    def allocator(self):
        return self.block_pool.allocator

    @property
    def prefix_cache(self):
        """The first group's hash -> block map (the only group's, for a uniform model); None without caching."""
        return self.block_pool.prefix_caches[0] if self.block_pool.prefix_caches else None

    @property
    def req_to_blocks(self) -> dict:
        """The first group's tables (the only group's, for a uniform model)."""
        return self.coordinator.single_type_managers[0].req_to_blocks

    @property
    def null_block(self) -> int | None:
        """The reserved block that stands for a skipped one (only when a sliding group exists)."""
        return self.block_pool.null_block

    @property
    def num_gpu_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return self.allocator.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        """Blocks that hold some request's tokens, whatever their group (the null block is not counted)."""
        return self.block_pool.num_gpu_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.block_pool.num_gpu_blocks

    def get_block_ids(self, request_id):
        """The request's block table: a list for a single group, one list per group (a tuple) for several."""
        blocks = self.get_block_ids_by_group(request_id)
        return blocks if self.is_hybrid else blocks[0]

    def get_block_ids_by_group(self, request_id) -> tuple[list[int], ...]:
        try:
            if request_id in self.num_slots:
                return self.coordinator.get_blocks(request_id)
        except TypeError:
            pass
        raise UnknownSequenceError(f"request {request_id!r} holds no blocks; running ones: "
                                   f"{list(self.num_slots)[:8]}.")

    # ---------------------------------------------------------------- prefix hits
    def get_computed_blocks(self, request) -> tuple[list[int] | tuple, int]:
        """The longest cached prefix every group can serve, and the tokens it holds.

        At most ``num_tokens - 1`` tokens, in whole blocks (vLLM: ``max_cache_hit_length``). Changes no block;
        it records on the request its ``shared_prefix_boundary``: when one group hit more than all agree on, the
        end of that longer hit (the prefix this request shares with an earlier one), else 0. vLLM 0.33 returns it
        as a third value and its scheduler stores it on the request (``sched/scheduler.py``); pagedkv stores it
        here, so the lookup keeps its two values.
        """
        empty = tuple([] for _ in self.kv_cache_groups)
        if self.block_pool.prefix_caches is None:
            request.shared_prefix_boundary = 0
            return self._per_group(empty), 0
        hashes = self.block_hashes(request, request.num_tokens - 1)
        hits, num_tokens, num_uncached = self.coordinator.find_longest_cache_hit(hashes,
                                                                                 len(hashes) * self.block_size)
        request.shared_prefix_boundary = num_tokens + num_uncached if num_uncached else 0
        return self._per_group(hits), num_tokens

    def _per_group(self, blocks: tuple):
        return blocks if self.is_hybrid else blocks[0]

    def block_hashes(self, request, num_tokens: int) -> list[tuple]:
        """``(hash, parent hash, tokens)`` of each full block among the request's first ``num_tokens`` tokens, the
        names a lookup asks the pool for (``block_pool.get_cached_block``). vLLM keeps them on the request,
        ``request.block_hashes``; here a running request's are kept and extended."""
        hashes = self.req_to_hashes.get(request.request_id, []) if request.request_id in self.num_slots else []
        tokens, bs = request.all_token_ids, self.block_size
        for i in range(len(hashes), num_tokens // bs):
            parent = hashes[-1][0] if hashes else None
            block_tokens = tokens[i * bs:(i + 1) * bs]
            hashes.append((hash_block_tokens(parent, block_tokens), parent, block_tokens))
        return hashes[:num_tokens // bs]

    # ---------------------------------------------------------------- slots
    def can_fit_full_sequence(self, request, new_computed_block_ids=None, num_new_computed_tokens: int = 0) -> bool:
        """Whether the free blocks hold the request's whole sequence: all ``request.num_tokens`` (prompt, and
        outputs for a resumed request) less its prefix hit, counting the hit blocks it would revive from the
        free queue, and for a sliding group at most what it can ever hold (vLLM 0.33:
        ``KVCacheManager.allocate_slots(..., full_sequence_must_fit=True)``, the admission gate of
        ``scheduler_reserve_full_isl``). Reads only."""
        hits = self._hits_by_group(new_computed_block_ids)
        num_computed = request.num_computed_tokens + num_new_computed_tokens
        needed = self.coordinator.get_num_blocks_to_allocate(request.request_id, request.num_tokens, hits,
                                                             num_computed, self.max_admission_blocks)
        return needed <= self.num_free_blocks

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_block_ids=None, num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False, num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False, reserved_blocks: int = 0):
        """Slots for ``num_new_tokens`` after the request's computed tokens (and its new cache hits).

        ``num_new_tokens`` may include draft tokens (speculative decoding): they get slots like any token, but only
        tokens up to ``request.num_tokens`` are ever cached, never a draft that may be rejected (vLLM 0.33's
        "non-committable tokens" note). ``num_lookahead_tokens``: slots past those, for a drafter (EAGLE, a draft
        model) that writes K/V of its own guesses; n-gram passes 0.

        First a sliding group gives back the blocks that left the window (vLLM does this even when the call then
        fails: they are no longer needed either way). Returns the blocks newly taken from the free queue (a list,
        one per group for several), or None when there are not enough free blocks, or, with
        ``full_sequence_must_fit``, when ``can_fit_full_sequence`` says no; then nothing else changed.
        ``num_external_computed_tokens`` (a KV connector's, after the hit) need fresh blocks; ``delay_cache_blocks``
        leaves the new blocks unnamed (their K/V arrives later); ``reserved_blocks`` must stay free (vLLM 0.33's
        gate for an asynchronous load: the blocks admitted prefills still need).
        """
        check_int("num_new_tokens", num_new_tokens, minimum=0)
        check_int("num_lookahead_tokens", num_lookahead_tokens, minimum=0)
        hits = self._hits_by_group(new_computed_block_ids)
        request_id, coordinator = request.request_id, self.coordinator
        if full_sequence_must_fit and not self.can_fit_full_sequence(
                request, new_computed_block_ids, num_new_computed_tokens + num_external_computed_tokens):
            return None
        num_computed = request.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        # on the processed-token basis: a step in flight (async scheduling) still reads its own window
        coordinator.remove_skipped_blocks(request_id, max(0, num_computed - request.num_in_flight_tokens))
        num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens
        needed = coordinator.get_num_blocks_to_allocate(request_id, num_tokens_need_slot, hits, num_computed)
        if needed > self.num_free_blocks - reserved_blocks:
            return None
        is_new = request_id not in self.num_slots
        if is_new:
            coordinator.allocate_new_computed_blocks(request_id, hits, num_computed)
            if self.block_pool.prefix_caches is not None:
                num_hits = num_new_computed_tokens // self.block_size
                self.block_pool.stats.hits += num_hits
                self.block_pool.stats.misses += request.num_tokens // self.block_size - num_hits
        new = coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)
        self.num_slots[request_id] = num_computed + num_new_tokens
        if not delay_cache_blocks:
            self.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return self._per_group(new)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        """Name the request's blocks that are full within its first ``num_computed_tokens`` tokens, at most
        ``request.num_tokens`` (vLLM 0.33: ``KVCacheManager.cache_blocks``; its scheduler's ``update_from_output``
        calls it after a step's tokens arrive when speculation is on or placeholders were resolved (async))."""
        if self.block_pool.prefix_caches is None or request.request_id not in self.num_slots:
            return
        num_tokens = min(num_computed_tokens, request.num_tokens)
        hashes = self.req_to_hashes[request.request_id] = self.block_hashes(request, num_tokens)
        self.coordinator.cache_blocks(request, hashes, num_tokens)

    def _hits_by_group(self, new_computed_block_ids) -> tuple:
        if not new_computed_block_ids:
            return tuple([] for _ in self.kv_cache_groups)
        return tuple(new_computed_block_ids) if self.is_hybrid else (list(new_computed_block_ids),)

    def free(self, request) -> None:
        """Give the request's blocks back, group by group, last block first, so a shared prefix stays cached
        longest."""
        self.coordinator.free(request.request_id)
        self.num_slots.pop(request.request_id, None)
        self.req_to_hashes.pop(request.request_id, None)

    # ---------------------------------------------------------------- drawing
    def snapshot(self) -> ManagerState:
        """The same plain data as ``BlockSpaceManager.snapshot()``, so every drawing works on v1 too; a hybrid
        manager adds every group's tables (``group_tables``) and the null block."""
        users, filled = {}, {}
        group_tables = {r: self.coordinator.get_blocks(r) for r in self.num_slots}
        for request_id, tables in group_tables.items():
            for table in tables:
                for i, block_id in enumerate(table):
                    if block_id == self.null_block:
                        continue
                    users.setdefault(block_id, []).append(request_id)
                    filled[block_id] = max(0, min(self.block_size,  # a block kept past a rejected draft: 0
                                                  self.num_slots[request_id] - i * self.block_size))
        free_pos = {b: i for i, b in enumerate(self.allocator.free_block_ids())}
        caching = self.block_pool.prefix_caches is not None
        blocks = []
        for b in range(self.num_gpu_blocks):
            block_hash = self.block_pool.block_hash(b)
            blocks.append(BlockState(b, "gpu", self.allocator.refcount(b), tuple(users.get(b, ())),
                                     filled.get(b, self.block_size if block_hash else 0), block_hash,
                                     free_pos.get(b)))
        return ManagerState(block_size=self.block_size, blocks=tuple(blocks),
                            tables={r: list(t[0]) for r, t in group_tables.items()},
                            seq_devices={r: "gpu" for r in group_tables}, seq_lens=dict(self.num_slots),
                            num_gpu_blocks=self.num_gpu_blocks, prefix_caching=caching,
                            prefix_stats=self.block_pool.stats.as_dict() if caching else None,
                            group_tables={r: tuple(list(t) for t in tables) for r, tables in group_tables.items()}
                            if self.is_hybrid else {},
                            group_names=tuple(g.name for g in self.kv_cache_groups) if self.is_hybrid else (),
                            null_block=self.null_block)

    def __repr__(self) -> str:
        groups = f", groups={[g.name for g in self.kv_cache_groups]}" if self.is_hybrid else ""
        return (f"KVCacheManager(block_size={self.block_size}, num_gpu_blocks={self.num_gpu_blocks}, "
                f"free={self.num_free_blocks}, caching={self.block_pool.prefix_caches is not None}{groups})")


def _check_retention_interval(value, block_size: int, groups: list[KVCacheGroupSpec]) -> int | None:
    """vLLM 0.33: ``_validate_prefix_cache_retention_interval`` in ``kv_cache_coordinator.py``."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value % block_size:
        raise PagedKVValueError(f"prefix_cache_retention_interval={value!r}: use 0 (vLLM's default: a sliding "
                                "group names only the blocks a later request can resume from), None (every full "
                                f"block), or a positive multiple of block_size ({block_size}).")
    if value and all(g.sliding_window is None for g in groups):
        raise PagedKVValueError(f"prefix_cache_retention_interval={value}: this model has no sliding-window group, "
                                "so retention has no effect; set it to 0 (it applies only to sliding windows).")
    return value


def _check_groups(kv_cache_groups, block_size: int, num_gpu_blocks: int) -> list[KVCacheGroupSpec]:
    groups = list(kv_cache_groups) if hasattr(kv_cache_groups, "__iter__") else None
    if not groups or not all(isinstance(g, KVCacheGroupSpec) for g in groups):
        raise PagedKVValueError(f"kv_cache_groups must be a non-empty list of KVCacheGroupSpec (from "
                                f"get_kv_cache_groups), got {kv_cache_groups!r}.")
    layers = sorted(layer for g in groups for layer in g.layer_names)
    if layers != list(range(len(layers))):
        raise PagedKVValueError(f"kv_cache_groups hold layers {layers}: the groups must cover layers 0..n-1, each "
                                "exactly once (get_kv_cache_groups builds them from one spec per layer).")
    sizes = {g.kv_cache_spec.block_size for g in groups}
    if sizes != {block_size}:
        raise PagedKVValueError(f"kv_cache_groups have block sizes {sorted(sizes)} but block_size is {block_size}: "
                                "build the specs with the manager's block_size.")
    if any(g.sliding_window is not None for g in groups) and num_gpu_blocks < 2:
        raise PagedKVValueError(f"num_gpu_blocks={num_gpu_blocks}: a sliding-window group reserves one block as "
                                "the null block, so the pool needs at least 2.")
    return groups
