"""The unified numba.cuda kernel: one launch for a step's mixed batch, a decode tile and a prefill tile.

vLLM today (0.33) runs every step's mixed batch through ``kernel_unified_attention``
(``vllm/v1/attention/ops/triton_unified_attention.py``).  This is that kernel's
shape in numba.cuda, built from the same phases as ``cuda.py``'s decode kernels:

* **Grid** ``(query tiles, KV heads, segments)``: program ``(q_block_global_idx,
  kv_head_idx, segm_idx)`` finds its sequence by a binary search over
  ``cu_seqlens_q`` (vLLM's ``find_seq_idx``) and takes ``BLOCK_Q`` of that
  sequence's queries with all ``num_queries_per_kv`` query heads that share the
  KV head: a tile of ``BLOCK_M = BLOCK_Q * num_queries_per_kv`` rows, row ``r``
  being query ``r // num_queries_per_kv`` and head ``r % num_queries_per_kv``
  (vLLM packs its tiles the same way).  There are at most
  ``num_tokens // BLOCK_Q + num_seqs`` tiles; the spare ones return.
* **A decode tile** (a sequence with one query this step) runs the grouped
  decode kernel's phases (``cuda_vllm.grouped_phases``): a warp per page, a
  thread group per key, each 8-byte word of K and V loaded from the cache
  once and multiplied straight into every query head of the group.  The
  context goes by partitions of ``PARTITION_SIZE`` keys (each one's logits in
  shared memory, as v2), merged by an online softmax.
* **A prefill tile** (a chunk of queries) stages one page of K and V in
  shared memory with vectorised word loads, shared by the tile's ``BLOCK_M``
  rows; each thread computes ``q.k`` for one key and several rows (one K load
  for them all), masks it (key ``j`` is seen by the query at position ``p``
  when ``j <= p``, and ``j > p - sliding_window`` on a window layer), and the
  tile keeps a running max ``m`` and sum ``l`` per row (FlashAttention's online
  softmax; vLLM's ``softmax_step``); ``p @ V`` reads each value once for all the
  rows a thread owns.
* **Split-KV (vLLM's 3-D mode)**: with few sequences of decodes the grid is
  small, so ``segments > 1`` splits each context into contiguous segments, one
  program each, that write their max, sum and partial output; the v2 reduce
  kernel (``cuda.build_reduce_kernel``) combines them, as vLLM's
  ``reduce_segments`` does.

Which branch a tile takes is decided at run time (``q_len == 1``), the same
for every thread of a block, so a mixed batch is still one launch per layer.
In the simulator the group sums and block reductions go through shared memory
(``simulated=True``) and there are no warp shuffles; tiny launches only.

**Registers, and why the indices are unsigned.**  An index into shared memory
is written ``uint64(...)`` (here and in ``grouped_phases``): with a signed one
numba adds a negative-index wraparound to every address, LLVM hoists those
thread-only addresses out of the partition loop, and they stayed in registers
through the K and V loops until ptxas spilled them (48-56 bytes at sm_90, head
128, before).  For the same reason a decode tile keeps its running max, sum and
output in shared memory, not in registers across ``attend_range``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import torch
from numba import cuda, float32, int16, int32, int64, uint64

from ..errors import PagedKVValueError
from .backend import announce_simulator
from .cuda import PARTITION_SIZE, _empty, _fast_thread_switching, _on_device, _on_tensors_gpu, build_reduce_kernel
from .cuda_device import NEG_INF, WARP_SIZE, WORD_BYTES
from .cuda_vllm import check_sizes, grouped_phases, grouped_shared_floats
from .validate import UnifiedShape

BLOCK_M = 16  # query rows per tile, as vLLM's BLOCK_M for groups of up to 16 query heads
MAX_SHARED_BYTES = 48 * 1024  # numba's static shared memory per block
NUM_SEGMENTS = 16  # vLLM 0.33's NUM_PAR_SOFTMAX_SEGMENTS (v1/attention/backends/triton_attn.py)
MIN_LAUNCH_GRID_SIZE_2D = 128  # vLLM 0.33: below this many (sequence, KV head) programs, split the context


def block_q_for(shape: UnifiedShape) -> int:
    """Queries per tile for this batch (see :func:`choose_block_q`)."""
    return choose_block_q(shape.head_size, shape.block_size, shape.num_queries_per_kv)


def choose_block_q(head_size: int, block_size: int, num_queries_per_kv: int) -> int:
    """vLLM's ``BLOCK_M // num_queries_per_kv`` queries (at least 1), halved until the tile's shared memory fits."""
    block_q = max(1, BLOCK_M // num_queries_per_kv)
    while block_q > 1 and shared_bytes(head_size, block_size, block_q * num_queries_per_kv) > MAX_SHARED_BYTES:
        block_q //= 2
    return block_q


def shared_bytes(head_size: int, block_size: int, block_m: int) -> int:
    """A prefill tile's shared memory: its queries (rows padded by one float), one page of K and V, its logits and
    three per-row floats, all float32."""
    return 4 * tile_shared_floats(head_size, block_size, block_m)


def tile_shared_floats(head_size: int, block_size: int, block_m: int) -> int:
    return block_m * (head_size + 1) + 2 * block_size * head_size + block_m * block_size + 3 * block_m


def word_bytes(head_size: int, itemsize: int) -> int:
    """Bytes the kernel loads at a time: 8 (4 fp16 or 2 fp32 values) when a row splits into whole words."""
    return WORD_BYTES if head_size * itemsize % WORD_BYTES == 0 else itemsize


def decode_partition(head_size: int, block_size: int, num_threads: int, num_queries_per_kv: int, dtype: str) -> int:
    """The partition a decode tile's grouped phases hold in shared memory, or 0 where they cannot run (a row that
    is not whole 8-byte words, a block size that is not a power of two, a group too large for shared memory):
    then decodes take the prefill tile's path."""
    try:
        check_sizes(head_size, block_size, num_threads, dtype)
    except PagedKVValueError:
        return 0
    partition = PARTITION_SIZE
    while partition >= 64:
        floats = grouped_shared_floats(head_size, block_size, num_threads, partition, dtype, num_queries_per_kv)
        if 4 * floats <= MAX_SHARED_BYTES:
            return partition
        partition //= 2
    return 0


