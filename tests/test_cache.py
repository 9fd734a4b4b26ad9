import pytest
import torch

from pagedkv import (
    CacheEngine,
    DuplicateSequenceError,
    NoFreeBlocksError,
    PagedKVCache,
    PagedKVError,
    ShapeError,
    WrongDeviceError,
)

H, D = 2, 4  # kv heads, head size


def kv(n, start=0.0):
    """n tokens of recognisable K/V: token t has every entry equal to start + t (V negated)."""
    k = (torch.arange(n, dtype=torch.float32) + start).view(n, 1, 1).expand(n, H, D).contiguous()
    return k, -k


# ------------------------------------------------------------------ CacheEngine


def test_engine_shapes():
    e = CacheEngine(num_gpu_blocks=5, block_size=4, num_kv_heads=H, head_size=D, num_cpu_blocks=2)
    assert e.key_cache.shape == (5, 4, H, D) and e.value_cache.shape == (5, 4, H, D)
    assert e.pools["cpu"][0].shape == (2, 4, H, D)


def test_write_puts_token_i_at_its_slot_and_skips_minus_one():
    e = CacheEngine(4, 4, H, D)
    k, v = kv(3, start=1)
    e.write([5, -1, 14], k, v)
    assert torch.all(e.key_cache[1, 1] == 1) and torch.all(e.key_cache[3, 2] == 3)
    assert torch.all(e.value_cache[3, 2] == -3)
    assert e.key_cache.abs().sum() == (1 + 3) * H * D  # the skipped token went nowhere


def test_copy_blocks_and_swap():
    e = CacheEngine(4, 2, H, D, num_cpu_blocks=2)
    k, v = kv(4, start=1)
    e.write([0, 1, 2, 3], k, v)
    e.copy_blocks([(0, 2), (1, 3)])  # all at once: reads happen before writes
    assert torch.equal(e.key_cache[2], e.key_cache[0]) and torch.equal(e.value_cache[3], e.value_cache[1])
    e.swap("gpu", "cpu", [(3, 0)])
    assert torch.equal(e.pools["cpu"][0][0], e.key_cache[3])
    e.swap("cpu", "gpu", [(0, 0)])
    assert torch.equal(e.key_cache[0], e.key_cache[3])


def test_copy_blocks_reads_before_writing():
    e = CacheEngine(3, 1, H, D)
    k, v = kv(3, start=1)
    e.write([0, 1, 2], k, v)
    e.copy_blocks([(0, 1), (1, 2)])  # block 2 gets block 1's *old* content
    assert e.key_cache[:, 0, 0, 0].tolist() == [1, 1, 2]


def test_engine_errors():
    e = CacheEngine(2, 2, H, D)
    k, v = kv(2)
    before = e.key_cache.clone()
    with pytest.raises(ShapeError, match="expected"):
        e.write([0, 1], k[:, :1], v[:, :1])
    with pytest.raises(ShapeError, match="dtype"):
        e.write([0, 1], k.half(), v.half())
    with pytest.raises(ShapeError, match=r"\(2, 2, 4\)"):
        e.write([0, 1, 2], k, v)
    with pytest.raises(ValueError, match="slots 0..3"):
        e.write([0, 4], k, v)
    with pytest.raises(ValueError, match="outside the gpu pool"):
        e.copy_blocks([(0, 2)])
    with pytest.raises(ValueError, match="pool"):
        e.swap("gpu", "disk", [(0, 0)])
    assert torch.equal(e.key_cache, before)


# ------------------------------------------------------------------ PagedKVCache


def make(**kw):
    args = dict(num_gpu_blocks=8, block_size=4, num_kv_heads=H, head_size=D, num_cpu_blocks=4)
    args.update(kw)
    return PagedKVCache(**args)


def test_gather_returns_what_was_written():
    c = make()
    k, v = kv(6)
    assert c.add_sequence("a", k, v) == [0, 1]
    gk, gv = c.gather("a")
    assert torch.equal(gk, k) and torch.equal(gv, v)
    k2, v2 = kv(1, start=100)
    c.append("a", k2[0], v2[0])  # one token as [num_kv_heads, head_size]
    gk, gv = c.gather("a")
    assert torch.equal(gk, torch.cat([k, k2])) and torch.equal(gv, torch.cat([v, v2]))


