"""The numba.cuda paged attention kernels, written to be read next to vLLM's.

vLLM's CUDA version is ``csrc/attention/attention_kernels.cuh``
(``paged_attention_kernel`` and ``paged_attention_v2_reduce_kernel``).

One decode step: every sequence has one new query vector per head and attends
over all its cached tokens, which live in blocks scattered anywhere in the
cache.  The block table says where: token ``i`` of a sequence sits in physical
block ``block_table[i // block_size]`` at slot ``i % block_size``.

* **v1**: grid ``(num_heads, num_seqs)``, one thread block per (head, sequence),
  attends over the whole sequence.
* **v2** (flash-decoding): grid ``(num_heads, num_seqs, num_partitions)``; each
  thread block attends over one partition of the tokens and writes its max
  logit, its sum of exponentials and its partial output; a reduce kernel then
  rescales and combines the partitions.  More thread blocks for long contexts,
  and the logits of one partition always fit in shared memory.

Both call the same body, :func:`attend`, over a token range ``[start, end)``:
one thread per token for ``q.k``, a block-wide max and sum through a
shared-memory tree, one thread per output dim for ``p @ V``.  That is the
*teaching* kernel (flavour ``"tree"``), and the one the simulator runs.

It is not vLLM's mapping.  There a warp takes a whole KV block (one
block-table read), a *thread group* of ``max(32 // block_size, 1)`` threads
takes a token and splits ``head_size`` into vectors, and the logits live in
dynamic shared memory.  ``cuda_vllm.py`` does that in two flavours:
``"vllm"`` (a thread block per query head, as vLLM's CUDA kernel) and
``"vllm-gqa"`` (a thread block per KV head and all the query heads that share
it, as FlashInfer and vLLM's Triton kernel), the default on a GPU wherever its
sizes fit.  ``benchmarks/RESULTS.md`` ("Static kernel report") counts what
each costs.  The unified kernel (``cuda_unified.py``) runs those grouped
phases for its decode tiles and this file's reduce kernel for its split-KV
launch.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys

import numpy as np
import torch
from numba import cuda, float32

from ..errors import PagedKVValueError
from .backend import CudaMode, announce_simulator
from .cuda_device import NEG_INF, _add, _max, tree_reduction
from .cuda_vllm import FLAVOURS as VLLM_FLAVOURS
from .cuda_vllm import build_vllm_kernels, check_sizes, flat_words, heads_per_block

PARTITION_SIZE = 512  # v2's default partition, as in vLLM
MAX_V1_TOKENS = 8192  # 32 KB of float32 logits: v1 past this would overflow 48 KB of static shared memory
FLAVOURS = ("tree",) + VLLM_FLAVOURS


@functools.cache
def build_kernels(head_size: int, block_size: int, num_threads: int, logits_len: int, jit: bool = True):
    """Build the v1, v2 and reduce kernels for one set of compile-time sizes (cached).

    ``logits_len`` is how many tokens one thread block handles at most: the
    longest sequence for v1, the partition size for v2.  With ``jit=False`` the
    kernels come back as plain Python functions, for ``cuda.compile_ptx``.
    """
    if num_threads & (num_threads - 1) or num_threads < 1:
        raise PagedKVValueError(f"num_threads must be a power of two for the 'tree' kernel, got {num_threads}.")
    block_max = tree_reduction(_max, num_threads)
    block_sum = tree_reduction(_add, num_threads)

    @cuda.jit(device=True)
    def qk_logits(q_s, key_cache, block_table, kv_head, start, end, scale, logits):
        """Thread t computes q.k for tokens start+t, start+t+num_threads, ..."""
        local_max = NEG_INF
        for i in range(start + cuda.threadIdx.x, end, num_threads):
            block = block_table[i // block_size]  # the block table lookup: logical -> physical
            offset = i % block_size
            dot = float32(0.0)
            for d in range(head_size):
                dot += q_s[d] * float32(key_cache[block, offset, kv_head, d])
            logit = dot * scale
            logits[i - start] = logit
            local_max = max(local_max, logit)
        return local_max

    @cuda.jit(device=True)
    def weighted_values(logits, value_cache, block_table, kv_head, start, end, inv_sum, out_row):
        """Thread t owns output dims t, t+num_threads, ... and sums p_i * v_i over every token."""
        for d in range(cuda.threadIdx.x, head_size, num_threads):
            acc = float32(0.0)
            for i in range(start, end):
                block = block_table[i // block_size]
                acc += logits[i - start] * float32(value_cache[block, i % block_size, kv_head, d])
            out_row[d] = acc * inv_sum

    @cuda.jit(device=True)
    def attend(out_row, query_row, key_cache, value_cache, block_table, kv_head, start, end, scale,
               q_s, logits, red):
        """Softmax attention of one query over tokens [start, end); returns (max logit, sum of exps).

        out_row gets sum_i softmax_i * v_i, normalised over this range only.
        """
        tid = cuda.threadIdx.x
        for d in range(tid, head_size, num_threads):  # stage the query in shared memory, as float32
            q_s[d] = float32(query_row[d])
        cuda.syncthreads()
        m = block_max(red, qk_logits(q_s, key_cache, block_table, kv_head, start, end, scale, logits))
        local_sum = float32(0.0)
        for j in range(tid, end - start, num_threads):
            e = math.exp(logits[j] - m)  # subtract the max: exp never overflows
            logits[j] = e
            local_sum += e
        total = block_sum(red, local_sum)  # its barrier also publishes every logits[j] above
        weighted_values(logits, value_cache, block_table, kv_head, start, end,
                        float32(1.0) / total, out_row)
        return m, total

    def paged_attention_v1(out, query, key_cache, value_cache, block_tables, seq_lens, scale, num_queries_per_kv):
        head, seq = cuda.blockIdx.x, cuda.blockIdx.y
        kv_head = head // num_queries_per_kv  # GQA/MQA: a group of query heads shares one KV head
        q_s = cuda.shared.array(head_size, float32)
        logits = cuda.shared.array(logits_len, float32)
        red = cuda.shared.array(num_threads, float32)
        attend(out[seq, head], query[seq, head], key_cache, value_cache, block_tables[seq], kv_head,
               0, seq_lens[seq], scale, q_s, logits, red)

    def paged_attention_v2(tmp_out, max_logits, exp_sums, query, key_cache, value_cache, block_tables,
                           seq_lens, scale, num_queries_per_kv):
        head, seq, part = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
        start = part * logits_len
        seq_len = seq_lens[seq]
        if start >= seq_len:  # a shorter sequence: this partition is empty (the whole block leaves)
            return
        kv_head = head // num_queries_per_kv
        q_s = cuda.shared.array(head_size, float32)
        logits = cuda.shared.array(logits_len, float32)
        red = cuda.shared.array(num_threads, float32)
        m, total = attend(tmp_out[seq, head, part], query[seq, head], key_cache, value_cache, block_tables[seq],
                          kv_head, start, min(start + logits_len, seq_len), scale, q_s, logits, red)
        if cuda.threadIdx.x == 0:
            max_logits[seq, head, part] = m
            exp_sums[seq, head, part] = total

    kernels = (paged_attention_v1, paged_attention_v2)
    kernels = tuple(cuda.jit(k) for k in kernels) if jit else kernels
    return kernels + (build_reduce_kernel(head_size, num_threads, jit),)


@functools.cache
def build_reduce_kernel(head_size: int, num_threads: int, jit: bool = True):
    """v2's reduce (cached), shared by every flavour and by the unified kernel's split-KV (3-D) launch.

    Launch it on ``(num_heads, num_rows)`` thread blocks: row ``r`` of ``out`` combines the partitions
    ``tmp_out[r, head, p]`` of the ``seq_lens[r]`` tokens its query saw, ``partition_size`` tokens each.
    """

    def paged_attention_v2_reduce(out, tmp_out, max_logits, exp_sums, seq_lens, partition_size):
        """Combine partitions: partition p's output weighs exp_sum_p * exp(max_p - global max)."""
        head, seq = cuda.blockIdx.x, cuda.blockIdx.y
        num_partitions = (seq_lens[seq] + partition_size - 1) // partition_size
        global_max = NEG_INF
        for p in range(num_partitions):
            global_max = max(global_max, max_logits[seq, head, p])
        total = float32(0.0)
        for p in range(num_partitions):
            total += exp_sums[seq, head, p] * math.exp(max_logits[seq, head, p] - global_max)
        for d in range(cuda.threadIdx.x, head_size, num_threads):
            acc = float32(0.0)
            for p in range(num_partitions):
                weight = exp_sums[seq, head, p] * math.exp(max_logits[seq, head, p] - global_max)
                acc += tmp_out[seq, head, p, d] * weight
            out[seq, head, d] = acc / total

    return cuda.jit(paged_attention_v2_reduce) if jit else paged_attention_v2_reduce


