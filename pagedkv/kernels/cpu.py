"""The numba CPU twin: the same paged algorithm, compiled with ``@njit(parallel=True)``.

It reads K/V pages in place through the block table (no gather).  A parallel
task is one sequence (or, for small batches, a run of its KV heads): for each
token it streams the token's keys for all its heads, which lie side by side in
the page, and with grouped-query attention each key and value row is read once
for the whole group of query heads that share it.  This is how notebooks run realistic sizes without a GPU.

numba's CPU target has no float16, so fp16 caches are read as raw 16-bit
patterns and turned into float32 through a 65,536-entry lookup table.
"""

from __future__ import annotations

import numba
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
def paged_attention_cpu_kernel(out, query, key_cache, value_cache, block_tables, seq_lens, scale, lut,
                               kv_heads_per_task, sliding_window):
    num_seqs, num_heads, head_size = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads  # query heads per KV head
    chunks = (num_kv_heads + kv_heads_per_task - 1) // kv_heads_per_task
    for task in prange(num_seqs * chunks):  # one task: one sequence, a run of neighbouring KV heads
        seq = task // chunks
        kv_first = (task % chunks) * kv_heads_per_task
        kv_last = min(kv_first + kv_heads_per_task, num_kv_heads)
        h_first, h_last = kv_first * group, kv_last * group  # the query heads those KV heads serve
        seq_len = seq_lens[seq]
        first = max(0, seq_len - sliding_window) if sliding_window > 0 else 0  # a window: the last tokens only
        q = np.empty((h_last - h_first, head_size), np.float32)
        for h in range(h_first, h_last):
            for d in range(head_size):
                q[h - h_first, d] = to_float32(query[seq, h, d], lut)
        # Pass 1: logits. For each token, its keys for our KV heads sit side by side in the page,
        # so the loop streams through memory; each key row is read once for its whole group.
        logits = np.empty((h_last - h_first, seq_len - first), np.float32)
        for i in range(first, seq_len):
            block = block_tables[seq, i // block_size]  # logical block -> physical block
            keys = key_cache[block, i % block_size]  # [num_kv_heads, head_size], read in place
            for h in range(h_first, h_last):
                key = keys[h // group]
                dot = float32(0.0)
                for d in range(head_size):
                    dot += q[h - h_first, d] * to_float32(key[d], lut)
                logits[h - h_first, i - first] = dot * scale
        # Softmax per query head in float32, the max subtracted first so exp never overflows.
        for r in range(h_last - h_first):
            m = logits[r].max()
            total = float32(0.0)
            for i in range(seq_len - first):
                logits[r, i] = np.exp(logits[r, i] - m)
                total += logits[r, i]
            for i in range(seq_len - first):
                logits[r, i] /= total
        # Pass 2: the probability-weighted sum of value rows, streamed the same way.
        acc = np.zeros((h_last - h_first, head_size), np.float32)
        for i in range(first, seq_len):
            block = block_tables[seq, i // block_size]
            values = value_cache[block, i % block_size]
            for h in range(h_first, h_last):
                p = logits[h - h_first, i - first]
                value = values[h // group]
                for d in range(head_size):
                    acc[h - h_first, d] += p * to_float32(value[d], lut)
        for h in range(h_first, h_last):
            for d in range(head_size):
                out[seq, h, d] = acc[h - h_first, d]


def paged_attention_cpu(query, key_cache, value_cache, block_tables, seq_lens, scale: float,
                        sliding_window: int | None = None) -> torch.Tensor:
    """Run the CPU twin on CPU tensors (arguments already validated); ``sliding_window``: only each sequence's
    last ``sliding_window`` tokens (a decode's window, for ``unified_paged_attention``)."""
    half = query.dtype == torch.float16

    def as_numpy(t):
        return t.numpy().view(np.uint16) if half else t.numpy()

    num_seqs, num_kv_heads = query.shape[0], key_cache.shape[2]
    # Enough tasks to keep every core busy; otherwise whole sequences, so each task streams whole pages.
    splits = min(num_kv_heads, max(1, -(-2 * numba.get_num_threads() // max(num_seqs, 1))))
    out = np.empty(tuple(query.shape), np.float32)
    paged_attention_cpu_kernel(out, as_numpy(query), as_numpy(key_cache), as_numpy(value_cache),
                               block_tables.numpy(), seq_lens.numpy(), np.float32(scale), HALF_TO_FLOAT,
                               -(-num_kv_heads // splits), sliding_window or 0)
    return torch.from_numpy(out).to(query.dtype)
