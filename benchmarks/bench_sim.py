"""The memory-waste simulator: Fig. 2 of the vLLM paper, a block-size sweep, and its own speed.

    python benchmarks/bench_sim.py
"""

import time

from pagedkv.sim import PARTS, max_concurrent_requests, simulate

from _common import machine

PAPER_TOKEN_STATES = {"reserve_max": "20.4%", "reserve_pow2": "26.8%", "oracle": "38.2%", "paged": "96.3%"}


def main():
    print(f"machine: {machine()}")
    print("ShareGPT-like workload, 2,000 requests, budget 15,700 token slots (OPT-13B on A100-40GB), "
          "block 16, max length 2,048; time-averaged while requests wait")
    print(f"{'policy':<13}" + "".join(f"{p:>24}" for p in PARTS) + f"{'running':>9}{'done/1k steps':>15}   paper")
    for policy in PAPER_TOKEN_STATES:
        r = simulate(policy, "sharegpt", num_requests=2000, progress=False)
        print(f"{policy:<13}" + "".join(f"{r.breakdown[p]:>24.1%}" for p in PARTS)
              + f"{r.mean_running:>9.1f}{r.finished_per_1000_steps:>15.1f}   {PAPER_TOKEN_STATES[policy]}")

    print("\nblock-size sweep (paged, ShareGPT-like, 1,000 requests)")
    print(f"{'block':>6} {'token states':>13} {'unfilled slots':>15} {'table entries/req':>18}")
    for block_size in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        r = simulate("paged", "sharegpt", num_requests=1000, block_size=block_size, progress=False)
        entries = (161.31 + 337.99) / block_size
        print(f"{block_size:>6} {r.breakdown['token_states']:>13.1%} "
              f"{r.breakdown['reservation'] + r.breakdown['internal_fragmentation']:>15.1%} {entries:>18.1f}")

    print("\nrequests of 500 tokens that fit at once in 15,700 slots (OPT-13B, A100-40GB)")
    for policy in PAPER_TOKEN_STATES:
        print(f"  {policy:<13} {max_concurrent_requests(policy):>4}")

    start = time.perf_counter()
    r = simulate("paged", "sharegpt", num_requests=10_000, progress=False)
    print(f"\nspeed: 10,000 ShareGPT-like requests, paged policy: {time.perf_counter() - start:.1f} s "
          f"({r.steps:,} steps, {r.preemptions:,} preemptions; one core)")


if __name__ == "__main__":
    main()
