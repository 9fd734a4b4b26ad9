"""The vLLM-shaped kernel: a warp per KV block, a thread group per token, 8-byte loads.

Read ``cuda.py`` first: the grid, the softmax and the v2 partitions are the
same.  What changes is who reads what, as in vLLM's ``paged_attention_kernel``
(``csrc/attention/attention_kernels.cuh``):

* **a warp takes a whole KV block**: warp ``w`` takes the range's blocks
  ``w, w + NUM_WARPS, ...`` and reads each block-table entry once;
* **a thread group of ``max(32 // block_size, 1)`` threads takes one token**
  of that block; its threads split the token's ``head_size`` into 64-bit
  words (4 fp16 or 2 fp32 values, unpacked in registers) and each computes a
  partial ``q.k`` with its slice of ``q``, read from shared memory (vLLM keeps
  it in registers; here that took 171 registers and 12% occupancy, measured
  with ``static_report``);
* the group's partial dots are added with **shuffles inside the group**;
* for ``p @ V`` a warp again takes a block; its lanes take neighbouring words
  of a token's value row (coalesced), and the warps add up in shared memory.

vLLM reads 16-byte vectors from a cache laid out for them; with pagedkv's
``[block, token, kv_head, head_size]`` layout one 8-byte word per lane already
makes a warp read whole 256-byte rows.

**In the simulator** there are no warps to shuffle in, so the group sum goes
through shared memory with barriers instead (``simulated=True``).  Everything
else, the indexing, the word unpacking and the masking, is the same body,
which is what lets CI check it against the dense reference.  Barriers need
every thread, so the block loop runs in block-uniform rounds, with a flag for
warps that have no block left in the last round.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int64, uint64

from ..errors import PagedKVValueError
from .cuda import FULL_MASK, NEG_INF, WARP_SIZE, _add, _max, shuffle_reduction, tree_reduction

WORD_BYTES = 8


def group_sum_shuffle(group_size):
    """Sum over the ``group_size`` lanes of a thread group with xor shuffles (every lane gets it)."""

    @cuda.jit(device=True)
    def group_sum(exchange, value):
        offset = group_size // 2
        while offset > 0:
            value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
            offset //= 2
        return value

    return group_sum


def group_sum_shared(group_size):
    """The same sum through shared memory, for the simulator (which has no warp shuffles)."""

    @cuda.jit(device=True)
    def group_sum(exchange, value):
        tid = cuda.threadIdx.x
        exchange[tid] = value
        cuda.syncthreads()
        first = tid - tid % group_size
        total = float32(0.0)
        for j in range(group_size):
            total += exchange[first + j]
        cuda.syncthreads()  # everyone has read before the next round writes
        return total

    return group_sum


def check_sizes(head_size: int, block_size: int, num_threads: int, dtype: str) -> None:
    """Sizes this mapping can split: whole 64-bit words per row, power-of-two groups, whole warps."""
    per_word = WORD_BYTES // np.dtype(dtype).itemsize
    if head_size % per_word or block_size & (block_size - 1) or num_threads % WARP_SIZE:
        raise PagedKVValueError(
            f"the 'vllm' kernel needs head_size a multiple of {per_word} for {dtype} (got {head_size}), a "
            f"power-of-two block_size (got {block_size}) and whole warps (got {num_threads} threads); "
            "use flavour='tree'.")


def thread_group_layout(block_size: int, words: int) -> tuple[int, int, int, int]:
    """How a warp splits one KV block: ``(group_size, groups_per_warp, tokens_per_group, words_per_thread)``.

    vLLM's ``THREAD_GROUP_SIZE`` is ``max(32 // block_size, 1)`` lanes per token; a warp holds
    ``32 // group_size`` groups, so with blocks larger than 32 tokens each group takes several tokens
    (``NUM_TOKENS_PER_THREAD_GROUP``); the group's lanes share a token's ``words`` 64-bit words.
    """
    group_size = max(WARP_SIZE // block_size, 1)
    groups_per_warp = WARP_SIZE // group_size
    tokens_per_group = max(block_size // groups_per_warp, 1)
    words_per_thread = -(-words // group_size)
    return group_size, groups_per_warp, tokens_per_group, words_per_thread


@functools.cache
def build_vllm_kernels(head_size: int, block_size: int, num_threads: int, logits_len: int, dtype: str,
                       simulated: bool, jit: bool = True):
    """v1 and v2 kernels of the vLLM-shaped flavour for one set of sizes and a cache dtype (cached).

    The caches arrive as int64 words: ``cache.view(torch.int64)``, ``[blocks, block_size, kv_heads, words]``.
    """
    check_sizes(head_size, block_size, num_threads, dtype)
    element = {"float16": np.float16, "float32": np.float32}[dtype]
    per_word = WORD_BYTES // np.dtype(element).itemsize  # values unpacked from one 64-bit word
    num_warps = num_threads // WARP_SIZE
    words = head_size // per_word  # 64-bit words in one token's row of one head
    group_size, groups_per_warp, tokens_per_group, words_per_thread = thread_group_layout(block_size, words)
    v_lanes = min(WARP_SIZE, 1 << (words.bit_length() - 1))  # lanes sharing one value row: a power of two
    v_rows = WARP_SIZE // v_lanes  # value rows (tokens) a warp reads at once
    v_words_per_lane = -(-words // v_lanes)
    acc_len = v_words_per_lane * per_word  # a register array's length must be a constant

    group_sum = (group_sum_shared if simulated else group_sum_shuffle)(group_size)
    if simulated:
        block_max, block_sum = tree_reduction(_max, num_threads), tree_reduction(_add, num_threads)
    else:
        block_max, block_sum = shuffle_reduction(_max, num_warps), shuffle_reduction(_add, num_warps)

    @cuda.jit(device=True, inline=True)
    def load_word(cache_words, physical, offset, kv_head, w, word):
        """One 8-byte load of a token's row, unpacked in registers into ``per_word`` values."""
        # unsigned indices spare numba's negative-index wraparound code
        word[0] = cache_words[uint64(physical), uint64(offset), uint64(kv_head), uint64(w)]
        return word.view(element)

    @cuda.jit(device=True)
    def qk_logits(q_s, key_words, block_table, kv_head, start, end, scale, logits, exchange):
        """Warp w: blocks w, w + num_warps, ...; in each, thread group g: token g (and g + groups_per_warp ...)."""
        lane, warp = cuda.threadIdx.x % WARP_SIZE, cuda.threadIdx.x // WARP_SIZE
        group, rank = lane // group_size, lane % group_size  # which token, which slice of it
        word = cuda.local.array(1, int64)
        first_block, last_block = start // block_size, (end + block_size - 1) // block_size
        local_max = NEG_INF
        for base in range(first_block, last_block, num_warps):  # block-uniform rounds (barriers in the sim)
            b = base + warp
            physical = block_table[b] if b < last_block else 0  # one block-table read per warp and block
            for t in range(tokens_per_group):
                offset = group + t * groups_per_warp
                dot = float32(0.0)
                if b < last_block:
                    for v in range(words_per_thread):
                        w = rank + v * group_size
                        if w < words:
                            values = load_word(key_words, physical, offset, kv_head, w, word)
                            for e in range(per_word):
                                dot += q_s[w * per_word + e] * float32(values[e])
                dot = group_sum(exchange, dot)
                i = b * block_size + offset
                if b < last_block and start <= i < end:  # the last block's unused slots are masked
                    logit = dot * scale
                    if rank == 0:
                        logits[i - start] = logit
                    local_max = max(local_max, logit)
        return local_max

    @cuda.jit(device=True)
    def weighted_values(logits, value_words, block_table, kv_head, start, end, inv_sum, out_row, out_red):
        """Warp w: blocks w, ...; its lanes read neighbouring words of a value row, v_rows rows at a time."""
        lane, warp = cuda.threadIdx.x % WARP_SIZE, cuda.threadIdx.x // WARP_SIZE
        row, col = lane // v_lanes, lane % v_lanes
        acc = cuda.local.array(acc_len, float32)
        for k in range(acc_len):
            acc[k] = float32(0.0)
        word = cuda.local.array(1, int64)
        first_block, last_block = start // block_size, (end + block_size - 1) // block_size
        for b in range(first_block + warp, last_block, num_warps):  # no barrier inside: warps may differ
            physical = block_table[b]
            for offset in range(row, block_size, v_rows):
                i = b * block_size + offset
                if start <= i < end:
                    p = logits[i - start]
                    for k in range(v_words_per_lane):
                        w = col + k * v_lanes
                        if w < words:
                            values = load_word(value_words, physical, offset, kv_head, w, word)
                            for e in range(per_word):
                                acc[k * per_word + e] += p * float32(values[e])
        slot = (warp * v_rows + row) * head_size
        for k in range(v_words_per_lane):
            w = col + k * v_lanes
            if w < words:
                for e in range(per_word):
                    out_red[slot + w * per_word + e] = acc[k * per_word + e]
        cuda.syncthreads()
        for d in range(cuda.threadIdx.x, head_size, num_threads):  # add up every warp's every row
            total = float32(0.0)
            for r in range(num_warps * v_rows):
                total += out_red[r * head_size + d]
            out_row[d] = total * inv_sum

    @cuda.jit(device=True)
    def attend(out_row, query_row, key_words, value_words, block_table, kv_head, start, end, scale,
               q_s, logits, red, out_red, exchange):
        """As in cuda.py: softmax attention over tokens [start, end); returns (max logit, sum of exps)."""
        tid = cuda.threadIdx.x
        for d in range(tid, head_size, num_threads):
            q_s[d] = float32(query_row[d])
        cuda.syncthreads()
        m = block_max(red, qk_logits(q_s, key_words, block_table, kv_head, start, end, scale, logits, exchange))
        local_sum = float32(0.0)
        for j in range(tid, end - start, num_threads):
            e = math.exp(logits[j] - m)
            logits[j] = e
            local_sum += e
        total = block_sum(red, local_sum)
        weighted_values(logits, value_words, block_table, kv_head, start, end, float32(1.0) / total,
                        out_row, out_red)
        return m, total

    out_red_len = num_warps * v_rows * head_size

    def paged_attention_v1(out, query, key_words, value_words, block_tables, seq_lens, scale, num_queries_per_kv):
        head, seq = cuda.blockIdx.x, cuda.blockIdx.y
        q_s = cuda.shared.array(head_size, float32)
        logits = cuda.shared.array(logits_len, float32)
        red = cuda.shared.array(num_threads, float32)
        out_red = cuda.shared.array(out_red_len, float32)
        exchange = cuda.shared.array(num_threads, float32)
        attend(out[seq, head], query[seq, head], key_words, value_words, block_tables[seq],
               head // num_queries_per_kv, 0, seq_lens[seq], scale, q_s, logits, red, out_red, exchange)

    def paged_attention_v2(tmp_out, max_logits, exp_sums, query, key_words, value_words, block_tables,
                           seq_lens, scale, num_queries_per_kv):
        head, seq, part = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        start = part * logits_len  # a multiple of block_size: partitions start on a block
        seq_len = seq_lens[seq]
        if start >= seq_len:
            return
        q_s = cuda.shared.array(head_size, float32)
        logits = cuda.shared.array(logits_len, float32)
        red = cuda.shared.array(num_threads, float32)
        out_red = cuda.shared.array(out_red_len, float32)
        exchange = cuda.shared.array(num_threads, float32)
        m, total = attend(tmp_out[seq, head, part], query[seq, head], key_words, value_words, block_tables[seq],
                          head // num_queries_per_kv, start, min(start + logits_len, seq_len), scale,
                          q_s, logits, red, out_red, exchange)
        if cuda.threadIdx.x == 0:
            max_logits[seq, head, part] = m
            exp_sums[seq, head, part] = total

    kernels = (paged_attention_v1, paged_attention_v2)
    return tuple(cuda.jit(k) for k in kernels) if jit else kernels
