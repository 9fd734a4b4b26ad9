"""Paged attention speed.

    python benchmarks/bench_attention.py            # CPU: the numba twin vs torch SDPA
    python benchmarks/bench_attention.py --gpu      # GPU: the numba.cuda kernels vs torch baselines
    python benchmarks/bench_attention.py --static   # no GPU: registers, occupancy, SASS per token (perf extra)

CPU case: 32 seqs x 32 heads x head 128 x 1,024 tokens, block 16, fp32.
  * twin:            paged_attention(backend="cpu"), reading the pages in place
  * sdpa pre-gathered: torch SDPA on K/V already laid out densely (the best a dense kernel can do)
  * gather + sdpa:   copy each sequence's pages out through its block table, then SDPA
GPU case: batch 64, 32 query heads, 8 KV heads, head 128, fp16, block 16, contexts 512..8,192; every flavour
(tree, vllm, vllm-gqa) as v1 and v2, each checked against SDPA before it is timed; achieved bandwidth =
(unique K + V bytes) / time, against a device-to-device copy measured on the same GPU; baselines: SDPA on
pre-gathered K/V, gather + SDPA, and FlexAttention (compiled, pre-gathered) where torch has it.
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from pagedkv import paged_attention
from pagedkv.kernels import CUDA_MODE
from pagedkv.kernels.cuda import max_v1_tokens

from _common import best_of, machine


def make_paged(num_seqs, num_heads, num_kv_heads, head_size, seq_len, block_size, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).to(device)
    value_cache = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).to(device)
    tables = torch.randperm(num_blocks, generator=g).view(num_seqs, blocks_per_seq).to(torch.int32).to(device)
    query = torch.randn((num_seqs, num_heads, head_size), generator=g).to(dtype).to(device)
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device)
    return query, key_cache, value_cache, tables, seq_lens


def gather_dense(key_cache, value_cache, tables, seq_len, group):
    """[seqs, heads, tokens, head_size] K and V copied out of the pages."""
    k = key_cache[tables.long()].flatten(1, 2)[:, :seq_len]  # [seqs, tokens, kv_heads, head_size]
    v = value_cache[tables.long()].flatten(1, 2)[:, :seq_len]
    k = k.transpose(1, 2).repeat_interleave(group, dim=1)
    v = v.transpose(1, 2).repeat_interleave(group, dim=1)
    return k.contiguous(), v.contiguous()


def sdpa(query, k, v):
    return F.scaled_dot_product_attention(query.unsqueeze(2), k, v).squeeze(2)


def cpu_case():
    case = make_paged(32, 32, 32, 128, 1024, 16, torch.float32, "cpu")
    query, key_cache, value_cache, tables, seq_lens = case
    k, v = gather_dense(key_cache, value_cache, tables, 1024, 1)
    out = paged_attention(*case, backend="cpu")  # also compiles the twin before timing
    torch.testing.assert_close(out, sdpa(query, k, v), atol=1e-4, rtol=1e-4)
    twin = best_of(lambda: paged_attention(*case, backend="cpu"), 5)
    dense = best_of(lambda: sdpa(query, k, v), 5)
    gathered = best_of(lambda: sdpa(query, *gather_dense(key_cache, value_cache, tables, 1024, 1)), 5)
    gib = 2 * key_cache.numel() * 4 / 2**30
    print(f"machine: {machine()}, torch threads {torch.get_num_threads()}")
    print("CPU, 32 seqs x 32 heads x head 128 x 1,024 tokens, block 16, fp32 "
          f"({gib:.2f} GiB of K+V)")
    print(f"  numba CPU twin      {twin * 1e3:8.1f} ms  {gib / twin:6.2f} GiB/s")
    print(f"  SDPA pre-gathered   {dense * 1e3:8.1f} ms  {gib / dense:6.2f} GiB/s")
    print(f"  gather + SDPA       {gathered * 1e3:8.1f} ms  {gib / gathered:6.2f} GiB/s")
    print(f"  twin / SDPA pre-gathered = {twin / dense:.2f} (target <= 1.0);  "
          f"gather+SDPA / twin = {gathered / twin:.1f}x (target >= 5x)")


def cuda_time(fn, repeat=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def flex_baseline():
    """FlexAttention (torch >= 2.5) compiled, on pre-gathered K/V with GQA; None where it is missing or fails."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return None
    compiled = torch.compile(flex_attention)
    return lambda query, k, v: compiled(query.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)


