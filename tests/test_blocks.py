import pytest

from pagedkv import BlockAllocator, DoubleFreeError, NoFreeBlocksError, PagedKVError, PagedKVValueError
from pagedkv.blocks import FreeBlockQueue, KVBlock


def test_allocate_hands_out_the_queue_head_with_refcount_one():
    a = BlockAllocator(4, block_size=16)
    assert a.free_block_ids() == [0, 1, 2, 3]
    assert [a.allocate(), a.allocate()] == [0, 1]
    assert a.refcount(0) == 1 and a.num_free_blocks == 2
    assert a.free_block_ids() == [2, 3]


def test_free_returns_the_block_to_the_tail():
    a = BlockAllocator(3, 16)
    first = a.allocate()
    a.free(first)
    assert a.free_block_ids() == [1, 2, 0]


def test_incref_and_shared_free():
    a = BlockAllocator(2, 16)
    b = a.allocate()
    assert a.incref(b) == 2
    assert a.free(b) == 1 and a.num_free_blocks == 1  # still used by one owner
    assert a.free(b) == 0 and a.num_free_blocks == 2


def test_incref_of_a_free_block_pulls_it_out_of_the_middle():
    a = BlockAllocator(4, 16)
    assert a.incref(2) == 1
    assert a.free_block_ids() == [0, 1, 3]


def test_double_free():
    a = BlockAllocator(2, 16)
    b = a.allocate()
    a.free(b)
    with pytest.raises(DoubleFreeError, match="already free") as info:
        a.free(b)
    assert isinstance(info.value, ValueError) and isinstance(info.value, PagedKVError)
    assert a.free_block_ids() == [1, 0]  # unchanged by the failed call


def test_out_of_blocks():
    a = BlockAllocator(1, 16)
    a.allocate()
    with pytest.raises(NoFreeBlocksError, match="no free blocks"):
        a.allocate()


@pytest.mark.parametrize("bad, match", [(-1, "outside this pool"), (4, "outside this pool"),
                                        ("0", "block ids are integers"), (1.0, "block ids are integers")])
def test_block_ids_outside_the_pool(bad, match):
    a = BlockAllocator(4, 16)
    with pytest.raises(PagedKVValueError, match=match):
        a.refcount(bad)


def test_bad_pool_sizes():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockAllocator(-1, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockAllocator(4, 0)


def test_free_queue_is_a_linked_list_with_o1_removal():
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    q.remove(blocks[2])
    assert [b.block_id for b in q] == [0, 1, 3, 4]
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    assert [b.block_id for b in q] == [1, 3, 4, 2] and len(q) == 4
    assert blocks[0].prev_free is None and blocks[0].next_free is None