def launch_bounds(num_threads: int, cc: tuple[int, int], num_queries_per_kv: int, head_size: int,
                  decodes_only: bool):
    """``__launch_bounds__(num_threads, min_blocks)``: room for as many resident threads as the kernel had before
    this body (its occupancy in ``static_report``), so ptxas caps registers at 65,536 / resident threads.

    sm_90: 768 threads (37.5%, 80 registers a thread), 640 (31%) at head 256 with prefill tiles or a decode
    group of more than 512 accumulators (``num_queries_per_kv * head_size``); sm_80, whose code needs more
    registers for the same body: 512 (25%), 384 (19%) at head 256 with prefill tiles, and 640 (31%) for MHA
    decodes at head 256.  ``static_report`` shows no spill at these but that last one's 24 bytes.

    Why sm_80 spills there: ptxas for sm_80 guards every warp shuffle inside a loop (the thread group's ``q.k``
    sum) with a divergence check and an out-of-line call (``BRA.DIV``, ``__cuda_sm70_shflsync_bfly_p``), and
    registers live across a call cost more; sm_90's code has neither.  MHA head-256 decodes on sm_80, by resident
    threads (registers, spill bytes): 256 (193, 0), 384 (159, 0), 512 (128, 104), 640 (96, 24), 768 (80, 76).
    No bound both spills nothing and keeps the 25% it had; 640 has the most occupancy and the fewest spill bytes
    of the rest, stored once per 512-key partition, never inside the K or V loops (the same kernel with that sum
    through shared memory, as in the simulator, spills nothing at 512: the shuffle's call is the cost).
    """
    if cc >= (9, 0):
        big = num_queries_per_kv * head_size > 512 if decodes_only else head_size > 128
        threads = 640 if big else 768
    elif decodes_only and head_size > 128 and num_queries_per_kv == 1:
        threads = 640
    else:
        threads = 384 if head_size > 128 and not decodes_only else 512
    return num_threads, max(1, threads // num_threads)


def divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, n + 1) if n % d == 0 and d <= max(1, limit))


