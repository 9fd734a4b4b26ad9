"""Paged attention speed.

    python benchmarks/bench_attention.py            # CPU: the numba twin vs torch SDPA
    python benchmarks/bench_attention.py --gpu      # GPU: the numba.cuda kernels vs torch baselines
    python benchmarks/bench_attention.py --static   # no GPU: registers, occupancy, SASS per token (perf extra)

CPU case: 32 seqs x 32 heads x head 128 x 1,024 tokens, block 16, fp32.
  * twin:            paged_attention(backend="cpu"), reading the pages in place
  * sdpa pre-gathered: torch SDPA on K/V already laid out densely (the best a dense kernel can do)
  * gather + sdpa:   copy each sequence's pages out through its block table, then SDPA
GPU case: batch 64, 32 query heads, 8 KV heads, head 128, fp16, block 16, contexts 512..8,192;
achieved bandwidth = (K + V bytes read) / time, against a device-to-device copy.
"""

import argparse
import sys

import torch
import torch.nn.functional as F

from pagedkv import paged_attention
from pagedkv.kernels import CUDA_MODE

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


def gpu_case():
    if CUDA_MODE.simulator or not torch.cuda.is_available():
        print(f"no GPU run: {CUDA_MODE.describe()}; torch.cuda.is_available() = {torch.cuda.is_available()}")
        return 1
    from pagedkv.kernels import check_attention_args
    from pagedkv.kernels.cuda import paged_attention_cuda

    buf = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    copy = cuda_time(lambda: buf.clone())
    copy_bw = 2 * buf.numel() / copy / 1e9  # read + write
    print(f"device: {torch.cuda.get_device_name()}, copy bandwidth {copy_bw:.0f} GB/s")
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        has_flex = True
    except ImportError:
        has_flex = False
    print(f"{'context':>7} {'kernel':<14} {'ms':>8} {'GB/s':>7} {'% copy':>7}  vs gather+SDPA  vs dense SDPA")
    for seq_len in (512, 1024, 2048, 4096, 8192):
        case = make_paged(64, 32, 8, 128, seq_len, 16, torch.float16, "cuda")
        query, key_cache, value_cache, tables, seq_lens = case
        shape = check_attention_args(*case)
        k, v = gather_dense(key_cache, value_cache, tables, seq_len, 4)
        bytes_read = 2 * 64 * seq_len * 8 * 128 * 2
        dense = cuda_time(lambda: sdpa(query, k, v))
        gathered = cuda_time(lambda: sdpa(query, *gather_dense(key_cache, value_cache, tables, seq_len, 4)))
        for flavour in ("tree", "shuffle"):
            for part in (None, 512):
                t = cuda_time(lambda: paged_attention_cuda(*case, shape, CUDA_MODE, part, flavour=flavour))
                name = f"{flavour}/{'v2' if part else 'v1'}"
                print(f"{seq_len:>7} {name:<14} {t * 1e3:8.3f} {bytes_read / t / 1e9:7.0f} "
                      f"{bytes_read / t / 1e9 / copy_bw:7.0%}  {gathered / t:12.1f}x {dense / t:11.2f}x")
    if not has_flex:
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