def copy_bandwidth(num_bytes=2**30):
    """GB/s of a device-to-device copy (read + write): the ceiling a memory-bound kernel is measured against."""
    buf = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    return 2 * num_bytes / cuda_time(lambda: buf.clone()) / 1e9


def gpu_case():
    if CUDA_MODE.simulator or not torch.cuda.is_available():
        print(f"no GPU run: {CUDA_MODE.describe()}; torch.cuda.is_available() = {torch.cuda.is_available()}")
        return 1
    from pagedkv.kernels import check_attention_args
    from pagedkv.kernels.cuda import paged_attention_cuda

    copy_bw = copy_bandwidth()
    print(f"machine: {machine()}; device: {torch.cuda.get_device_name()}, device-to-device copy {copy_bw:.0f} GB/s")
    print("batch 64, 32 query heads / 8 KV heads, head 128, fp16, block 16; GB/s = unique K+V bytes / time")
    flex = flex_baseline()
    print(f"{'context':>7} {'kernel':<16} {'ms':>8} {'GB/s':>7} {'% copy':>7}  vs gather+SDPA  vs dense SDPA")
    for seq_len in (512, 1024, 2048, 4096, 8192):
        case = make_paged(64, 32, 8, 128, seq_len, 16, torch.float16, "cuda")
        query, key_cache, value_cache, tables, seq_lens = case
        shape = check_attention_args(*case)
        k, v = gather_dense(key_cache, value_cache, tables, seq_len, 4)
        expected = sdpa(query, k, v).float()
        bytes_read = 2 * 64 * seq_len * 8 * 128 * 2

        def row(name, fn, t_dense=None, t_gathered=None):
            t = cuda_time(fn)
            extra = f"  {t_gathered / t:12.1f}x {t_dense / t:11.2f}x" if t_dense else ""
            print(f"{seq_len:>7} {name:<16} {t * 1e3:8.3f} {bytes_read / t / 1e9:7.0f} "
                  f"{bytes_read / t / 1e9 / copy_bw:7.0%}{extra}")
            return t

        dense = row("SDPA pre-gathered", lambda: sdpa(query, k, v))
        gathered = row("gather + SDPA", lambda: sdpa(query, *gather_dense(key_cache, value_cache, tables, seq_len, 4)))
        if flex is not None:
            try:
                k8, v8 = (x[:, ::4].contiguous() for x in (k, v))  # FlexAttention does the GQA itself
                torch.testing.assert_close(flex(query, k8, v8).float(), expected, atol=2e-2, rtol=2e-2)
                row("Flex pre-gathered", lambda: flex(query, k8, v8))
            except Exception as error:  # an old torch or an unsupported shape: say so, keep going
                print(f"{seq_len:>7} FlexAttention failed: {type(error).__name__}: {str(error)[:80]}")
        for flavour in ("tree", "vllm", "vllm-gqa"):
            for part, version in ((0, "v1"), (512, "v2")):
                if part == 0 and seq_len > max_v1_tokens(flavour, shape.num_queries_per_kv):
                    print(f"{seq_len:>7} {flavour}/v1: the group's logits do not fit shared memory; v2 only")
                    continue
                run = lambda: paged_attention_cuda(*case, shape, CUDA_MODE, part, flavour=flavour)
                error = (run().float() - expected).abs().max().item()  # checked before it is timed
                if error > 2e-2:
                    print(f"{seq_len:>7} {flavour}/{version}: WRONG, max error {error:.3g} against SDPA; not timed")
                    return 1
                row(f"{flavour}/{version}", run, dense, gathered)
    if flex is None:
        print("FlexAttention is not in this torch; no comparison with it.")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run the GPU case")
    parser.add_argument("--static", action="store_true",
                        help="the static report (pagedkv.kernels.static_report), no GPU needed")
    args = parser.parse_args()
    if args.static:  # in its own process: numba.cuda must start in real (not simulator) mode to compile
        import os
        import subprocess
        env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PAGEDKV_QUIET": "1"}
        return subprocess.run([sys.executable, "-m", "pagedkv.kernels.static_report"], env=env).returncode
    return gpu_case() if args.gpu else cpu_case()


if __name__ == "__main__":
    sys.exit(main())
