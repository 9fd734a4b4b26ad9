"""Scheduler speed: steps per second with 256 running requests, and the simulator on the scheduler's loop.

    python benchmarks/bench_scheduler.py

One core (the scheduler is plain Python); the stand-in model costs nothing, so this is the scheduler alone.
Each figure is the best of three runs (the least disturbed), printed with the machine's Python speed at the time.
"""

import time

from pagedkv import BlockSpaceManager
from pagedkv.scheduler import Scheduler
from pagedkv.sim import simulate

from _common import best_of, machine, python_speed


def steps_per_second(num_running=256, prompt_len=128, num_steps=400, block_size=16):
    """Decode steps of ``num_running`` requests in a pool with room for all of them (no preemption)."""
    blocks = num_running * ((prompt_len + num_steps) // block_size + 2)
    scheduler = Scheduler(BlockSpaceManager(block_size, blocks), max_num_seqs=num_running,
                          max_num_batched_tokens=max(2048, num_running * prompt_len))
    for i in range(num_running):
        scheduler.add_request(i, [1] * prompt_len, max_tokens=num_steps + 10)
    out = scheduler.schedule()  # the prefill step is not timed
    scheduler.update(out, dict.fromkeys(out.scheduled, 1))
    start = time.perf_counter()
    for _ in range(num_steps):
        out = scheduler.schedule()
        scheduler.update(out, dict.fromkeys(out.scheduled, 1))
    elapsed = time.perf_counter() - start
    assert len(out.decodes) == num_running
    return num_steps / elapsed, num_steps * num_running / elapsed


def main():
    print(f"machine: {machine()}; a 5M-iteration Python loop takes {python_speed():.2f} s now")
    steps, tokens = max(steps_per_second() for _ in range(3))
    print(f"256 running requests: {steps:,.0f} scheduler steps/s ({tokens:,.0f} decode slots/s)")
    for mode in ("recompute", "swap"):
        runs = []
        seconds = best_of(lambda: runs.append(simulate("paged", "sharegpt", num_requests=10_000, progress=False,
                                                       preemption_mode=mode)))
        r = runs[-1]
        print(f"simulator, 10,000 ShareGPT-like requests, paged, {mode}: {seconds:.1f} s "
              f"({r.steps:,} steps, {r.preemptions:,} preemptions, {r.recomputed_tokens:,} tokens recomputed, "
              f"{r.swapped_blocks:,} blocks swapped out)")


if __name__ == "__main__":
    main()
