import pytest

from pagedkv import (
    AllocStatus,
    BlockSpaceManager,
    DuplicateSequenceError,
    EmptyPromptError,
    NoFreeBlocksError,
    PagedKVError,
    WrongDeviceError,
)


def make(num_gpu=8, num_cpu=4, block_size=4, **kw):
    return BlockSpaceManager(block_size, num_gpu, num_cpu, **kw)


def test_can_allocate_follows_the_watermark_rule():
    m = BlockSpaceManager(16, num_gpu_blocks=100, watermark=0.01)  # watermark_blocks = 1
    assert m.can_allocate(16 * 100) is AllocStatus.NEVER  # 100 - 100 < 1
    assert m.can_allocate(16 * 99) is AllocStatus.OK  # 100 free - 99 >= 1
    m.allocate("a", range(16 * 50))
    assert m.can_allocate(16 * 49) is AllocStatus.OK
    assert m.can_allocate(16 * 50) is AllocStatus.LATER
    assert m.can_allocate(16 * 99) is AllocStatus.LATER


def test_allocate_returns_the_table_and_slot_mapping():
    m = make()
    assert m.allocate(0, range(6)) == [0, 1]
    assert m.get_block_table(0) == [0, 1]
    assert m.get_slot_mapping(0) == [0, 1, 2, 3, 4, 5]
    assert m.allocate(1, range(3)) == [2]
    assert m.get_slot_mapping(1) == [8, 9, 10]
    assert m.num_free_gpu_blocks == 5 and m.usage == 3 / 8
    assert m.num_cached_tokens(0) == 0


def test_slot_mapping_follows_a_scattered_table():
    m = make()
    m.allocate("x", range(2))
    m.allocate("y", range(5))  # blocks 1, 2
    m.free("x")  # block 0 goes to the back of the queue
    m.append_slots("y", range(4))  # 9 tokens: needs block 3
    assert m.get_block_table("y") == [1, 2, 3]
    assert m.get_slot_mapping("y") == [4, 5, 6, 7, 8, 9, 10, 11, 12]


def test_append_into_own_partial_block_needs_no_new_block():
    m = make()
    m.allocate(0, range(5))
    assert m.append_slots(0, [9, 9, 9]) == []
    assert m.get_block_table(0) == [0, 1] and m.get_num_tokens(0) == 8
    assert m.append_slots(0, [9]) == []  # the last block is full: a fresh block, no copy
    assert m.get_block_table(0) == [0, 1, 2]


def test_fork_shares_every_block():
    m = make()
    m.allocate("p", range(6))
    m.fork("p", "c")
    assert m.get_block_table("c") == [0, 1]
    assert [m.refcount(b) for b in (0, 1)] == [2, 2]
    assert m.num_free_gpu_blocks == 6


def test_copy_on_write_when_appending_into_a_shared_partial_block():
    m = make()
    m.allocate("p", range(6))
    m.fork("p", "c")
    assert m.can_append_slots("c")
    copies = m.append_slots("c", [7])
    assert copies == [(1, 2)]  # block 1 is copied into the fresh block 2
    assert m.get_block_table("c") == [0, 2] and m.get_block_table("p") == [0, 1]
    assert m.refcount(1) == 1 and m.refcount(2) == 1 and m.refcount(0) == 2
    assert m.append_slots("p", [8]) == []  # the parent now owns block 1 alone


def test_shared_full_last_block_gets_a_fresh_block_without_copy():
    m = make()
    m.allocate("p", range(8))
    m.fork("p", "c")
    assert m.append_slots("c", [1]) == []
    assert m.get_block_table("c") == [0, 1, 2]
    assert m.refcount(1) == 2


def test_append_across_several_blocks_with_copy_on_write():
    m = make()
    m.allocate("p", range(3))
    m.fork("p", "c")
    assert m.append_slots("c", range(7)) == [(0, 1)]  # copy first, then a fresh block
    assert m.get_block_table("c") == [1, 2, 3] and m.get_num_tokens("c") == 10


def test_can_append_slots_counts_the_copy():
    m = make(num_gpu=2)
    m.allocate("p", range(3))
    m.fork("p", "c")
    assert m.can_append_slots("c", 1)  # one block for the copy
    assert not m.can_append_slots("c", 6)  # copy + a second block, only one free


def test_free_releases_the_table_tail_first():
    m = make(num_gpu=4)
    m.allocate(0, range(12))
    m.free(0)
    assert m.free_block_ids() == [3, 2, 1, 0]
    assert not m.has_seq(0)


def test_free_of_a_forked_sequence_keeps_shared_blocks():
    m = make()
    m.allocate("p", range(6))
    m.fork("p", "c")
    m.free("p")
    assert m.get_block_table("c") == [0, 1] and m.refcount(0) == 1
    assert m.num_free_gpu_blocks == 6


def test_swap_out_and_in():
    m = make(num_gpu=4, num_cpu=4)
    m.allocate("a", range(6))
    m.allocate("b", range(3))
    assert m.can_swap_out("a")
    assert m.swap_out("a") == [(0, 0), (1, 1)]
    assert m.get_device("a") == "cpu" and m.get_block_table("a") == [0, 1]
    assert m.num_free_cpu_blocks == 2 and m.num_free_gpu_blocks == 3
    assert m.free_block_ids() == [3, 1, 0] and m.free_block_ids("cpu") == [2, 3]
    assert m.can_swap_in("a") and not m.can_swap_out("a")
    assert m.swap_in("a") == [(0, 3), (1, 1)]
    assert m.get_device("a") == "gpu" and m.get_block_table("a") == [3, 1]
    assert m.num_free_cpu_blocks == 4


