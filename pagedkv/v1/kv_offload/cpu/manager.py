"""The CPU tier's bookkeeping on the scheduler side (vLLM 0.33: ``vllm/v1/kv_offload/cpu/manager.py``,
``CPUOffloadingManager``).

It owns no K/V: only which key sits in which CPU chunk, whether its store has completed, how many loads read it, and
which chunk to evict (``policies.py``). The connector drives it in a fixed order each step:

* ``lookup(key)``: ``HIT``, ``HIT_PENDING`` (stored, not yet written) or ``MISS``;
* ``prepare_load(keys)``: pin the chunks a load will read (``ref_cnt + 1``) and return their chunk ids;
  ``complete_load`` unpins them;
* ``prepare_store(keys)``: for the keys not stored yet, take free chunks, evicting the least recently used
  unpinned ones if the tier is full (never one of the offered keys); returns None, storing nothing, if not enough
  can be evicted. The new chunks are not readable until ``complete_store``;
* ``on_request_finished``: the policy's recency update for a finished request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ....state import ChunkState, OffloadState
from ..base import LookupResult, PrepareStoreOutput
from .policies import ChunkStatus, LRUCachePolicy


@dataclass
class _RequestCacheAccess:
    """The keys one request stored or reused, in the order it first touched them."""

    keys: list = field(default_factory=list)
    seen: set = field(default_factory=set)
    finished: bool = False


class CPUOffloadingManager:
    """``num_chunks`` CPU chunks under an LRU policy; counts of what was stored, loaded and evicted."""

    def __init__(self, num_chunks: int):
        self.num_chunks = num_chunks
        self._num_allocated_chunks = 0
        self._free_list: list[int] = []
        self.policy = LRUCachePolicy(num_chunks)
        self.num_stored_chunks = 0  # chunks whose store was prepared (and so copied)
        self.num_loaded_chunks = 0  # chunks a load read
        self.num_evicted_chunks = 0
        self.num_failed_stores = 0  # prepare_store calls that could not make room

    # ------------------------------------------------------------ chunk pool
    def num_free_chunks(self) -> int:
        return len(self._free_list) + self.num_chunks - self._num_allocated_chunks

    def _allocate_chunks(self, n: int) -> list[ChunkStatus]:
        num_fresh = min(n, self.num_chunks - self._num_allocated_chunks)
        chunks = [ChunkStatus(self._num_allocated_chunks + i) for i in range(num_fresh)]
        self._num_allocated_chunks += num_fresh
        chunks += [ChunkStatus(self._free_list.pop()) for _ in range(n - num_fresh)]
        return chunks

    def _record_access(self, keys, req_context) -> None:
        state = req_context.state.setdefault(CPUOffloadingManager, _RequestCacheAccess())
        new = [k for k in keys if k not in state.seen]
        state.keys += new
        state.seen.update(new)
        if new:
            self.policy.on_request_access(new, req_context)

    # ------------------------------------------------------------ the interface
    def lookup(self, key, req_context=None) -> LookupResult:
        chunk = self.policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys, req_context) -> list[int]:
        chunks = []
        for key in keys:
            chunk = self.policy.get(key)
            assert chunk is not None and chunk.is_ready, f"chunk {key!r} is not ready to load"
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
            chunk.ref_cnt += 1
            chunks.append(chunk.chunk_id)
        self._record_access(keys, req_context)
        self.num_loaded_chunks += len(chunks)
        return chunks

    def complete_load(self, keys, req_context=None) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.policy.mark_evictable(key)

    def prepare_store(self, keys, req_context) -> PrepareStoreOutput | None:
        keys = list(keys)
        to_store = [k for k in keys if self.policy.get(k) is None]
        ready = [k for k in keys if self.policy.get(k) is not None and self.policy.get(k).is_ready]
        self._record_access([k for k in keys if k in set(to_store) | set(ready)], req_context)
        if not to_store:
            return PrepareStoreOutput([], [], [])
        num_to_evict = len(to_store) - self.num_free_chunks()
        evicted_keys = []
        if num_to_evict > 0:
            evicted = self.policy.evict(num_to_evict, protected=set(keys))
            if evicted is None:
                self.num_failed_stores += 1
                return None
            for key, chunk in evicted:
                self._free_list.append(chunk.chunk_id)
                evicted_keys.append(key)
            self.num_evicted_chunks += len(evicted_keys)
        chunks = self._allocate_chunks(len(to_store))
        for key, chunk in zip(to_store, chunks):
            self.policy.insert(key, chunk, req_context)
        self.num_stored_chunks += len(to_store)
        return PrepareStoreOutput(to_store, [c.chunk_id for c in chunks], evicted_keys)

    def complete_store(self, keys, req_context=None) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            if chunk is not None and not chunk.is_ready:
                chunk.ref_cnt = 0
                self.policy.mark_evictable(key)

    def on_request_finished(self, req_context) -> None:
        state = req_context.state.get(CPUOffloadingManager)
        if state is None or state.finished:
            return
        state.finished = True
        positions = {k: req_context.get_offload_key_position(k) for k in state.keys}
        keys = state.keys
        if None not in positions.values():
            keys = sorted(keys, key=positions.__getitem__)
        self.policy.on_request_finished(keys, req_context)

    # ------------------------------------------------------------ drawing
    def chunk_of(self, key) -> int | None:
        chunk = self.policy.get(key)
        return None if chunk is None else chunk.chunk_id

    def keys(self) -> list:
        """Every stored key, next to be evicted first."""
        return self.policy.order()

    def snapshot(self, block_size: int) -> OffloadState:
        """The tier as plain data: each chunk's key (the block hash), whether its store completed, its loads and
        its place in the eviction order."""
        order = {key: i for i, key in enumerate(self.keys())}
        chunks = sorted((ChunkState(c.chunk_id, key[0], c.is_ready, max(c.ref_cnt, 0), order[key])
                         for key, c in self.policy.chunks.items()), key=lambda c: c.chunk_id)
        return OffloadState(self.num_chunks, block_size, tuple(chunks), self.num_stored_chunks,
                            self.num_loaded_chunks, self.num_evicted_chunks)
