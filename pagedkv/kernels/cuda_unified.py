"""The unified numba.cuda kernel: the decode kernel's phases, over a tile of queries, with a mask.

vLLM today (0.33) runs every step's mixed batch through ``kernel_unified_attention``
(``vllm/v1/attention/ops/triton_unified_attention.py``).  This is that kernel's
shape in numba.cuda, written to sit beside ``cuda.py``'s decode kernel:

* **Grid** ``(query tiles, KV heads)``: program ``(q_block_global_idx,
  kv_head_idx)`` finds its sequence by a binary search over ``cu_seqlens_q``
  (vLLM's ``find_seq_idx``), then takes ``BLOCK_Q`` of that sequence's queries
  and all ``num_queries_per_kv`` query heads that share the KV head: a tile of
  ``BLOCK_M = BLOCK_Q * num_queries_per_kv`` rows, row ``r`` being query
  ``r // num_queries_per_kv`` and head ``r % num_queries_per_kv``.  There are
  at most ``num_tokens // BLOCK_Q + num_seqs`` tiles; the spare ones return.
  A decode is a tile of one query (``BLOCK_Q = 1`` when every ``q_len`` is 1).
* **The same phases as the decode kernel**, once per page of the sequence:
  ``load_page`` (the block table read once: K and V rows into shared memory,
  each word loaded once for every row of the tile), ``qk_logits`` (a thread
  per (row, key) pair, and **the mask**: key ``j`` is seen by the query at
  position ``p`` when ``j <= p``, and ``j > p - sliding_window`` on a window
  layer), ``softmax_step`` and ``weighted_values``.
* **Online softmax across pages**: the decode kernel holds a whole sequence's
  logits and takes their max first; a tile of queries would need a row of
  logits per query, so each row keeps a running max ``m`` and sum ``l``
  instead, and rescales its accumulator by ``exp(m_old - m_new)`` whenever the
  max grows (FlashAttention's trick; vLLM's ``softmax_step``).
* Pages start at the first key the tile's first query can see (the window) and
  end at the tile's last query: a causal tile never reads a page past itself.

Every reduction here is one thread looping over a row, so there are no warp
shuffles and the body runs unchanged in the simulator (tiny sizes only).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from numba import cuda, float32, uint64

from ..errors import PagedKVValueError
from .backend import announce_simulator
from .cuda import _empty, _fast_thread_switching, _on_device, _on_tensors_gpu
from .cuda_device import NEG_INF
from .validate import UnifiedShape

BLOCK_M = 16  # query rows per tile, as vLLM's BLOCK_M for groups of up to 16 query heads
MAX_SHARED_BYTES = 48 * 1024  # numba's static shared memory per block


def block_q_for(shape: UnifiedShape) -> int:
    """Queries per tile for this batch (see :func:`choose_block_q`)."""
    return choose_block_q(shape.head_size, shape.block_size, shape.num_queries_per_kv, shape.max_query_len <= 1)


def choose_block_q(head_size: int, block_size: int, num_queries_per_kv: int, decodes_only: bool) -> int:
    """Queries per tile: 1 for a batch of decodes, else vLLM's ``BLOCK_M // num_queries_per_kv`` (at least 1),
    halved until the tile's shared memory fits."""
    block_q = 1 if decodes_only else max(1, BLOCK_M // num_queries_per_kv)
    while block_q > 1 and shared_bytes(head_size, block_size, block_q * num_queries_per_kv) > MAX_SHARED_BYTES:
        block_q //= 2
    return block_q


def shared_bytes(head_size: int, block_size: int, block_m: int) -> int:
    """The tile's queries, one page of K and V, its logits and three per-row floats, all float32."""
    return 4 * (block_m * head_size + 2 * block_size * head_size + block_m * block_size + 3 * block_m)


@functools.cache
def build_unified_kernel(head_size: int, block_size: int, num_threads: int, block_q: int, num_queries_per_kv: int,
                         sliding_window: int, jit: bool = True):
    """The kernel for one set of compile-time sizes (cached); ``sliding_window = 0`` is full attention.

    Launch it on ``(num_tokens // block_q + num_seqs, num_kv_heads)`` thread blocks of ``num_threads``.
    """
    group = num_queries_per_kv
    block_m = block_q * group  # the tile's rows: (query, head) pairs
    q_len_s, page_len, logits_len = block_m * head_size, block_size * head_size, block_m * block_size
    acc_len = -(-q_len_s // num_threads)  # output elements a thread owns (registers)
    window = sliding_window

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

    @cuda.jit(device=True)
    def stage_queries(q_s, query, first_token, q_tile_len, kv_head):
        """Row r of the tile: query ``r // group``, head ``kv_head * group + r % group``, as float32."""
        for j in range(cuda.threadIdx.x, q_len_s, num_threads):
            r, d = j // head_size, j % head_size
            q = float32(0.0)
            if r // group < q_tile_len:
                q = float32(query[first_token + r // group, kv_head * group + r % group, d])
            q_s[j] = q
        cuda.syncthreads()

    @cuda.jit(device=True)
    def load_page(k_s, v_s, key_cache, value_cache, physical_block_number, kv_head, page_start, seq_len):
        """One page's K and V rows for this KV head into shared memory; slots past the sequence read as zero."""
        for j in range(cuda.threadIdx.x, page_len, num_threads):
            physical_block_offset, d = j // head_size, j % head_size
            k, v = float32(0.0), float32(0.0)
            if page_start + physical_block_offset < seq_len:  # unsigned indices: no negative-index wraparound code
                slot = (uint64(physical_block_number), uint64(physical_block_offset), uint64(kv_head), uint64(d))
                k = float32(key_cache[slot])
                v = float32(value_cache[slot])
            k_s[uint64(j)] = k
            v_s[uint64(j)] = v
        cuda.syncthreads()

    @cuda.jit(device=True)
    def qk_logits(q_s, k_s, logits, page_start, first_pos, q_tile_len, scale):
        """A thread per (row, key) pair: ``q.k * scale``, or NEG_INF where the mask hides the key."""
        for j in range(cuda.threadIdx.x, logits_len, num_threads):
            r, physical_block_offset = j // block_size, j % block_size
            key_pos = page_start + physical_block_offset
            query_pos = first_pos + r // group
            visible = r // group < q_tile_len and key_pos <= query_pos  # causal (so also inside the sequence)
            if window:
                visible = visible and key_pos > query_pos - window
            logit = NEG_INF
            if visible:
                dot = float32(0.0)
                q_row, k_row = r * head_size, physical_block_offset * head_size
                for d in range(head_size):
                    dot += q_s[uint64(q_row + d)] * k_s[uint64(k_row + d)]
                logit = dot * scale
            logits[uint64(j)] = logit
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

    @cuda.jit(device=True)
    def weighted_values(logits, v_s, alpha_s, acc):
        """A thread per output element (row, dim), kept in registers across pages: rescale, then add p @ V."""
        k = 0
        for j in range(cuda.threadIdx.x, q_len_s, num_threads):
            r, d = j // head_size, j % head_size
            total = acc[k] * alpha_s[r]
            for i in range(block_size):
                total += logits[uint64(r * block_size + i)] * v_s[uint64(i * head_size + d)]
            acc[k] = total
            k += 1
        cuda.syncthreads()  # every thread is done with this page before the next one overwrites it

    def unified_attention(out, query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables, scale,
                          num_seqs):
        q_block_global_idx, kv_head = cuda.blockIdx.x, cuda.blockIdx.y
        seq = find_seq_idx(cu_seqlens_q, q_block_global_idx, num_seqs)
        q_block_local_idx = q_block_global_idx - (cu_seqlens_q[seq] // block_q + seq)
        q_len = cu_seqlens_q[seq + 1] - cu_seqlens_q[seq]
        if q_block_local_idx * block_q >= q_len:  # a spare tile (the grid is an upper bound): the block leaves
            return
        seq_len = seq_lens[seq]
        first_token = cu_seqlens_q[seq] + q_block_local_idx * block_q  # the tile's first query row
        q_tile_len = min(block_q, q_len - q_block_local_idx * block_q)
        first_pos = seq_len - q_len + q_block_local_idx * block_q  # its position in the sequence
        last_pos = first_pos + q_tile_len - 1
        q_s = cuda.shared.array(q_len_s, float32)
        k_s = cuda.shared.array(page_len, float32)
        v_s = cuda.shared.array(page_len, float32)
        logits = cuda.shared.array(logits_len, float32)
        m_s = cuda.shared.array(block_m, float32)  # running max per row
        l_s = cuda.shared.array(block_m, float32)  # running sum of exps per row
        alpha_s = cuda.shared.array(block_m, float32)
        for r in range(cuda.threadIdx.x, block_m, num_threads):
            m_s[r] = NEG_INF
            l_s[r] = float32(0.0)
        acc = cuda.local.array(acc_len, float32)
        for k in range(acc_len):
            acc[k] = float32(0.0)
        stage_queries(q_s, query, first_token, q_tile_len, kv_head)
        first_key = 0
        if window:
            first_key = max(0, first_pos - window + 1)
        for page in range(first_key // block_size, last_pos // block_size + 1):
            physical_block_number = block_tables[seq, page]  # the block table, read once per page
            page_start = page * block_size
            load_page(k_s, v_s, key_cache, value_cache, physical_block_number, kv_head, page_start, seq_len)
            qk_logits(q_s, k_s, logits, page_start, first_pos, q_tile_len, scale)
            softmax_step(logits, m_s, l_s, alpha_s)
            weighted_values(logits, v_s, alpha_s, acc)
        k = 0
        for j in range(cuda.threadIdx.x, q_len_s, num_threads):
            r, d = j // head_size, j % head_size
            if r // group < q_tile_len:
                out[first_token + r // group, kv_head * group + r % group, d] = acc[k] / l_s[r]
            k += 1

    return cuda.jit(unified_attention) if jit else unified_attention


def unified_attention_cuda(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables, shape: UnifiedShape,
                           simulator: bool | None = None, num_threads: int | None = None) -> torch.Tensor:
    """Launch the unified kernel (arguments already validated; ``shape`` from ``check_unified_args``)."""
    from . import CUDA_MODE

    announce_simulator()
    simulator = CUDA_MODE.simulator if simulator is None else simulator
    num_threads = num_threads or (16 if simulator else 128)
    block_q = block_q_for(shape)
    needed = shared_bytes(shape.head_size, shape.block_size, block_q * shape.num_queries_per_kv)
    if needed > MAX_SHARED_BYTES:
        raise PagedKVValueError(f"the unified CUDA kernel needs {needed} bytes of shared memory for head_size "
                                f"{shape.head_size}, block_size {shape.block_size} and {shape.num_queries_per_kv} "
                                f"query heads per KV head, over {MAX_SHARED_BYTES}; use backend='cpu' or 'torch', or "
                                "a smaller block_size.")
    kernel = build_unified_kernel(shape.head_size, shape.block_size, num_threads, block_q,
                                  shape.num_queries_per_kv, shape.sliding_window or 0)
    grid = (shape.num_tokens // block_q + shape.num_seqs, shape.num_kv_heads)
    with _fast_thread_switching(simulator), _on_tensors_gpu(query) as stream:
        args = [_on_device(t) for t in (query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables)]
        out = _empty((shape.num_tokens, shape.num_heads, shape.head_size), query)
        kernel[grid, num_threads, stream](out, *args, np.float32(shape.scale), np.int32(shape.num_seqs))
    result = out if isinstance(out, torch.Tensor) else torch.from_numpy(out.copy_to_host())
    return result.to(query.dtype)
