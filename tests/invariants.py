"""Invariants every BlockSpaceManager state must satisfy, shared by the property tests."""

from collections import Counter

from pagedkv.prefix import hash_block_tokens


def check_manager_invariants(m):
    s = m.snapshot()
    for device, total in (("gpu", m.num_total_gpu_blocks), ("cpu", m.num_total_cpu_blocks)):
        pointers = Counter(b for seq, table in s.tables.items() if s.seq_devices[seq] == device for b in table)
        blocks = s.device_blocks(device)
        assert len(blocks) == total
        for b in blocks:
            # the ref count of each block is the number of table entries pointing at it
            assert b.ref_count == pointers.get(b.block_id, 0), (device, b)
            assert b.is_free == (b.ref_count == 0)
        free = m.free_block_ids(device)
        assert len(free) == len(set(free)) == total - len(pointers)  # free + used == total
    for seq, table in s.tables.items():
        device = s.seq_devices[seq]
        assert len(table) == len(set(table)) == -(-s.seq_lens[seq] // m.block_size)
        limit = m.num_total_gpu_blocks if device == "gpu" else m.num_total_cpu_blocks
        assert all(0 <= b < limit for b in table)  # only its own device's ids
    for allocator in m.allocators.values():
        check_free_queue_links(allocator)
    if m.prefix_cache:
        check_prefix_cache(m)


def check_free_queue_links(allocator):
    """The doubly linked free queue reads the same forwards and backwards, holds only free blocks, and its
    count is right; blocks in use carry no links."""
    queue = allocator.free_queue
    forward, node = [], queue._head.next_free
    while node is not queue._tail:
        forward.append(node)
        node = node.next_free
    backward, node = [], queue._tail.prev_free
    while node is not queue._head:
        backward.append(node)
        node = node.prev_free
    assert forward == backward[::-1] and len(forward) == queue.num_free_blocks
    assert all(block.ref_count == 0 for block in forward)
    in_queue = {id(block) for block in forward}
    for block in allocator.blocks:
        if id(block) not in in_queue:
            assert block.prev_free is None and block.next_free is None and block.ref_count > 0


def check_prefix_cache(m):
    """Every cached hash names a block whose content is what the hash says."""
    cache, bs = m.prefix_cache, m.block_size
    assert len(cache.hash_to_block) == len(cache.block_to_hash)
    for block_hash, block_id in cache.hash_to_block.items():
        assert cache.block_to_hash[block_id] == block_hash
        parent, tokens = cache.content(block_id)
        assert hash_block_tokens(parent, tokens) == block_hash and len(tokens) == bs
    for seq_id in m.seq_ids:
        if m.get_device(seq_id) != "gpu":
            continue
        tokens, table = m.get_token_ids(seq_id), m.get_block_table(seq_id)
        for i, block_id in enumerate(table[: len(tokens) // bs]):
            content = cache.content(block_id)
            if content is not None:  # a live, named block holds exactly this sequence's tokens
                assert list(content[1]) == tokens[i * bs:(i + 1) * bs]
