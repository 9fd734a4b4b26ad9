import os
import subprocess
import sys

import pytest

from pagedkv import BlockSpaceManager, hash_block_tokens
from pagedkv.prefix import PrefixCache


def manager(num_blocks=10, block_size=16):
    return BlockSpaceManager(block_size, num_blocks, watermark=0.0, enable_prefix_caching=True)


PROMPT = list(range(100, 155))  # 55 tokens: 3 full blocks of 16 and 7 more
SECOND = PROMPT[:48] + [7, 7, 7, 7, 7]  # shares the first 48 tokens


def test_hash_is_stable_and_chained():
    h1 = hash_block_tokens(None, [1, 2, 3])
    assert h1 == hash_block_tokens(None, [1, 2, 3])
    other_process = subprocess.run(
        [sys.executable, "-c", "from pagedkv.prefix import hash_block_tokens as h; print(h(None, [1, 2, 3]))"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert other_process.stdout.strip() == h1  # unlike hash(), the same in every process
    assert hash_block_tokens(h1, [4]) != hash_block_tokens(None, [4])  # the parent is part of the name
    assert hash_block_tokens(None, [1, 2]) != hash_block_tokens(None, [2, 1])


def test_worked_example():
    m = manager()
    assert m.allocate("a", PROMPT) == [0, 1, 2, 3]
    assert m.num_cached_tokens("a") == 0
    assert m.allocate("b", SECOND) == [0, 1, 2, 4]
    assert m.num_cached_tokens("b") == 48
    assert [m.refcount(b) for b in range(5)] == [2, 2, 2, 1, 1]
    m.free("a")
    m.free("b")
    assert m.free_block_ids() == [5, 6, 7, 8, 9, 3, 4, 2, 1, 0]
    assert m.prefix_stats == {"hits": 3, "misses": 3, "evictions": 0, "hit_rate": 0.5}


def test_worked_example_continued_reuses_freed_blocks_and_evicts_from_the_head():
    m = manager()
    m.allocate("a", PROMPT)
    m.allocate("b", SECOND)
    m.free("a")
    m.free("b")
    # The cached prefix still sits in the free queue: a third request revives it.
    assert m.allocate("c", PROMPT[:32] + [5]) == [0, 1, 5]
    assert m.num_cached_tokens("c") == 32
    assert m.free_block_ids() == [6, 7, 8, 9, 3, 4, 2]
    # Need 7 fresh blocks: the queue's head goes first; block 2 (cached) is evicted last.
    m.allocate("d", [9] * (16 * 6 + 1))
    assert m.get_block_table("d") == [6, 7, 8, 9, 3, 4, 2]
    assert m.prefix_stats["evictions"] == 1  # only block 2 carried a hash
    assert 2 not in m.prefix_cache.block_to_hash


def test_a_changed_first_block_defeats_every_later_hit():
    m = manager()
    m.allocate("a", PROMPT)
    changed = [0] + PROMPT[1:]
    assert m.allocate("b", changed) == [4, 5, 6, 7]
    assert m.num_cached_tokens("b") == 0


def test_hits_stop_at_the_first_miss():
    m = manager()
    m.allocate("a", PROMPT)
    mixed = PROMPT[:16] + [0] * 16 + PROMPT[32:48]  # block 2 equals a's block 2 but its parent differs
    assert m.allocate("b", mixed) == [0, 4, 5]
    assert m.num_cached_tokens("b") == 16


def test_blocks_get_their_hash_when_they_fill_during_append():
    m = manager(block_size=4)
    m.allocate("a", [1, 2, 3])
    assert m.prefix_cache.block_to_hash == {}
    m.append_slots("a", [4, 5])
    assert m.prefix_cache.block_to_hash == {0: hash_block_tokens(None, [1, 2, 3, 4])}
    assert m.allocate("b", [1, 2, 3, 4, 9]) == [0, 2]
    assert m.num_cached_tokens("b") == 4


def test_freeing_tail_first_keeps_prefixes_longest():
    m = manager(num_blocks=4, block_size=2)
    m.allocate("a", [1, 2, 3, 4, 5, 6])
    m.free("a")
    assert m.free_block_ids() == [3, 2, 1, 0]
    m.allocate("b", [9, 9])  # takes block 3, the uncached one
    assert m.allocate("c", [1, 2, 3, 4, 8]) == [0, 1, 2]
    assert m.num_cached_tokens("c") == 4


def test_fork_and_copy_on_write_still_work_with_caching():
    m = manager(block_size=4)
    m.allocate("p", [1, 2, 3, 4, 5, 6])
    m.fork("p", "c")
    assert m.append_slots("c", [7]) == [(1, 2)]
    assert m.append_slots("p", [8, 9]) == []
    # p's second block is now full and cached; a new prompt with the same 8 tokens reuses both
    assert m.allocate("q", [1, 2, 3, 4, 5, 6, 8, 9, 0]) == [0, 1, 3]


def test_collision_guard_compares_the_tokens():
    cache = PrefixCache()
    cache.insert(5, "h", None, [1, 2])
    assert cache.lookup("h", None, [1, 2]) == 5
    assert cache.lookup("h", None, [9, 9]) is None  # same name, other content: a miss
    assert cache.lookup("h", "other-parent", [1, 2]) is None
    assert not cache.insert(6, "h", None, [1, 2])  # the name stays with block 5


def test_manager_survives_a_forced_collision(monkeypatch):
    import pagedkv.manager as mgr

    monkeypatch.setattr(mgr, "hash_block_tokens", lambda parent, tokens: "same")
    m = manager(block_size=2)
    m.allocate("a", [1, 2, 3])
    assert m.allocate("b", [4, 5, 6]) == [2, 3]  # every block "collides", none is reused
    assert m.num_cached_tokens("b") == 0


def test_stats_in_snapshot():
    m = manager()
    m.allocate("a", PROMPT)
    m.allocate("b", SECOND)
    s = m.snapshot()
    assert s.prefix_caching and s.prefix_stats["hits"] == 3
    assert {b.block_id for b in s.blocks if b.block_hash} == {0, 1, 2}
    assert "prefix cache: 3 hits, 3 misses" in str(s)
    m.free("a")
    m.free("b")
    s = m.snapshot()
    assert [b.num_tokens for b in s.blocks[:4]] == [16, 16, 16, 0]  # cached free blocks still hold tokens
    assert "2* 1* 0*" in str(s)


def test_without_caching_nothing_is_named():
    m = BlockSpaceManager(16, 10)
    m.allocate("a", PROMPT)
    assert m.allocate("b", SECOND) == [4, 5, 6, 7]
    assert m.prefix_stats is None and m.snapshot().prefix_stats is None


@pytest.mark.parametrize("n", [1, 15, 16, 17])
def test_exact_block_multiples(n):
    m = manager()
    m.allocate("a", list(range(n)))
    m.allocate("b", list(range(n)))
    assert m.num_cached_tokens("b") == (n // 16) * 16


def test_unnamed_blocks_can_go_to_the_front_of_the_free_queue():
    """Newer vLLM's order: a freed block with no name is reused before any cached one."""
    for first, expected in ((False, [3, 4, 5, 2, 1, 0]), (True, [2, 3, 4, 5, 1, 0])):
        m = BlockSpaceManager(4, 6, watermark=0.0, enable_prefix_caching=True, unnamed_blocks_first=first)
        m.allocate("r", range(10))  # blocks 0 and 1 full (named), block 2 partial (no name)
        m.free("r")
        assert m.free_block_ids() == expected
        m.allocate("s", range(8))  # the cached prefix still hits in both orders
        assert m.num_cached_tokens("s") == 8


def test_freeing_head_first_loses_the_prefix_tail_first_keeps():
    """The order of free() decides which names an unrelated request evicts (notebook 04, section 5)."""
    cached = {}
    for tail_first in (True, False):
        manager = BlockSpaceManager(block_size=4, num_gpu_blocks=6, watermark=0.0, enable_prefix_caching=True)
        manager.allocate("a", list(range(17)))
        manager.free("a", tail_first=tail_first)
        assert manager.free_block_ids()[-1] == (0 if tail_first else 4)  # the block freed last waits longest
        manager.allocate("x", [42] * 8)
        manager.free("x")
        manager.allocate("again", list(range(17)))
        cached[tail_first] = manager.num_cached_tokens("again")
    assert cached == {True: 16, False: 0}
