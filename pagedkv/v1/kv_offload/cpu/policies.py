"""Which CPU chunk goes when the CPU tier is full (vLLM 0.33: ``vllm/v1/kv_offload/cpu/policies/lru.py``).

``"lru"`` is vLLM's default (``eviction_policy`` in the connector's extra config; ``"arc"`` is the other built-in
one, not reproduced here). 0.33's LRU orders chunks by a **rank**, and a chunk leaves the tier lowest rank first:

* a request gets one rank when the tier first hears of it; a chunk it stores or reuses while it runs is ranked
  ``(request rank, -end position)``, so within one request the **tail ranks below the head** (is evicted first);
* when the request finishes, its chunks are re-ranked newest of all, walking from its tail to its head, so the head
  (the prefix other requests share) ends most recent;
* only chunks no transfer holds (``ref_cnt == 0``) can go; a store never evicts a chunk of its own offer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ChunkStatus:
    """One CPU chunk (vLLM: ``ChunkStatus``): ``ref_cnt`` -1 while its store is in flight (not readable), then the
    number of loads reading it."""

    chunk_id: int
    ref_cnt: int = -1

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


class LRUCachePolicy:
    """Chunks by key, their ranks, and the evictable ones."""

    def __init__(self, cache_capacity: int):
        self.cache_capacity = cache_capacity
        self.chunks: dict = {}  # key -> ChunkStatus
        self.ranks: dict = {}  # key -> (rank, tie-break)
        self.evictable: set = set()
        self._next_rank = 0

    def _request_rank(self, req_context) -> int:
        rank = req_context.state.get(LRUCachePolicy)
        if rank is None:
            self._next_rank += 1
            rank = req_context.state[LRUCachePolicy] = self._next_rank
        return rank

    def get(self, key) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key, chunk: ChunkStatus, req_context) -> None:
        self.chunks[key] = chunk
        position = req_context.get_offload_key_position(key)
        if position is None:
            self._next_rank += 1
            self.ranks[key] = (self._next_rank, 0)
        else:
            self.ranks[key] = (self._request_rank(req_context), -position)

    def remove(self, key) -> None:
        del self.chunks[key]
        self.ranks.pop(key, None)
        self.evictable.discard(key)

    def on_request_access(self, keys, req_context) -> None:
        """A running request stored or reused these keys: rank them with the request (tails below heads)."""
        request_rank = self._request_rank(req_context)
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is None or key not in self.chunks:
                continue
            self.ranks[key] = max(self.ranks[key], (request_rank, -position))

    def on_request_finished(self, keys_head_to_tail: list, req_context) -> None:
        """The request's keys become the newest, the head newest of all."""
        for key in reversed(keys_head_to_tail):
            if key in self.chunks:
                self._next_rank += 1
                self.ranks[key] = (self._next_rank, 0)

    def mark_evictable(self, key) -> None:
        self.evictable.add(key)

    def mark_non_evictable(self, key) -> None:
        self.evictable.discard(key)

    def evict(self, n: int, protected: set) -> list | None:
        """The ``n`` lowest-ranked evictable chunks outside ``protected``, removed; None (nothing removed) if fewer
        than ``n`` can go."""
        candidates = sorted((self.ranks[k], k) for k in self.evictable if k not in protected)
        if len(candidates) < n:
            return None
        evicted = []
        for _, key in candidates[:n]:
            evicted.append((key, self.chunks[key]))
            self.remove(key)
        return evicted

    def order(self) -> list:
        """Every chunk's key, next to be evicted first (for drawing)."""
        return [k for _, k in sorted((rank, k) for k, rank in self.ranks.items())]
