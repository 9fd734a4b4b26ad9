"""The vLLM-shaped kernels: a warp per KV block, a thread group per token, a query-head group per thread block.

Read ``cuda.py`` first: the grid, the softmax and the v2 partitions are the
same.  What changes is who reads what.

* **A warp takes a whole KV block**, as in vLLM's ``paged_attention_kernel``
  (``csrc/attention/attention_kernels.cuh``): warp ``w`` takes the range's
  blocks ``w, w + NUM_WARPS, ...`` and reads each block-table entry once.
* **A thread group of ``max(32 // block_size, 1)`` threads takes one token** of
  that block (vLLM's ``THREAD_GROUP_SIZE``).  Its threads split the token's
  row into 64-bit words (4 fp16 or 2 fp32 values, unpacked in registers), so
  the *group* fetches ``8 * group_size`` bytes at a time (16 at vLLM's block
  size of 16), and adds its partial ``q.k`` with shuffles inside the group.
* **A thread block takes ``heads_per_block`` query heads** that share one KV
  head.  With ``heads_per_block = 1`` that is vLLM's CUDA kernel: a thread
  block per query head, so under grouped-query attention every K/V element is
  loaded once *per query head*.  With ``heads_per_block =
  num_heads // num_kv_heads`` (the ``"vllm-gqa"`` flavour) it is the mapping
  of FlashInfer's decode kernels and vLLM's Triton ``unified_attention``: each
  K/V word is loaded and addressed once for the whole group, and multiplied
  into every head's dot product (the queries wait in shared memory).
* **Flat indexing**: the caches arrive as one flat array of 64-bit words.  A
  block's first word is found once per block (``physical * block_stride +
  kv_head * words``); a token's row is a fixed stride from it, and a word a
  constant offset from that, which the compiler folds into the load.
* For ``p @ V`` a warp again takes a block; its lanes take neighbouring words
  of a token's value row (coalesced), and the warps add up in shared memory.

**In the simulator** there are no warps to shuffle in, so the group sum and
the block reductions go through shared memory with barriers instead
(``simulated=True``).  Everything else, the indexing, the word unpacking and
the masking, is the same body, which is what lets CI check it against torch's
SDPA.  Barriers need every thread, so the K loop runs in block-uniform rounds,
with a flag for warps that have no block left in the last round.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import torch
from numba import cuda, float32, int64, uint64

from ..errors import PagedKVValueError
from .cuda_device import (
    NEG_INF,
    WARP_SIZE,
    WORD_BYTES,
    _add,
    _max,
    group_sum_shared,
    group_sum_shuffle,
    shuffle_reduction,
    tree_reduction,
    word_loader,
)

FLAVOURS = ("vllm", "vllm-gqa")


def check_sizes(head_size: int, block_size: int, num_threads: int, dtype: str) -> None:
    """Sizes this mapping can split: whole 64-bit words per row, power-of-two groups, whole warps."""
    per_word = WORD_BYTES // np.dtype(dtype).itemsize
    if head_size % per_word or block_size & (block_size - 1) or num_threads % WARP_SIZE:
        raise PagedKVValueError(
            f"the 'vllm' kernels need head_size a multiple of {per_word} for {dtype} (got {head_size}), a "
            f"power-of-two block_size (got {block_size}) and whole warps (got {num_threads} threads); "
            "use flavour='tree'.")


class ThreadGroupLayout(NamedTuple):
    """How a warp splits one KV block (``thread_group_layout``)."""
    group_size: int  # lanes per token (vLLM's THREAD_GROUP_SIZE)
    groups_per_warp: int
    tokens_per_group: int  # tokens one group (so each of its lanes) takes per block
    words_per_thread: int  # 64-bit words of one token's row that one lane reads


def thread_group_layout(block_size: int, words: int) -> ThreadGroupLayout:
    """How a warp splits one KV block: ``(group_size, groups_per_warp, tokens_per_group, words_per_thread)``.

    vLLM's ``THREAD_GROUP_SIZE`` is ``max(32 // block_size, 1)`` lanes per token; a warp holds
    ``32 // group_size`` groups, so with blocks larger than 32 tokens each group takes several tokens
    (``NUM_TOKENS_PER_THREAD_GROUP``); the group's lanes share a token's ``words`` 64-bit words.
    """
    group_size = max(WARP_SIZE // block_size, 1)
    groups_per_warp = WARP_SIZE // group_size
    tokens_per_group = max(block_size // groups_per_warp, 1)
    words_per_thread = -(-words // group_size)
    return ThreadGroupLayout(group_size, groups_per_warp, tokens_per_group, words_per_thread)


def heads_per_block(flavour: str, num_queries_per_kv: int) -> int:
    """Query heads one thread block computes: the whole group for ``"vllm-gqa"``, one for ``"vllm"``."""
    return num_queries_per_kv if flavour == "vllm-gqa" else 1


def launch_bounds(num_threads: int, cc: tuple[int, int], heads_per_block: int, head_size: int):
    """CUDA's ``__launch_bounds__(num_threads, min_blocks)`` for these kernels, or just ``num_threads``.

    On sm_90 ask for enough resident blocks to fill half an SM (1,024 of its 2,048 threads), which caps
    registers at 64 per thread: up to 512 accumulators per block (``heads_per_block * head_size``) that fits
    with no spill (``static_report`` shows it).  sm_80's code needs more registers for the same body and
    would spill under that cap, so there, and for larger groups, the compiler chooses (occupancy 31%).
    """
    if cc >= (9, 0) and heads_per_block * head_size <= 512:
        return num_threads, 1024 // num_threads
    return num_threads


def flat_words(cache: torch.Tensor) -> torch.Tensor:
    """A ``[blocks, block_size, kv_heads, head_size]`` cache as the flat int64 words the kernels read."""
    return cache.reshape(-1).view(torch.int64)


def grouped_shared_floats(head_size: int, block_size: int, num_threads: int, logits_len: int, dtype: str,
                          heads: int) -> int:
    """float32 values of shared memory the grouped phases need: the queries, the logits, the per-warp value rows
    and two reduction buffers (``grouped_phases``' ``shared_floats``, without building them)."""
    words = head_size * np.dtype(dtype).itemsize // WORD_BYTES
    v_rows = WARP_SIZE // min(WARP_SIZE, 1 << (words.bit_length() - 1))
    out_red = heads * (num_threads // WARP_SIZE) * v_rows * head_size
    return 2 * heads * head_size + heads * (logits_len + block_size) + out_red + 2 * num_threads


@functools.cache
def grouped_phases(head_size: int, block_size: int, num_threads: int, logits_len: int, dtype: str, simulated: bool,
                   heads: int):
    """The grouped mapping's device functions for one set of sizes (cached): what both the decode kernels here and
    the unified kernel's decode tiles (``cuda_unified.py``) run.

    * ``stage_queries(q_s, query, row, first_head)``: the ``heads`` query rows of one token, as float32;
    * ``attend_range(q_s, key_words, value_words, block_table, kv_head, num_kv_heads, start, end, scale, logits,
      red, out_red, exchange, maxes, sums, part)``: softmax attention of those heads over tokens ``[start, end)``
      (at most ``logits_len`` of them, ``start`` anywhere: a window's first key need not start a block);
      ``maxes``/``sums`` get each head's max logit and sum of exps, ``part`` (shared, ``[heads * head_size]``) the
      output, *not yet divided* by the sum (so partitions can be merged, as the v2 reduce and the unified
      kernel's online softmax do); thread ``t`` writes slots ``t, t + num_threads, ...``, the ones it reads.

    The shared arrays the caller passes are sized by the returned ``q_len``, ``logits_total``, ``out_red_len`` and
    ``num_threads`` (``red`` and ``exchange``) and ``q_len`` (``part``).
    """
    check_sizes(head_size, block_size, num_threads, dtype)
    element = {"float16": np.float16, "float32": np.float32}[dtype]
    per_word = WORD_BYTES // np.dtype(element).itemsize  # values unpacked from one 64-bit word
    num_warps = num_threads // WARP_SIZE
    words = head_size // per_word  # 64-bit words in one token's row of one head
    group_size, groups_per_warp, tokens_per_group, _ = thread_group_layout(block_size, words)
    v_lanes = min(WARP_SIZE, 1 << (words.bit_length() - 1))  # lanes sharing one value row: a power of two
    v_rows = WARP_SIZE // v_lanes  # value rows (tokens) a warp reads at once
    v_words_per_lane = -(-words // v_lanes)
    v_whole = words % v_lanes == 0
    acc_len = v_words_per_lane * per_word  # a register array's length must be a constant
    acc_total = heads * acc_len  # every head's accumulators, in one register array
    q_len = heads * head_size
    slots_per_thread = -(-q_len // num_threads)
    logits_stride = logits_len + block_size  # a range that starts inside a block spills into one more
    out_red_len = heads * num_warps * v_rows * head_size
    load_word = word_loader(element)

    group_sum = (group_sum_shared if simulated else group_sum_shuffle)(group_size)
    if simulated:
        block_max, block_sum = tree_reduction(_max, num_threads), tree_reduction(_add, num_threads)
    else:
        block_max, block_sum = shuffle_reduction(_max, num_warps), shuffle_reduction(_add, num_warps)

    @cuda.jit(device=True)
    def stage_queries(q_s, query, row, first_head):
        """The ``heads`` query vectors of token ``row``, as float32 in shared memory."""
        for j in range(cuda.threadIdx.x, q_len, num_threads):
            q_s[j] = float32(query[row, first_head + j // head_size, j % head_size])
        cuda.syncthreads()

    @cuda.jit(device=True)
    def qk_logits(q_s, key_words, block_table, kv_base, token_stride, block_stride, start, end, scale, logits,
                  local_max, exchange):
        """Warp w: blocks w, w + num_warps, ...; in each, thread group g: token g (and g + groups_per_warp ...).

        Every word of K is loaded once and multiplied into each of the ``heads`` dot products.
        """
        lane, warp = cuda.threadIdx.x % WARP_SIZE, cuda.threadIdx.x // WARP_SIZE
        group, rank = lane // group_size, lane % group_size  # which token, which slice of it
        word = cuda.local.array(1, int64)
        dots = cuda.local.array(heads, float32)
        first_block, last_block = start // block_size, (end + block_size - 1) // block_size
        base = first_block * block_size  # logits are indexed from the range's first block
        for round_start in range(first_block, last_block, num_warps):  # block-uniform rounds (barriers in the sim)
            b = round_start + warp
            has_block = b < last_block
            physical = int64(block_table[b]) if has_block else int64(0)  # one block-table read per warp and block
            block_start = physical * block_stride + kv_base
            for t in range(tokens_per_group):
                offset = group + t * groups_per_warp
                row = block_start + offset * token_stride  # the token's first word
                for h in range(heads):
                    dots[h] = float32(0.0)
                w = rank  # this lane's words of the row: rank, rank + group_size, ...
                while has_block and w < words:
                    values = load_word(key_words, row + w, word)
                    for e in range(per_word):
                        k = float32(values[e])
                        for h in range(heads):
                            dots[h] += q_s[uint64(h * head_size + w * per_word + e)] * k
                    w += group_size
                i = b * block_size + offset
                valid = has_block and i >= start and i < end  # the range's ends may cut a block: masked
                for h in range(heads):
                    dot = group_sum(exchange, dots[h])
                    logit = dot * scale if valid else NEG_INF  # exp(NEG_INF - max) = 0: a key before start weighs 0
                    if has_block and i < end and rank == 0:
                        logits[uint64(h * logits_stride + i - base)] = logit
                    local_max[h] = max(local_max[h], logit)

    @cuda.jit(device=True)
    def weighted_values(logits, value_words, block_table, kv_base, token_stride, block_stride, start, end,
                        out_red):
        """Warp w: blocks w, ...; its lanes read neighbouring words of a value row, v_rows rows at a time.

        Each word of V is loaded once and added into every head's accumulator, weighted by that head's p.
        """
        lane, warp = cuda.threadIdx.x % WARP_SIZE, cuda.threadIdx.x // WARP_SIZE
        row, col = lane // v_lanes, lane % v_lanes
        acc = cuda.local.array(acc_total, float32)
        for k in range(acc_total):
            acc[k] = float32(0.0)
        p = cuda.local.array(heads, float32)
        word = cuda.local.array(1, int64)
        first_block, last_block = start // block_size, (end + block_size - 1) // block_size
        base = first_block * block_size  # tokens of the first block before ``start`` have p = 0
        for b in range(first_block + warp, last_block, num_warps):  # no barrier inside: warps may differ
            block_start = int64(block_table[b]) * block_stride + kv_base + col
            in_block = min(end - b * block_size, block_size)  # tokens of this block in the range
            offset = row
            while offset < in_block:  # rows row, row + v_rows, ...
                for h in range(heads):
                    p[h] = logits[uint64(h * logits_stride + b * block_size + offset - base)]
                for k in range(v_words_per_lane):
                    if v_whole or col + k * v_lanes < words:
                        values = load_word(value_words, block_start + offset * token_stride + k * v_lanes, word)
                        for e in range(per_word):
                            v = float32(values[e])
                            for h in range(heads):
                                acc[h * acc_len + k * per_word + e] += p[h] * v
                offset += v_rows
        slot = (warp * v_rows + row) * head_size
        for k in range(v_words_per_lane):
            w = col + k * v_lanes
            if v_whole or w < words:
                for e in range(per_word):
                    for h in range(heads):
                        out_red[uint64(h * num_warps * v_rows * head_size + slot + w * per_word + e)] = \
                            acc[h * acc_len + k * per_word + e]
        cuda.syncthreads()

    @cuda.jit(device=True)
    def attend_range(q_s, key_words, value_words, block_table, kv_head, num_kv_heads, start, end, scale, logits,
                     red, out_red, exchange, maxes, sums, part):
        """Softmax attention of the staged ``heads`` queries over tokens [start, end): see ``grouped_phases``."""
        tid = cuda.threadIdx.x
        token_stride = int64(num_kv_heads) * words
        block_stride = token_stride * block_size
        kv_base = int64(kv_head) * words
        local_max = cuda.local.array(heads, float32)
        for h in range(heads):
            local_max[h] = NEG_INF
        qk_logits(q_s, key_words, block_table, kv_base, token_stride, block_stride, start, end, scale, logits,
                  local_max, exchange)
        base = start // block_size * block_size
        for h in range(heads):
            m = block_max(red, local_max[h])
            local_sum = float32(0.0)
            for j in range(tid, end - base, num_threads):
                e = math.exp(logits[uint64(h * logits_stride + j)] - m)  # minus the max: exp never overflows
                logits[uint64(h * logits_stride + j)] = e
                local_sum += e
            maxes[h] = m  # every thread writes the same value (``maxes`` may be shared)
            sums[h] = block_sum(red, local_sum)  # its barrier also publishes every logit written above
        weighted_values(logits, value_words, block_table, kv_base, token_stride, block_stride, start, end,
                        out_red)
        for k in range(slots_per_thread):  # add up every warp's every row, per head: slots tid, tid + num_threads..
            j = uint64(tid + k * num_threads)
            if j < q_len:
                h, d = j // head_size, j % head_size
                total = float32(0.0)
                for r in range(num_warps * v_rows):
                    total += out_red[(h * num_warps * v_rows + r) * head_size + d]
                part[j] = total  # only this thread reads part[j] next: no barrier needed for it
        cuda.syncthreads()  # out_red and logits are free for the next range

    return SimpleNamespace(stage_queries=stage_queries, attend_range=attend_range, q_len=q_len,
                           logits_total=heads * logits_stride, out_red_len=out_red_len,
                           shared_floats=2 * q_len + heads * logits_stride + out_red_len + 2 * num_threads)


@functools.cache
def build_vllm_kernels(head_size: int, block_size: int, num_threads: int, logits_len: int, dtype: str,
                       simulated: bool, heads_per_block: int = 1, jit: bool = True):
    """v1 and v2 kernels for one set of sizes, a cache dtype and a query-head group (cached).

    Launch them on ``(num_heads // heads_per_block, num_seqs[, num_partitions])`` thread blocks.  The caches
    arrive as flat int64 words (:func:`flat_words`), and ``num_kv_heads`` gives their strides.
    """
    heads = heads_per_block
    phases = grouped_phases(head_size, block_size, num_threads, logits_len, dtype, simulated, heads)
    stage_queries, attend_range = phases.stage_queries, phases.attend_range
    q_len, logits_total, out_red_len = phases.q_len, phases.logits_total, phases.out_red_len

    def paged_attention_v1(out, query, key_words, value_words, block_tables, seq_lens, scale, num_queries_per_kv,
                           num_kv_heads):
        first_head, seq = cuda.blockIdx.x * heads, cuda.blockIdx.y
        q_s = cuda.shared.array(q_len, float32)
        logits = cuda.shared.array(logits_total, float32)
        red = cuda.shared.array(num_threads, float32)
        out_red = cuda.shared.array(out_red_len, float32)
        exchange = cuda.shared.array(num_threads, float32)
        maxes = cuda.local.array(heads, float32)
        sums = cuda.local.array(heads, float32)
        part = cuda.shared.array(q_len, float32)
        stage_queries(q_s, query, seq, first_head)
        attend_range(q_s, key_words, value_words, block_tables[seq], first_head // num_queries_per_kv, num_kv_heads,
                     0, seq_lens[seq], scale, logits, red, out_red, exchange, maxes, sums, part)
        for j in range(cuda.threadIdx.x, q_len, num_threads):
            out[seq, first_head + j // head_size, j % head_size] = part[j] / sums[j // head_size]

    def paged_attention_v2(tmp_out, max_logits, exp_sums, query, key_words, value_words, block_tables,
                           seq_lens, scale, num_queries_per_kv, num_kv_heads):
        first_head, seq, partition = cuda.blockIdx.x * heads, cuda.blockIdx.y, cuda.blockIdx.z
        start = partition * logits_len
        seq_len = seq_lens[seq]
        if start >= seq_len:
            return
        q_s = cuda.shared.array(q_len, float32)
        logits = cuda.shared.array(logits_total, float32)
        red = cuda.shared.array(num_threads, float32)
        out_red = cuda.shared.array(out_red_len, float32)
        exchange = cuda.shared.array(num_threads, float32)
        maxes = cuda.local.array(heads, float32)
        sums = cuda.local.array(heads, float32)
        part = cuda.shared.array(q_len, float32)
        stage_queries(q_s, query, seq, first_head)
        attend_range(q_s, key_words, value_words, block_tables[seq], first_head // num_queries_per_kv, num_kv_heads,
                     start, min(start + logits_len, seq_len), scale, logits, red, out_red, exchange, maxes, sums,
                     part)
        for j in range(cuda.threadIdx.x, q_len, num_threads):
            h = j // head_size
            tmp_out[seq, first_head + h, partition, j % head_size] = part[j] / sums[h]
        if cuda.threadIdx.x == 0:
            for h in range(heads):
                max_logits[seq, first_head + h, partition] = maxes[h]
                exp_sums[seq, first_head + h, partition] = sums[h]

    kernels = (paged_attention_v1, paged_attention_v2)
    if not jit:
        return kernels
    if simulated:  # the simulator takes no launch bounds
        return tuple(cuda.jit(k) for k in kernels)
    bounds = launch_bounds(num_threads, cuda.get_current_device().compute_capability, heads, head_size)
    return tuple(cuda.jit(k, launch_bounds=bounds) for k in kernels)
