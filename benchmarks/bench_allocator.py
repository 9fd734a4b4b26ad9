"""Allocator and manager throughput: allocate/free and a decode-like append workload.

    python benchmarks/bench_allocator.py

Prints ops per second for pools of 1k to 100k blocks (block_size 16).
"""

import random
import time

from pagedkv import BlockAllocator, BlockSpaceManager

from _common import best_of, machine

BLOCK_SIZE = 16


def allocate_free(num_blocks):
    """Allocate every block, then free them all: 2 * num_blocks operations."""
    a = BlockAllocator(num_blocks, BLOCK_SIZE)

    def run():
        ids = [a.allocate() for _ in range(num_blocks)]
        for block_id in ids:
            a.free(block_id)

    return 2 * num_blocks / best_of(run)


def decode_workload(num_blocks, seqs=64, prompt=200):
    """Admit sequences, append one token to each per step until the pool is nearly full, free all.

    Counts manager calls (allocate, append_slots, free) per second.
    """
    rng = random.Random(0)
    prompts = [[rng.randrange(32000) for _ in range(prompt)] for _ in range(seqs)]
    seconds, calls = float("inf"), 0
    for _ in range(2):  # best of two; building the pool is not timed
        m = BlockSpaceManager(BLOCK_SIZE, num_blocks, watermark=0.0)
        start = time.perf_counter()
        calls = 0
        for s in range(seqs):
            m.allocate(s, prompts[s])
            calls += 1
        while m.num_free_gpu_blocks > seqs:
            for s in range(seqs):
                m.append_slots(s, [1])
                calls += 1
        for s in range(seqs):
            m.free(s)
            calls += 1
        seconds = min(seconds, time.perf_counter() - start)
    return calls / seconds, calls


def main():
    print(f"machine: {machine()}")
    print(f"{'blocks':>8} {'allocate+free ops/s':>20} {'decode calls/s':>15} {'calls':>9}")
    for num_blocks in (1_000, 10_000, 100_000):
        ops = allocate_free(num_blocks)
        calls_per_s, calls = decode_workload(num_blocks)
        print(f"{num_blocks:>8,} {ops:>20,.0f} {calls_per_s:>15,.0f} {calls:>9,}")


if __name__ == "__main__":
    main()