def test_fork_then_copy_on_write_keeps_both_branches_right():
    c = make()
    k, v = kv(6)
    c.add_sequence("p", k, v)
    c.fork("p", "c")
    assert torch.equal(c.gather("c")[0], k)  # the child inherits the parent's tokens
    kc, vc = kv(1, start=50)
    assert c.append("c", kc, vc) == [(1, 2)]  # copy-on-write of the shared partial block
    kp, vp = kv(1, start=70)
    assert c.append("p", kp, vp) == []
    assert torch.equal(c.gather("c")[0], torch.cat([k, kc]))
    assert torch.equal(c.gather("p")[0], torch.cat([k, kp]))
    assert [e.kind for e in c.events] == ["allocate", "fork", "copy_on_write", "append", "append"]
    assert "copies 1->2" in c.format_events()


def test_swap_out_and_in_preserve_contents():
    c = make()
    k, v = kv(7)
    c.add_sequence("a", k, v)
    c.swap_out("a")
    with pytest.raises(WrongDeviceError, match="swap_in"):
        c.gather("a")
    c.add_sequence("b", *kv(16, start=10))  # reuse the GPU blocks a released
    c.swap_in("a")
    gk, gv = c.gather("a")
    assert torch.equal(gk, k) and torch.equal(gv, v)


def test_prefix_caching_through_the_facade_shares_blocks():
    c = make(enable_prefix_caching=True)
    tokens = list(range(10))
    k, v = kv(10)
    c.add_sequence("a", k, v, token_ids=tokens)
    c.add_sequence("b", k, v, token_ids=tokens[:8] + [99, 98])
    assert c.manager.num_cached_tokens("b") == 8
    assert c.manager.get_block_table("b")[:2] == c.manager.get_block_table("a")[:2]
    assert torch.equal(c.gather("b")[0], k)
    with pytest.raises(ValueError, match="token_ids"):
        c.add_sequence("c", k, v)


def assert_unchanged(c, call, error, match):
    state, keys, values = c.snapshot(), c.key_cache.clone(), c.value_cache.clone()
    with pytest.raises(error, match=match) as info:
        call()
    assert isinstance(info.value, PagedKVError)
    assert c.snapshot() == state
    assert torch.equal(c.key_cache, keys) and torch.equal(c.value_cache, values)


def test_bad_input_changes_nothing():
    c = make(num_gpu_blocks=3, num_cpu_blocks=2)
    c.add_sequence("a", *kv(6))
    k, v = kv(1)
    assert_unchanged(c, lambda: c.append("a", k[:, :1], v[:, :1]), ShapeError, "expected")
    assert_unchanged(c, lambda: c.append("a", k.double(), v.double()), ShapeError, "dtype")
    assert_unchanged(c, lambda: c.add_sequence("b", *kv(9)), NoFreeBlocksError, "needs 3 free")
    assert_unchanged(c, lambda: c.fork("a", "a"), DuplicateSequenceError, "already exists")
    assert_unchanged(c, lambda: c.append("a", *kv(1), token_id=[1, 2]), ValueError, "token ids")
    c.swap_out("a")
    c.add_sequence("b", *kv(12))  # fills the GPU pool
    assert_unchanged(c, lambda: c.swap_in("a"), NoFreeBlocksError, "free GPU blocks")
    assert_unchanged(c, lambda: c.gather("a"), WrongDeviceError, "swapped out")
    assert_unchanged(c, lambda: c.gather("zz"), KeyError, "unknown sequence")


def test_block_tables_for_the_kernel():
    c = make()
    c.add_sequence("a", *kv(6))
    c.add_sequence("b", *kv(1))
    tables, lens = c.block_tables(["a", "b"])
    assert tables.dtype == torch.int32 and tables.tolist() == [[0, 1], [2, 0]]
    assert lens.tolist() == [6, 1]
