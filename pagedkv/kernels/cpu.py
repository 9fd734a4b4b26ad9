"""The numba CPU twin: the same paged algorithm, compiled with ``@njit(parallel=True)``.

It reads K/V pages in place through the block table (no gather), one
``(sequence, KV head)`` pair per parallel task, so with grouped-query
attention each page is read once for the whole group of query heads that
share it.  This is how notebooks run realistic sizes without a GPU.

numba's CPU target has no float16, so fp16 caches are read as raw 16-bit
patterns and turned into float32 through a 65,536-entry lookup table.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import float32, njit, prange, types
from numba.extending import overload

# reassoc/contract let LLVM vectorise the dot products; no 'nnan'/'ninf', so inf/nan stay exact.
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
HALF_TO_FLOAT = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)


def to_float32(x, lut):
    """A cache element as float32: fp16 bit patterns go through ``lut``, floats convert directly."""
    return lut[x] if isinstance(x, (int, np.integer)) else np.float32(x)


@overload(to_float32, inline="always")
def _to_float32_typed(x, lut):
    if isinstance(x, types.Integer):  # chosen once, at compile time, from the cache's dtype
        return lambda x, lut: lut[x]
    return lambda x, lut: float32(x)


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def paged_attention_cpu_kernel(out, query, key_cache, value_cache, block_tables, seq_lens, scale, lut):
    num_seqs, num_heads, head_size = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads  # query heads per KV head
    for task in prange(num_seqs * num_kv_heads):
        seq, kv_head = task // num_kv_heads, task % num_kv_heads
        seq_len = seq_lens[seq]
        q = np.empty((group, head_size), np.float32)
        for g in range(group):
            for d in range(head_size):
                q[g, d] = to_float32(query[seq, kv_head * group + g, d], lut)
        # Pass 1: logits, each key row read once for the whole group of query heads.
        logits = np.empty((group, seq_len), np.float32)
        for i in range(seq_len):
            block = block_tables[seq, i // block_size]  # logical block -> physical block
            offset = i % block_size
            for g in range(group):
                dot = float32(0.0)
                for d in range(head_size):
                    dot += q[g, d] * to_float32(key_cache[block, offset, kv_head, d], lut)
                logits[g, i] = dot * scale
        # Softmax per query head in float32, the max subtracted first so exp never overflows.
        for g in range(group):
            m = logits[g].max()
            total = float32(0.0)
            for i in range(seq_len):
                logits[g, i] = np.exp(logits[g, i] - m)
                total += logits[g, i]
            for i in range(seq_len):
                logits[g, i] /= total
        # Pass 2: weighted sum of value rows, each read once for the group.
        acc = np.zeros((group, head_size), np.float32)
        for i in range(seq_len):
            block = block_tables[seq, i // block_size]
            offset = i % block_size
            for g in range(group):
                p = logits[g, i]
                for d in range(head_size):
                    acc[g, d] += p * to_float32(value_cache[block, offset, kv_head, d], lut)
        for g in range(group):
            for d in range(head_size):
                out[seq, kv_head * group + g, d] = acc[g, d]


def paged_attention_cpu(query, key_cache, value_cache, block_tables, seq_lens, scale: float) -> torch.Tensor:
    """Run the CPU twin on CPU tensors (arguments already validated)."""
    half = query.dtype == torch.float16

    def as_numpy(t):
        return t.numpy().view(np.uint16) if half else t.numpy()

    out = np.empty(tuple(query.shape), np.float32)
    paged_attention_cpu_kernel(out, as_numpy(query), as_numpy(key_cache), as_numpy(value_cache), block_tables.numpy(),
           seq_lens.numpy(), np.float32(scale), HALF_TO_FLOAT)
    return torch.from_numpy(out).to(query.dtype)