def _kernels(shape, num_threads: int, flavour: str, logits_len: int, dtype: torch.dtype, simulator: bool):
    """(v1, v2, reduce) of a flavour; the vLLM-shaped ones share the tree flavour's reduce kernel."""
    tree = build_kernels(shape.head_size, shape.block_size, num_threads, logits_len)
    if flavour == "tree":
        return tree
    v1, v2 = build_vllm_kernels(shape.head_size, shape.block_size, num_threads, logits_len,
                                str(dtype).removeprefix("torch."), simulator,
                                heads_per_block(flavour, shape.num_queries_per_kv))
    return v1, v2, tree[2]


def max_v1_tokens(flavour: str, num_queries_per_kv: int) -> int:
    """The longest context v1 can hold: one thread block keeps every logit of its query heads in shared memory."""
    return MAX_V1_TOKENS // heads_per_block(flavour, num_queries_per_kv)


def uses_v1(num_seqs: int, num_heads: int, max_seq_len: int, v1_limit: int = MAX_V1_TOKENS) -> bool:
    """vLLM 0.6.3's choice (``use_v1`` in ``vllm/attention/ops/paged_attn.py``): v1 when the longest sequence fits
    (8,192 tokens there) and either one 512-token partition covers it or more than 512 (sequence, head) pairs keep
    the GPU busy; otherwise v2."""
    max_partitions = -(-max_seq_len // PARTITION_SIZE)
    return max_seq_len <= v1_limit and (max_partitions == 1 or num_seqs * num_heads > 512)


def _default_flavour(shape, dtype: torch.dtype, simulator: bool, partition_size: int | None = None) -> str:
    """The simulator runs the teaching kernel.  A GPU runs the grouped vLLM-shaped one when it can split these
    sizes and hold a group's logits (a forced v1 over a long context needs the per-head one)."""
    if simulator:
        return "tree"
    try:
        check_sizes(shape.head_size, shape.block_size, 128, str(dtype).removeprefix("torch."))
    except PagedKVValueError:
        return "tree"
    fits_v2 = shape.num_queries_per_kv * PARTITION_SIZE <= MAX_V1_TOKENS
    fits_v1 = shape.max_seq_len <= max_v1_tokens("vllm-gqa", shape.num_queries_per_kv)
    if fits_v2 and (partition_size != 0 or fits_v1):
        return "vllm-gqa"
    return "vllm"


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _on_device(t: torch.Tensor):
    """Hand a tensor to numba.cuda: CUDA tensors directly, CPU tensors copied to the device."""
    return t if t.is_cuda else cuda.to_device(t.numpy())


def _empty(shape, like: torch.Tensor):
    if like.is_cuda:
        return torch.empty(shape, dtype=torch.float32, device=like.device)
    return cuda.device_array(shape, dtype=np.float32)


@contextlib.contextmanager
def _on_tensors_gpu(query: torch.Tensor):
    """On a real GPU: launch on the tensors' device and on torch's current stream there, so the kernels are
    ordered with the torch work around them (vLLM's ops do the same). Elsewhere: the default stream, 0."""
    if not query.is_cuda:
        yield 0
        return
    with cuda.gpus[query.device.index]:
        yield cuda.external_stream(torch.cuda.current_stream(query.device).cuda_stream)


@contextlib.contextmanager
def _fast_thread_switching(simulator: bool):
    """The simulator runs one Python thread per CUDA thread and waits at every barrier for all of
    them; handing the GIL over every 0.1 ms instead of 5 ms makes a launch several times faster.
    (Frequent switches also expose a race in the simulator's shared arrays, which ``simfix`` locks.)"""
    previous = sys.getswitchinterval()
    if simulator:
        sys.setswitchinterval(1e-4)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def paged_attention_cuda(query, key_cache, value_cache, block_tables, seq_lens, shape, mode: CudaMode,
                         partition_size: int | None = None, flavour: str | None = None,
                         num_threads: int | None = None) -> torch.Tensor:
    """Launch v1 or v2 (arguments already validated; ``shape`` is their AttentionShape)."""
    announce_simulator()
    flavour = flavour or _default_flavour(shape, query.dtype, mode.simulator, partition_size)
    if flavour not in FLAVOURS:
        raise PagedKVValueError(f"flavour must be one of {', '.join(map(repr, FLAVOURS))}, got {flavour!r}.")
    num_threads = num_threads or (64 if flavour != "tree" and mode.simulator else 16 if mode.simulator else 128)
    v1_limit = max_v1_tokens(flavour, shape.num_queries_per_kv)
    if partition_size == 0:  # forced v1
        if shape.max_seq_len > v1_limit:
            raise PagedKVValueError(
                f"the {flavour!r} v1 kernel holds at most {v1_limit} tokens of logits per query head, and a "
                f"sequence has {shape.max_seq_len}; leave partition_size=None (v2) or use flavour='vllm'.")
        partition_size = None
    elif partition_size is None:  # vLLM's rule: v1 unless the context is long and the grid is small
        use_v1 = uses_v1(shape.num_seqs, shape.num_heads, shape.max_seq_len, v1_limit)
        partition_size = None if use_v1 else PARTITION_SIZE
    scale, group = np.float32(shape.scale), np.int32(shape.num_queries_per_kv)

    logits_len = partition_size or _next_power_of_two(max(shape.max_seq_len, 32))
    v1, v2, reduce = _kernels(shape, num_threads, flavour, logits_len, query.dtype, mode.simulator)  # checks sizes
    extra, grid_heads = (), shape.num_heads
    if flavour != "tree":  # they read the caches as flat 64-bit words, strided by the number of KV heads
        key_cache, value_cache = flat_words(key_cache), flat_words(value_cache)
        extra = (np.int32(shape.num_kv_heads),)
        grid_heads //= heads_per_block(flavour, shape.num_queries_per_kv)

    with _fast_thread_switching(mode.simulator), _on_tensors_gpu(query) as stream:
        args = [_on_device(t) for t in (query, key_cache, value_cache, block_tables, seq_lens)]
        out = _empty((shape.num_seqs, shape.num_heads, shape.head_size), query)
        if partition_size is None:
            v1[(grid_heads, shape.num_seqs), num_threads, stream](out, *args, scale, group, *extra)
        else:
            num_partitions = -(-shape.max_seq_len // partition_size)
            stats = (shape.num_seqs, shape.num_heads, num_partitions)
            tmp_out = _empty(stats + (shape.head_size,), query)
            max_logits, exp_sums = _empty(stats, query), _empty(stats, query)
            v2[(grid_heads, shape.num_seqs, num_partitions), num_threads, stream](
                tmp_out, max_logits, exp_sums, *args, scale, group, *extra)
            reduce[(shape.num_heads, shape.num_seqs), num_threads, stream](
                out, tmp_out, max_logits, exp_sums, args[-1], np.int32(partition_size))

    result = out if isinstance(out, torch.Tensor) else torch.from_numpy(out.copy_to_host())
    return result.to(query.dtype)