def test_can_swap_in_keeps_the_watermark():
    m = BlockSpaceManager(4, num_gpu_blocks=10, num_cpu_blocks=10, watermark=0.2)  # 2 blocks
    m.allocate("a", range(16))
    m.swap_out("a")
    m.allocate("b", range(16))
    assert m.can_swap_in("a")  # 6 free - 4 >= 2
    m.allocate("c", range(1))
    assert not m.can_swap_in("a")  # 5 free - 4 < 2


def test_snapshot_is_plain_data():
    m = make(num_gpu=4, num_cpu=2)
    m.allocate("p", range(6))
    m.fork("p", "c")
    m.append_slots("c", [1])
    m.swap_out("p")
    s = m.snapshot()
    assert s.block_size == 4 and s.tables == {"p": [0, 1], "c": [0, 2]}
    assert s.seq_devices == {"p": "cpu", "c": "gpu"} and s.seq_lens == {"p": 6, "c": 7}
    gpu = {b.block_id: b for b in s.blocks if b.device == "gpu"}
    assert (gpu[0].ref_count, gpu[0].seq_ids, gpu[0].num_tokens) == (1, ("c",), 4)
    assert gpu[2].num_tokens == 3 and gpu[2].free_position is None
    assert gpu[1].free_position == 1 and gpu[1].ref_count == 0 and gpu[1].block_hash is None
    cpu = [b for b in s.blocks if b.device == "cpu"]
    assert [b.seq_ids for b in cpu] == [("p",), ("p",)]
    assert s.free_block_ids("gpu") == m.free_block_ids("gpu")
    s.tables["p"].append(99)  # a snapshot is a copy: the manager does not change
    assert m.get_block_table("p") == [0, 1]
    with pytest.raises(AttributeError):
        s.block_size = 8


def test_snapshot_renders_a_text_block_map():
    m = make()
    m.allocate("p", range(6))
    m.fork("p", "c")
    text = str(m.snapshot())
    assert "GPU 2/8 blocks used" in text
    assert "seq p on gpu: 6 tokens -> [0, 1]" in text
    assert "p,c" in text and "[##..]" in text
    assert "free GPU queue (next first): 2 3 4 5 6 7" in text


# ---------------------------------------------------------------- errors


def check_unchanged(m, call, error, match):
    before = m.snapshot()
    with pytest.raises(error, match=match) as info:
        call()
    assert isinstance(info.value, PagedKVError)
    assert m.snapshot() == before
    return info.value


def test_unknown_sequence_is_a_key_error():
    m = make()
    m.allocate(0, range(3))
    for call in (lambda: m.free(7), lambda: m.get_block_table(7), lambda: m.append_slots(7, [1]),
                 lambda: m.fork(7, 8), lambda: m.swap_out(7), lambda: m.num_cached_tokens(7)):
        err = check_unchanged(m, call, KeyError, "unknown sequence 7")
        assert "Allocate it first" in str(err)


def test_duplicate_and_empty():
    m = make()
    m.allocate(0, range(3))
    check_unchanged(m, lambda: m.allocate(0, range(3)), DuplicateSequenceError, "already exists")
    check_unchanged(m, lambda: m.fork(0, 0), DuplicateSequenceError, "already exists")
    check_unchanged(m, lambda: m.allocate(1, []), EmptyPromptError, "empty prompt")
    assert isinstance(EmptyPromptError("x"), ValueError)


def test_allocation_is_all_or_nothing():
    m = make(num_gpu=3)
    m.allocate(0, range(5))
    err = check_unchanged(m, lambda: m.allocate(1, range(9)), NoFreeBlocksError, "needs 3 free GPU blocks")
    assert isinstance(err, ValueError)
    check_unchanged(m, lambda: m.append_slots(0, range(8)), NoFreeBlocksError, "only 1 are free")


def test_swap_of_a_sequence_on_the_wrong_device():
    m = make()
    m.allocate(0, range(3))
    check_unchanged(m, lambda: m.swap_in(0), WrongDeviceError, "already on the GPU")
    m.swap_out(0)
    check_unchanged(m, lambda: m.swap_out(0), WrongDeviceError, "swap it in first")
    check_unchanged(m, lambda: m.append_slots(0, [1]), WrongDeviceError, "on the CPU")
    assert isinstance(WrongDeviceError("x"), ValueError)


def test_swap_needs_room():
    m = make(num_gpu=4, num_cpu=1)
    m.allocate(0, range(6))
    assert not m.can_swap_out(0)
    check_unchanged(m, lambda: m.swap_out(0), NoFreeBlocksError, "free CPU blocks")


def test_bad_watermark_and_device():
    with pytest.raises(ValueError, match="watermark"):
        BlockSpaceManager(4, 8, watermark=1.5)
    with pytest.raises(ValueError, match="device"):
        make().free_block_ids("tpu")


def test_a_pool_too_small_for_the_call_says_so_not_free_a_sequence():
    """Issue #38: "Free or swap out a sequence first" when no sequence held a block and the pool itself was too
    small."""
    manager = BlockSpaceManager(4, 3, watermark=0.0)
    with pytest.raises(NoFreeBlocksError, match="whole GPU pool holds only 3 blocks") as too_big:
        manager.allocate("A", range(20))
    assert "Free or swap out" not in str(too_big.value)
    manager.allocate("B", range(8))
    with pytest.raises(NoFreeBlocksError, match="Free or swap out a sequence first"):
        manager.allocate("C", range(8))  # 2 blocks: they would fit once B is gone
