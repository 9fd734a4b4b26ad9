"""Memory saved by block sharing in parallel sampling and beam search, beside the vLLM paper's figures.

    python benchmarks/bench_sharing.py [--requests 40]

Workloads are synthetic (``pagedkv.sim.synthetic_lengths``): prompt and
output lengths drawn from log-normal distributions whose means match the
paper's datasets (Alpaca 19.31 in / 58.45 out, ShareGPT 161.31 / 337.99),
sigma 0.6 for Alpaca's short, similar instructions and 0.9 for ShareGPT's
long-tailed conversations, at most 2,048 tokens a request.  Log-normal because
both datasets' lengths are right-skewed with a long tail.  Savings = 1 - (sum of per-request peak blocks with sharing) /
(sum without sharing), block size 16. Every request runs through ``LLMEngine`` on the shipped tiny Llama (a
sequence group: fork, copy-on-write, dropped beams freed; see pagedkv.decoding), lengths capped so that prompt
and output fit its 1,024 positions.
"""

import argparse

from pagedkv.decoding import run_decoding, synthetic_prompt
from pagedkv.sim import synthetic_lengths

from _common import machine

DATASETS = ("alpaca", "sharegpt")
PAPER = {  # vLLM paper (OPT-13B), widths 2 to 6: Alpaca in Fig. 15, ShareGPT in §6.3's text
    ("parallel", "alpaca"): "6.1 - 9.8%", ("beam", "alpaca"): "37.6 - 55.2%",
    ("parallel", "sharegpt"): "16.2 - 30.5%", ("beam", "sharegpt"): "44.3 - 66.3%",
}


def savings(mode, width, dataset, requests, seed=0):
    shared = unshared = 0
    for i, (p, o) in enumerate(synthetic_lengths(dataset, requests, seed)):
        p, o = min(p, 512), min(o, 1024 - min(p, 512))  # the tiny Llama's 1,024 positions
        result = run_decoding(mode, width, synthetic_prompt(p, seed=i), o, block_size=16, seed=i)
        shared += result.peak_in_use
        unshared += result.peak_without_sharing
    return 1 - shared / unshared


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    print(f"machine: {machine()}; {args.requests} requests per cell, block size 16")
    print(f"{'mode':<9} {'dataset':<9} {'width 2':>8} {'width 4':>8} {'width 6':>8}   paper (OPT-13B)")
    for mode in ("parallel", "beam"):
        for dataset in DATASETS:
            row = [savings(mode, w, dataset, args.requests) for w in (2, 4, 6)]
            print(f"{mode:<9} {dataset:<9} " + " ".join(f"{s:>8.1%}" for s in row) + f"   {PAPER[mode, dataset]}")


if __name__ == "__main__":
    main()
