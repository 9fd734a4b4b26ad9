"""Device helpers every kernel file uses: constants, word loads and block-wide reductions.

``cuda.py`` (the teaching kernel and the launcher), ``cuda_vllm.py`` (the
grouped phases) and ``cuda_unified.py`` (the unified kernel) import from here
and not from each other's bodies.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint64

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
NEG_INF = np.float32(-3.4e38)  # "minus infinity" that stays finite, so max() needs no special case
WORD_BYTES = 8  # the kernels read the caches as flat 64-bit words: 4 fp16 or 2 fp32 values per load


def word_loader(element):
    """A device function: one 8-byte load from a flat int64 cache, unpacked in registers into ``element`` values."""

    @cuda.jit(device=True, inline=True)
    def load_word(cache_words, index, word):
        word[0] = cache_words[uint64(index)]  # unsigned: spares numba's negative-index wraparound code
        return word.view(element)

    return load_word


@cuda.jit(device=True, inline=True)
def _max(a, b):
    return max(a, b)


@cuda.jit(device=True, inline=True)
def _add(a, b):
    return a + b


def tree_reduction(combine, num_threads):
    """Block-wide reduction through shared memory: halve the active threads each round."""

    @cuda.jit(device=True)
    def reduce(red, value):
        tid = cuda.threadIdx.x
        red[tid] = value
        cuda.syncthreads()
        stride = num_threads // 2
        while stride > 0:
            if tid < stride:
                red[tid] = combine(red[tid], red[tid + stride])
            cuda.syncthreads()
            stride //= 2
        result = red[0]
        cuda.syncthreads()  # everyone has read red[0] before red is reused
        return result

    return reduce


def shuffle_reduction(combine, num_warps):
    """Block-wide reduction: butterfly shuffles inside each warp, then one value per warp through shared memory.

    A real GPU only: the simulator has no warps, so it takes :func:`tree_reduction` instead.
    """

    @cuda.jit(device=True)
    def reduce(red, value):
        lane, warp = cuda.threadIdx.x % WARP_SIZE, cuda.threadIdx.x // WARP_SIZE
        offset = WARP_SIZE // 2
        while offset > 0:
            value = combine(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
            offset //= 2
        if lane == 0:
            red[warp] = value
        cuda.syncthreads()
        result = red[0]
        for w in range(1, num_warps):
            result = combine(result, red[w])
        cuda.syncthreads()
        return result

    return reduce


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