@functools.cache
def build_unified_kernel(head_size: int, block_size: int, num_threads: int, block_q: int, num_queries_per_kv: int,
                         sliding_window: int, dtype: str = "float32", simulated: bool = True,
                         partition_size: int | None = None, split: bool = False, decodes_only: bool = False,
                         jit: bool = True):
    """The kernel for one set of compile-time sizes (cached); ``sliding_window = 0`` is full attention.

    ``partition_size``: a decode tile's partition (``None``: :func:`decode_partition`; 0: decodes take the prefill
    tile's path).  ``split``: the 3-D launch, which writes per-segment partials for the v2 reduce.
    ``decodes_only``: a batch of decodes (``block_q = 1``), where the prefill tile is left out (its shared memory
    and registers with it) whenever the decode tile can run.  Launch it on
    ``(num_tokens // block_q + num_seqs, num_kv_heads, num_segments)`` thread blocks of ``num_threads``, the caches
    as flat words (:func:`cache_words`).
    """
    group = num_queries_per_kv
    block_m = block_q * group  # the tile's rows: (query, head) pairs
    window = sliding_window
    element = {"float16": np.float16, "float32": np.float32}[dtype]
    itemsize = np.dtype(element).itemsize
    per_word = word_bytes(head_size, itemsize) // itemsize
    words = head_size // per_word
    word_type = {8: int64, 4: int32, 2: int16}[per_word * itemsize]
    if partition_size is None:
        partition_size = decode_partition(head_size, block_size, num_threads, group, dtype)
    grouped = partition_size > 0
    with_prefill = not (decodes_only and grouped)

    # prefill tile: who computes what
    unroll = next(u for u in (8, 4, 2, 1) if head_size % u == 0)
    q_stride = head_size + 1  # a padded row: two rows read by one warp fall in different banks
    rows_per_thread = divisor_at_most(block_m, block_m * block_size // num_threads)  # q.k: rows sharing a K load
    row_groups = block_m // rows_per_thread
    if num_threads >= head_size:  # p @ V: a thread owns one column and rows r0, r0 + row_step, ...
        row_step, cols_per_thread = num_threads // head_size, 1
    else:  # or columns c0, c0 + num_threads, ... of every row
        row_step, cols_per_thread = 1, -(-head_size // num_threads)
    rows_per_acc = -(-block_m // row_step)
    exact = row_step * rows_per_acc == block_m and (num_threads % head_size == 0 or head_size % num_threads == 0)
    acc_len = rows_per_acc * cols_per_thread
    t_k = block_m * q_stride
    t_v = t_k + head_size * block_size
    t_logits = t_v + block_size * head_size
    t_m = t_logits + block_m * block_size
    tile_floats = t_m + 3 * block_m

    # decode tile: the grouped phases
    smem_len = tile_floats if with_prefill else 1
    if grouped:
        phases = grouped_phases(head_size, block_size, num_threads, partition_size, dtype, simulated, group)
        stage_group, attend_range = phases.stage_queries, phases.attend_range
        d_logits = phases.q_len
        d_red = d_logits + phases.logits_total
        d_out = d_red + num_threads
        d_exchange = d_out + phases.out_red_len
        d_stats = d_exchange + num_threads  # per head: a partition's max and sum, the running ones
        d_part = d_stats + 4 * group  # this partition's output and the merged one, a slot per (head, dim)
        d_acc = d_part + phases.q_len
        smem_len = max(smem_len, d_acc + phases.q_len)
        q_len_d = phases.q_len

    @cuda.jit(device=True)
    def find_seq_idx(cu_seqlens_q, q_block_global_idx, num_seqs):
        """The sequence owning a tile: sequence s's tiles start at ``cu_seqlens_q[s] // block_q + s``."""
        left, right = 0, num_seqs
        while left < right:
            mid = (left + right) // 2
            if cu_seqlens_q[mid] // block_q + mid <= q_block_global_idx:
                left = mid + 1
            else:
                right = mid
        return left - 1

    # ------------------------------------------------------------------------------------------ the prefill tile
    @cuda.jit(device=True)
    def stage_queries(q_s, query, first_token, q_tile_len, kv_head):
        """Row r of the tile: query ``r // group``, head ``kv_head * group + r % group``, as float32."""
        for j in range(cuda.threadIdx.x, block_m * head_size, num_threads):
            r, d = j // head_size, j % head_size
            q = float32(0.0)
            if r // group < q_tile_len:
                q = float32(query[first_token + r // group, kv_head * group + r % group, d])
            q_s[uint64(r * q_stride + d)] = q
        cuda.syncthreads()

    @cuda.jit(device=True)
    def load_page(k_s, v_s, key_words, value_words, block_start, token_stride, page_start, seq_len):
        """One page's K (transposed: ``k_s[d, key]``) and V rows into shared memory, a word at a time; slots past
        the sequence read as zero (a masked key must not be garbage: 0 * nan is nan)."""
        wk = cuda.local.array(1, word_type)
        wv = cuda.local.array(1, word_type)
        for j in range(cuda.threadIdx.x, block_size * words, num_threads):
            physical_block_offset = int64(uint64(j) // words)  # unsigned: a shift for a power of two
            w = int64(uint64(j) % words)
            if page_start + physical_block_offset < seq_len:
                row = block_start + physical_block_offset * token_stride + w
                wk[0], wv[0] = key_words[uint64(row)], value_words[uint64(row)]
            else:
                wk[0], wv[0] = 0, 0
            ks, vs = wk.view(element), wv.view(element)
            for e in range(per_word):
                d = w * per_word + e
                k_s[uint64(d * block_size + physical_block_offset)] = float32(ks[e])
                v_s[uint64(physical_block_offset * head_size + d)] = float32(vs[e])
        cuda.syncthreads()

    @cuda.jit(device=True)
    def qk_logits(q_s, k_s, logits, page_start, first_pos, q_tile_len, scale, seg_lo, seg_hi):
        """A thread per (key, row group): ``q.k * scale`` for ``rows_per_thread`` rows from one K load, or NEG_INF
        where the mask hides the key."""
        dots = cuda.local.array(rows_per_thread, float32)
        for j in range(cuda.threadIdx.x, block_size * row_groups, num_threads):
            physical_block_offset, g = j % block_size, j // block_size
            for k in range(rows_per_thread):
                dots[k] = float32(0.0)
            k_index, q_index = physical_block_offset, g * q_stride  # k_s[d, key] and q_s[row, d], d = 0
            d = 0
            while d < head_size:  # unroll dims by hand: numba's range() counts in 64 bits on every step
                for e in range(unroll):
                    key = k_s[uint64(k_index + e * block_size)]
                    for k in range(rows_per_thread):
                        dots[k] += q_s[uint64(q_index + k * row_groups * q_stride + e)] * key
                k_index += unroll * block_size
                q_index += unroll
                d += unroll
            key_pos = page_start + physical_block_offset
            for k in range(rows_per_thread):
                r = g + k * row_groups
                query_pos = first_pos + r // group
                visible = r // group < q_tile_len and key_pos <= query_pos  # causal (so also inside the sequence)
                if window:
                    visible = visible and key_pos > query_pos - window
                if split:
                    visible = visible and key_pos >= seg_lo and key_pos < seg_hi
                logit = NEG_INF
                if visible:
                    logit = dots[k] * scale
                logits[uint64(r * block_size + physical_block_offset)] = logit
        cuda.syncthreads()

    @cuda.jit(device=True)
    def softmax_step(logits, m_s, l_s, alpha_s):
        """A thread per row: the new running max, the rescale factor, the page's exps (masked keys weigh 0)."""
        for r in range(cuda.threadIdx.x, block_m, num_threads):
            m_new = m_s[r]
            for i in range(block_size):
                m_new = max(m_new, logits[r * block_size + i])
            alpha = math.exp(m_s[r] - m_new)  # 1 while the max holds; < 1 when it grew
            total = float32(0.0)
            for i in range(block_size):
                logit = logits[r * block_size + i]
                p = float32(0.0)
                if logit > NEG_INF:
                    p = math.exp(logit - m_new)
                logits[r * block_size + i] = p
                total += p
            l_s[r] = l_s[r] * alpha + total
            m_s[r] = m_new
            alpha_s[r] = alpha
        cuda.syncthreads()

    @cuda.jit(device=True, inline=True)
    def owned(tid):
        """The first column and row of the output a thread owns (``p @ V``); the row is 0 when ``row_step`` is 1."""
        if row_step == 1:
            return tid % head_size if num_threads >= head_size else tid, 0
        return tid % head_size, tid // head_size

    @cuda.jit(device=True)
    def weighted_values(logits, v_s, alpha_s, acc):
        """Thread t owns column(s) c0 (+ num_threads ...) of rows r0, r0 + row_step, ... in registers across pages:
        rescale them, then add p @ V, each value read once for all those rows."""
        c0, r0 = owned(cuda.threadIdx.x)
        active = r0 < row_step
        for rr in range(rows_per_acc):
            r = r0 + rr * row_step
            if exact or (active and r < block_m):
                alpha = alpha_s[r]
                for cc in range(cols_per_thread):
                    acc[rr * cols_per_thread + cc] *= alpha
        for i in range(block_size):
            for cc in range(cols_per_thread):
                c = c0 + cc * num_threads
                if exact or c < head_size:
                    v = v_s[uint64(i * head_size + c)]
                    for rr in range(rows_per_acc):
                        r = r0 + rr * row_step
                        if exact or (active and r < block_m):
                            acc[rr * cols_per_thread + cc] += logits[uint64(r * block_size + i)] * v
        cuda.syncthreads()  # every thread is done with this page before the next one overwrites it

    @cuda.jit(device=True)
    def prefill_tile(out, tmp_out, max_logits, exp_sums, query, key_words, value_words, block_table, first_token,
                     q_tile_len, first_pos, seq_len, kv_head, num_kv_heads, scale, seg_lo, seg_hi, segment, smem):
        q_s, k_s, v_s = smem[0:t_k], smem[t_k:t_v], smem[t_v:t_logits]
        logits = smem[t_logits:t_m]
        m_s, l_s, alpha_s = smem[t_m:t_m + block_m], smem[t_m + block_m:t_m + 2 * block_m], \
            smem[t_m + 2 * block_m:tile_floats]
        tid = cuda.threadIdx.x
        for r in range(tid, block_m, num_threads):
            m_s[r] = NEG_INF  # running max per row
            l_s[r] = float32(0.0)  # running sum of exps per row
        acc = cuda.local.array(acc_len, float32)
        for k in range(acc_len):
            acc[k] = float32(0.0)
        stage_queries(q_s, query, first_token, q_tile_len, kv_head)
        token_stride = int64(num_kv_heads) * words
        kv_base = int64(kv_head) * words
        lo = seg_lo  # the first key any row of the tile can see; a causal tile reads no page past its last query
        if window:
            lo = max(lo, first_pos - window + 1)
        hi = min(first_pos + q_tile_len, seg_hi)
        if lo < hi:
            for page in range(lo // block_size, (hi - 1) // block_size + 1):
                physical_block_number = block_table[page]  # the block table, read once per page
                block_start = int64(physical_block_number) * block_size * token_stride + kv_base
                page_start = page * block_size
                load_page(k_s, v_s, key_words, value_words, block_start, token_stride, page_start, seq_len)
                qk_logits(q_s, k_s, logits, page_start, first_pos, q_tile_len, scale, seg_lo, seg_hi)
                softmax_step(logits, m_s, l_s, alpha_s)
                weighted_values(logits, v_s, alpha_s, acc)
        c0, r0 = owned(tid)
        for rr in range(rows_per_acc):
            r = r0 + rr * row_step
            if (exact or (r0 < row_step and r < block_m)) and r // group < q_tile_len:
                token, head = first_token + r // group, kv_head * group + r % group
                total = l_s[r]
                inv = float32(1.0) / total if total > 0 else float32(0.0)
                for cc in range(cols_per_thread):
                    c = c0 + cc * num_threads
                    if exact or c < head_size:
                        if split:
                            tmp_out[token, head, segment, c] = acc[rr * cols_per_thread + cc] * inv
                        else:
                            out[token, head, c] = acc[rr * cols_per_thread + cc] * inv
                if split and c0 == 0:
                    max_logits[token, head, segment] = m_s[r]
                    exp_sums[token, head, segment] = total

    # ------------------------------------------------------------------------------------------- the decode tile
    if not grouped:  # decodes take the prefill tile's path; a stub keeps the dispatch below typed
        @cuda.jit(device=True)
        def decode_tile(out, tmp_out, max_logits, exp_sums, query, key_words, value_words, block_table, token,
                        seq_len, kv_head, num_kv_heads, scale, seg_lo, seg_hi, segment, smem):
            pass
    else:
        @cuda.jit(device=True)
        def decode_tile(out, tmp_out, max_logits, exp_sums, query, key_words, value_words, block_table, token,
                        seq_len, kv_head, num_kv_heads, scale, seg_lo, seg_hi, segment, smem):
            """One query's ``group`` heads over its keys (or its segment's), partition by partition, merged by an
            online softmax: each partition's max and sum rescale what came before."""
            q_s, logits, red = smem[0:d_logits], smem[d_logits:d_red], smem[d_red:d_out]
            out_red, exchange = smem[d_out:d_exchange], smem[d_exchange:d_exchange + num_threads]
            first_head = kv_head * group
            stage_group(q_s, query, token, first_head)
            # per head: this partition's max and sum, the running ones; per (head, dim): this partition's output
            # and the merged one.  All in shared memory, indexed unsigned: nothing held in registers across
            # attend_range, whose K and V loops want every register (see the module docstring).
            part_max, part_sum = smem[d_stats:d_stats + group], smem[d_stats + group:d_stats + 2 * group]
            run_max, run_sum = smem[d_stats + 2 * group:d_stats + 3 * group], smem[d_stats + 3 * group:d_part]
            part, merged = smem[d_part:d_acc], smem[d_acc:d_acc + q_len_d]
            tid = cuda.threadIdx.x
            for h in range(tid, group, num_threads):
                run_max[uint64(h)] = NEG_INF  # the same for every thread
                run_sum[uint64(h)] = float32(0.0)
            for j in range(tid, q_len_d, num_threads):  # slot j is thread j % num_threads's, as in ``part``
                merged[uint64(j)] = float32(0.0)
            start = seg_lo
            if window:
                start = max(start, seq_len - window)
            while start < seg_hi:  # the barriers inside order the writes to the running max and sum below
                end = min((start // partition_size + 1) * partition_size, seg_hi)
                attend_range(q_s, key_words, value_words, block_table, kv_head, num_kv_heads, start, end, scale,
                             logits, red, out_red, exchange, part_max, part_sum, part)
                for j in range(tid, q_len_d, num_threads):  # rescale what came before, add this partition
                    h = uint64(j // head_size)
                    m_new = max(run_max[h], part_max[h])
                    merged[uint64(j)] = merged[uint64(j)] * math.exp(run_max[h] - m_new) \
                        + part[uint64(j)] * math.exp(part_max[h] - m_new)
                cuda.syncthreads()  # everyone has read the running max
                for h in range(tid, group, num_threads):
                    m_new = max(run_max[uint64(h)], part_max[uint64(h)])
                    run_sum[uint64(h)] = run_sum[uint64(h)] * math.exp(run_max[uint64(h)] - m_new) \
                        + part_sum[uint64(h)] * math.exp(part_max[uint64(h)] - m_new)
                    run_max[uint64(h)] = m_new
                start = end
            cuda.syncthreads()  # the last partition's running max and sum are in
            for j in range(tid, q_len_d, num_threads):
                h, d = j // head_size, j % head_size
                total = run_sum[uint64(h)]
                value = merged[uint64(j)] / total if total > 0 else float32(0.0)
                if split:
                    tmp_out[token, first_head + h, segment, d] = value
                else:
                    out[token, first_head + h, d] = value
            if split:
                for h in range(tid, group, num_threads):
                    max_logits[token, first_head + h, segment] = run_max[uint64(h)]
                    exp_sums[token, first_head + h, segment] = run_sum[uint64(h)]

    def unified_attention(out, tmp_out, max_logits, exp_sums, query, key_words, value_words, cu_seqlens_q, seq_lens,
                          block_tables, scale, num_seqs, num_kv_heads, segment_len):
        q_block_global_idx, kv_head, segment = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        seq = find_seq_idx(cu_seqlens_q, q_block_global_idx, num_seqs)
        q_block_local_idx = q_block_global_idx - (cu_seqlens_q[seq] // block_q + seq)
        q_len = cu_seqlens_q[seq + 1] - cu_seqlens_q[seq]
        if q_block_local_idx * block_q >= q_len:  # a spare tile (the grid is an upper bound): the block leaves
            return
        seq_len = seq_lens[seq]
        seg_lo, seg_hi = 0, seq_len
        if split:  # this program's segment of the context (vLLM's 3-D mode)
            seg_lo = segment * segment_len
            if seg_lo >= seq_len:
                return
            seg_hi = min(seg_lo + segment_len, seq_len)
        smem = cuda.shared.array(smem_len, float32)
        first_token = cu_seqlens_q[seq] + q_block_local_idx * block_q  # the tile's first query row
        if not with_prefill or (grouped and q_len == 1):
            decode_tile(out, tmp_out, max_logits, exp_sums, query, key_words, value_words, block_tables[seq],
                        first_token, seq_len, kv_head, num_kv_heads, scale, seg_lo, seg_hi, segment, smem)
        else:
            q_tile_len = min(block_q, q_len - q_block_local_idx * block_q)
            first_pos = seq_len - q_len + q_block_local_idx * block_q  # its position in the sequence
            prefill_tile(out, tmp_out, max_logits, exp_sums, query, key_words, value_words, block_tables[seq],
                         first_token, q_tile_len, first_pos, seq_len, kv_head, num_kv_heads, scale, seg_lo, seg_hi,
                         segment, smem)

    if not jit:
        return unified_attention
    if simulated:  # the simulator takes no launch bounds
        return cuda.jit(unified_attention)
    bounds = launch_bounds(num_threads, cuda.get_current_device().compute_capability, group, head_size,
                           decodes_only)
    return cuda.jit(unified_attention, launch_bounds=bounds)


def cache_words(cache: torch.Tensor, head_size: int) -> torch.Tensor:
    """A ``[blocks, block_size, kv_heads, head_size]`` cache as the flat words the unified kernel loads."""
    size = word_bytes(head_size, cache.element_size())
    return cache.reshape(-1).view({8: torch.int64, 4: torch.int32, 2: torch.int16}[size])


class LaunchPlan(NamedTuple):
    """How :func:`unified_attention_cuda` launches a batch: what ``kernel_figures.unified_grid`` draws."""
    block_q: int  # queries per tile (1 for a batch of decodes)
    partition_size: int  # a decode tile's partition; 0: decodes take the prefill tile's path
    segment_len: int  # keys per segment (3-D); the longest context when 2-D
    grid: tuple  # (query tiles, KV heads, segments)


def launch_plan(shape: UnifiedShape, num_threads: int, dtype: str, partition_size: int | None = None,
                num_segments: int | None = None) -> LaunchPlan:
    """The tile size, partition, segments and grid of one launch (the rules above; tests force small ones)."""
    block_q = 1 if shape.max_query_len <= 1 else block_q_for(shape)
    available = decode_partition(shape.head_size, shape.block_size, num_threads, shape.num_queries_per_kv, dtype)
    partition_size = available if partition_size is None or not available else partition_size
    if num_segments is None:
        num_segments = choose_split(shape, partition_size or PARTITION_SIZE)
    num_segments = max(1, min(num_segments, shape.max_seq_len))
    unit = partition_size or shape.block_size  # segments are whole partitions (a decode tile's) or pages
    segment_len = -(-shape.max_seq_len // (num_segments * unit)) * unit
    num_segments = -(-shape.max_seq_len // segment_len)
    grid = (shape.num_tokens // block_q + shape.num_seqs, shape.num_kv_heads, num_segments)
    return LaunchPlan(block_q, partition_size, segment_len, grid)


def tile_owner(cu_seqlens_q, tile: int, block_q: int) -> tuple[int, int, int] | None:
    """The host twin of the kernel's first lines: tile ``tile``'s (sequence, first query row, rows), or None for a
    spare tile, which returns (the grid is an upper bound).  Sequence ``s``'s tiles start at
    ``cu_seqlens_q[s] // block_q + s`` (``find_seq_idx``)."""
    cu = [int(x) for x in cu_seqlens_q]
    seq = max(s for s in range(len(cu) - 1) if cu[s] // block_q + s <= tile)
    local = tile - (cu[seq] // block_q + seq)
    q_len = cu[seq + 1] - cu[seq]
    if local * block_q >= q_len:
        return None
    return seq, cu[seq] + local * block_q, min(block_q, q_len - local * block_q)


def choose_split(shape: UnifiedShape, partition_size: int) -> int:
    """Segments per context: 3-D (``NUM_SEGMENTS``) for a batch of decodes too few to fill a 2-D grid of
    ``MIN_LAUNCH_GRID_SIZE_2D`` (sequence, KV head) programs, and here only when a context is longer than one
    partition; else 1 (2-D).  vLLM 0.33 goes 3-D when ``num_seqs * cdiv(max_seqlen_q, BLOCK_Q) <= seq_threshold_3D``
    (``128 // num_kv_heads``, snapped to the nearest CUDA-graph capture size when decode graphs are on), for queries
    of up to ``MAX_3D_QUERY_LEN = 8`` too; pagedkv keeps the 128, not the snap."""
    few = shape.num_seqs * shape.num_kv_heads < MIN_LAUNCH_GRID_SIZE_2D
    if shape.max_query_len <= 1 and few and shape.max_seq_len > partition_size:
        return NUM_SEGMENTS
    return 1


def unified_attention_cuda(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables, shape: UnifiedShape,
                           simulator: bool | None = None, num_threads: int | None = None,
                           partition_size: int | None = None, num_segments: int | None = None) -> torch.Tensor:
    """Launch the unified kernel (arguments already validated; ``shape`` from ``check_unified_args``).

    ``partition_size`` (a decode tile's partition; 0 sends decodes down the prefill tile's path) and
    ``num_segments`` (1: 2-D; more: split-KV, 3-D) default to the rules above; tests force small ones.
    """
    from . import CUDA_MODE

    announce_simulator()
    simulator = CUDA_MODE.simulator if simulator is None else simulator
    num_threads = num_threads or (WARP_SIZE if simulator else 128)
    dtype = str(query.dtype).removeprefix("torch.")
    decodes_only = shape.max_query_len <= 1
    block_q, partition_size, segment_len, grid = launch_plan(shape, num_threads, dtype, partition_size, num_segments)
    needed = shared_bytes(shape.head_size, shape.block_size, block_q * shape.num_queries_per_kv)
    if needed > MAX_SHARED_BYTES:
        raise PagedKVValueError(f"the unified CUDA kernel needs {needed} bytes of shared memory for head_size "
                                f"{shape.head_size}, block_size {shape.block_size} and {shape.num_queries_per_kv} "
                                f"query heads per KV head, over {MAX_SHARED_BYTES}; use backend='cpu' or 'torch', or "
                                "a smaller block_size.")
    num_segments = grid[2]
    split = num_segments > 1
    kernel = build_unified_kernel(shape.head_size, shape.block_size, num_threads, block_q, shape.num_queries_per_kv,
                                  shape.sliding_window or 0, dtype, simulator, partition_size, split, decodes_only)
    key_words, value_words = (cache_words(c, shape.head_size) for c in (key_cache, value_cache))
    with _fast_thread_switching(simulator), _on_tensors_gpu(query) as stream:
        args = [_on_device(t) for t in (query, key_words, value_words, cu_seqlens_q, seq_lens, block_tables)]
        out = _empty((shape.num_tokens, shape.num_heads, shape.head_size), query)
        stats = (shape.num_tokens, shape.num_heads, num_segments) if split else (1, 1, 1)
        tmp_out = _empty(stats + ((shape.head_size,) if split else (1,)), query)
        max_logits, exp_sums = _empty(stats, query), _empty(stats, query)
        kernel[grid, num_threads, stream](out, tmp_out, max_logits, exp_sums, *args, np.float32(shape.scale),
                                          np.int32(shape.num_seqs), np.int32(shape.num_kv_heads),
                                          np.int32(segment_len))
        if split:  # the v2 reduce combines each query row's segments (its sequence's length, row by row)
            q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
            row_seq_lens = seq_lens if shape.max_query_len <= 1 else seq_lens.repeat_interleave(q_lens)
            reduce = build_reduce_kernel(shape.head_size, num_threads)
            reduce[(shape.num_heads, shape.num_tokens), num_threads, stream](
                out, tmp_out, max_logits, exp_sums, _on_device(row_seq_lens.contiguous()), np.int32(segment_len))
    result = out if isinstance(out, torch.Tensor) else torch.from_numpy(out.copy_to_host())
    return result.to(query.dtype)
