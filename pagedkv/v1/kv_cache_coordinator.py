"""The KV cache groups of a model over one block pool, made to agree on one prefix hit.

vLLM 0.33: ``vllm/v1/core/kv_cache_coordinator.py``, which has three classes (``KVCacheCoordinatorNoPrefixCache``,
``UnitaryKVCacheCoordinator`` for one group, ``HybridKVCacheCoordinator`` for several); one class does all three
here, since with one group the hybrid rules reduce to the unitary ones. Each call goes to every group's
single-type manager; the free-block count is summed over groups, because all of them draw on the same pool.

The prefix hit (``find_longest_cache_hit``): full-attention groups first (their hit is a plain run from the start,
and bounds the others), then every other group with that bound, again and again until no group shortens it: the
longest hit **every** group can serve. A full group can serve any shorter hit (its blocks are a prefix), so its
blocks are cut to the final length. The longest hit any one group gave on the way, less the agreed one, is a shared
prefix some sliding group has not named (``num_uncached_common_prefix_tokens``): the manager turns it into the
request's junction (``shared_prefix_boundary``), which ``cache_blocks`` then names.
"""

from __future__ import annotations

from .block_pool import BlockPool
from .kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec
from .single_type_kv_cache_manager import cdiv, get_manager_for_kv_cache_spec


def replay_boundaries(num_prompt_tokens: int) -> tuple[int, ...]:
    """Where a later request replaying this prompt resumes: a resend of the same prompt hits at most
    ``num_prompt_tokens - 1`` tokens (its last token runs again for logits). vLLM 0.33: ``replay_boundaries`` in
    ``kv_cache_coordinator.py``, which adds a second position for EAGLE."""
    return (num_prompt_tokens - 1,)


class KVCacheCoordinator:
    """Every KV cache group's manager over one :class:`BlockPool`."""

    def __init__(self, kv_cache_groups: list[KVCacheGroupSpec], num_gpu_blocks: int, enable_caching: bool,
                 retention_interval: int | None = 0):
        self.kv_cache_groups = list(kv_cache_groups)
        self.retention_interval = retention_interval  # checked by the manager (prefix_cache_retention_interval)
        block_size = self.kv_cache_groups[0].kv_cache_spec.block_size
        has_sliding = any(g.sliding_window is not None for g in self.kv_cache_groups)
        self.block_pool = BlockPool(num_gpu_blocks, block_size, enable_caching, len(self.kv_cache_groups),
                                    use_null_block=has_sliding)
        self.single_type_managers = tuple(get_manager_for_kv_cache_spec(g.kv_cache_spec, self.block_pool, i)
                                          for i, g in enumerate(self.kv_cache_groups))
        self.attention_groups = self._spec_groups()

    def _spec_groups(self) -> list[tuple]:
        """Groups with one spec looked up together, ``(spec, group ids, manager class)``, full attention first
        (vLLM: ``verify_and_split_kv_cache_groups``)."""
        by_spec: dict = {}
        for i, group in enumerate(self.kv_cache_groups):
            by_spec.setdefault(group.kv_cache_spec, []).append(i)
        spec_groups = [(spec, ids, type(self.single_type_managers[ids[0]])) for spec, ids in by_spec.items()]
        return sorted(spec_groups, key=lambda g: not isinstance(g[0], FullAttentionSpec))

    def find_longest_cache_hit(self, block_hashes: list, max_cache_hit_length: int) -> tuple[tuple, int, int]:
        """The hit blocks of every group, the hit length every group can serve (a fixed point), and
        ``num_uncached_common_prefix_tokens``: how much longer the longest one-group hit was."""
        hit_blocks = [None] * len(self.kv_cache_groups)
        hit_length, longest_hit_length = max_cache_hit_length, 0
        simple_hybrid = len(self.attention_groups) == 2 and isinstance(self.attention_groups[0][0],
                                                                       FullAttentionSpec)
        while True:
            curr = hit_length
            for spec, group_ids, manager_class in self.attention_groups:
                if isinstance(spec, FullAttentionSpec) and hit_blocks[group_ids[0]] is not None:
                    curr = min(curr, len(hit_blocks[group_ids[0]]) * spec.block_size)  # looked up once: a prefix
                    continue
                blocks, curr = manager_class.find_longest_cache_hit(block_hashes, curr, group_ids, self.block_pool,
                                                                    spec)
                for group_id, group_blocks in zip(group_ids, blocks):
                    hit_blocks[group_id] = group_blocks
                longest_hit_length = max(longest_hit_length, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple_hybrid:  # one full + one other kind: the second lookup is already the answer
                break
        for spec, group_ids, _ in self.attention_groups:
            if isinstance(spec, FullAttentionSpec):
                for group_id in group_ids:
                    del hit_blocks[group_id][cdiv(hit_length, spec.block_size):]
        return tuple(hit_blocks), hit_length, longest_hit_length - hit_length

    def remove_skipped_blocks(self, request_id, num_computed_tokens: int) -> list[list[int]]:
        return [m.remove_skipped_blocks(request_id, num_computed_tokens) for m in self.single_type_managers]

    def get_num_blocks_to_allocate(self, request_id, num_tokens: int, new_computed_blocks: tuple,
                                   total_computed_tokens: int, max_blocks=None) -> int:
        """Free blocks the groups need together. ``max_blocks``: a per-group cap (vLLM's admission cap)."""
        return sum(m.get_num_blocks_to_allocate(request_id, num_tokens, hits, total_computed_tokens,
                                                None if max_blocks is None else max_blocks[i])
                   for i, (m, hits) in enumerate(zip(self.single_type_managers, new_computed_blocks)))

    def allocate_new_computed_blocks(self, request_id, new_computed_blocks: tuple, num_computed_tokens: int) -> None:
        for manager, hits in zip(self.single_type_managers, new_computed_blocks):
            manager.add_local_computed_blocks(request_id, hits, num_computed_tokens)

    def allocate_new_blocks(self, request_id, num_tokens: int) -> tuple[list[int], ...]:
        return tuple(m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers)

    def cache_blocks(self, request, block_hashes: list, num_tokens: int) -> None:
        """Every group names its full blocks, a sliding one only those its retention keeps."""
        boundaries = replay_boundaries(len(request.prompt_token_ids))
        for manager in self.single_type_managers:
            manager.cache_blocks(request, block_hashes, num_tokens, self.retention_interval,
                                 replay_boundaries=boundaries)

    def free(self, request_id) -> None:
        """Group by group, each one's last block first (vLLM: ``KVCacheCoordinator.free``)."""
        for manager in self.single_type_managers:
            manager.free(request_id)

    def get_blocks(self, request_id) -> tuple[list[int], ...]:
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.single_type_managers)
