"""Paged attention speed.

    python benchmarks/bench_attention.py            # CPU: the numba twin vs torch SDPA
    python benchmarks/bench_attention.py --gpu      # GPU: the numba.cuda kernels vs torch baselines
    python benchmarks/bench_attention.py --static   # no GPU: registers, occupancy, SASS per token (perf extra)
    python benchmarks/bench_attention.py --unified  # CPU: unified_paged_attention on mixed batches vs SDPA

CPU case: 32 seqs x 32 heads x head 128 x 1,024 tokens, block 16, fp32.
  * twin:            paged_attention(backend="cpu"), reading the pages in place
  * sdpa pre-gathered: torch SDPA on K/V already laid out densely (the best a dense kernel can do)
  * gather + sdpa:   copy each sequence's pages out through its block table, then SDPA
GPU case: batch 64, 32 query heads, 8 KV heads, head 128, fp16, block 16, contexts 512..8,192; every flavour
(tree, vllm, vllm-gqa) as v1 and v2, each checked against SDPA before it is timed; achieved bandwidth =
(unique K + V bytes) / time, against a device-to-device copy measured on the same GPU; baselines: SDPA on
pre-gathered K/V, gather + SDPA, and FlexAttention (compiled, pre-gathered) where torch has it.
Then unified_paged_attention's CUDA kernel (one launch per layer) on a decode-only batch (2-D, and 3-D split-KV for
4 long sequences), a prefill-only batch and a mixed one, each checked against SDPA per sequence before it is timed.
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


# ---------------------------------------------------------------- unified_paged_attention on mixed batches (CPU)
UNIFIED_CASES = {  # name: (q_lens, seq_lens); SmolLM2's attention: 9 query heads, 3 KV heads, head 64
    "32 decodes": ([1] * 32, [50 + (i * 89) % 650 for i in range(32)]),
    "a 512 chunk + 31 decodes": ([512] + [1] * 31, [1024] + [50 + (i * 89) % 650 for i in range(31)]),
    "4 prompts, 2 after prefix hits": ([100, 200, 300, 150], [100, 400, 300, 250]),
    "one 1,500-token prompt": ([1500], [1500]),
}


def unified_case(q_lens, seq_lens, block_size=16, num_heads=9, num_kv_heads=3, head_size=64, seed=0):
    """A mixed batch on the CPU: pages shuffled over the cache, float32 (the GPU case converts it)."""
    from pagedkv.kernels import UnifiedAttentionMetadata

    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq)
    order = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros((len(seq_lens), max(per_seq)), dtype=torch.int32)
    for s, n in enumerate(per_seq):
        tables[s, :n], order = order[:n], order[n:]
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache, value_cache = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    query = torch.randn((sum(q_lens), num_heads, head_size), generator=g)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return query, key_cache, value_cache, UnifiedAttentionMetadata(cu, lens, tables)


def per_sequence(query, key_cache, value_cache, meta, gathered=None):
    """The engine's old path: each prefill's pages gathered (or given pre-gathered) and attended alone with SDPA
    (``causal_attention``), the decodes through ``paged_attention``'s CPU twin."""
    from pagedkv.kernels import gather_kv
    from pagedkv.model import causal_attention

    out, starts, lens = torch.empty_like(query), meta.cu_seqlens_q.tolist(), meta.seq_lens.tolist()
    decodes = [s for s in range(len(lens)) if starts[s + 1] - starts[s] == 1]
    for s, seq_len in enumerate(lens):
        rows = slice(starts[s], starts[s + 1])
        if s not in decodes or gathered:
            k, v = gathered[s] if gathered else gather_kv(key_cache, value_cache, meta.block_tables[s], seq_len)
            out[rows] = causal_attention(query[rows], k, v, seq_len - (rows.stop - rows.start))
    if decodes and not gathered:
        rows = [starts[s] for s in decodes]
        out[rows] = paged_attention(query[rows], key_cache, value_cache, meta.block_tables[decodes].contiguous(),
                                    meta.seq_lens[decodes], backend="cpu")
    return out


def one_rectangle(query, key_cache, value_cache, meta):
    """Every sequence padded to the longest chunk and the longest context: one SDPA for the whole batch."""
    from pagedkv.kernels.unified import CpuPlan, _chunks
    from pagedkv.kernels.validate import check_unified_args

    shape = check_unified_args(query, key_cache, value_cache, meta.cu_seqlens_q, meta.seq_lens, meta.block_tables)
    q_lens = meta.cu_seqlens_q[1:] - meta.cu_seqlens_q[:-1]
    everyone = _chunks(torch.arange(len(q_lens)), meta.cu_seqlens_q, q_lens, meta.seq_lens, meta.block_tables, shape)
    no_decodes = torch.zeros(0, dtype=torch.long)
    return CpuPlan(shape, no_decodes, meta.block_tables[:0], meta.seq_lens[:0], [everyone]).run(query, key_cache,
                                                                                               value_cache)


def unified_cpu_case():
    from pagedkv.kernels import UnifiedAttentionMetadata, gather_kv

    print(f"machine: {machine()}, torch threads {torch.get_num_threads()}")
    print("unified_paged_attention, CPU path, float32, block 16, SmolLM2's attention (9 query heads, 3 KV heads, "
          "head 64); best of 7, ms per layer")
    print(f"{'batch':<32} {'rows':>5} {'unified':>8} {'+ meta':>8} {'old path':>9} {'SDPA pre-g.':>11} "
          f"{'1 rectangle':>11}")
    for name, (q_lens, seq_lens) in UNIFIED_CASES.items():
        query, key_cache, value_cache, meta = unified_case(q_lens, seq_lens)
        gathered = [gather_kv(key_cache, value_cache, meta.block_tables[s], n) for s, n in enumerate(seq_lens)]
        expected = per_sequence(query, key_cache, value_cache, meta, gathered)
        runs = {
            "unified": lambda: meta.attend(query, key_cache, value_cache, backend="cpu"),
            "+ meta": lambda: UnifiedAttentionMetadata(meta.cu_seqlens_q, meta.seq_lens, meta.block_tables).attend(
                query, key_cache, value_cache, backend="cpu"),
            "old path": lambda: per_sequence(query, key_cache, value_cache, meta),
            "SDPA pre-g.": lambda: per_sequence(query, key_cache, value_cache, meta, gathered),
            "1 rectangle": lambda: one_rectangle(query, key_cache, value_cache, meta),
        }
        times = {}
        for label, run in runs.items():
            torch.testing.assert_close(run(), expected, atol=1e-4, rtol=1e-4)  # checked before it is timed
            times[label] = best_of(run, 7) * 1e3
        print(f"{name:<32} {len(query):>5} " + " ".join(f"{times[k]:>{len(k) if len(k) > 8 else 8}.2f}"
                                                      for k in runs))
    print("unified: metadata built once per step (every layer after the first); + meta: built for this call; "
          "old path: the engine before (a gather + SDPA per prefill, the numba twin for the decodes); SDPA pre-g.: "
          "SDPA per sequence on K/V gathered beforehand (not timed); 1 rectangle: the whole batch padded into one SDPA")
    return 0


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
    flex, wrong = flex_baseline(), 0
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
                    wrong += 1
                    continue
                row(f"{flavour}/{version}", run, dense, gathered)
    if flex is None:
        print("FlexAttention is not in this torch; no comparison with it.")
    return gpu_unified_case() or int(wrong > 0)  # a wrong flavour is reported, the rest still measured


GPU_UNIFIED_CASES = {  # name: (q_lens, seq_lens); 32 query heads, 8 KV heads, head 128, fp16, block 16
    "decode-only, 64 x 2,048": ([1] * 64, [2048] * 64),
    "decode-only, 4 x 16,384 (3-D)": ([1] * 4, [16384] * 4),
    "prefill-only, 4 x 2,048": ([2048] * 4, [2048] * 4),
    "mixed: 1 chunk of 512 + 63 decodes": ([512] + [1] * 63, [2048] * 64),
}


def gpu_unified_case():
    """unified_paged_attention's kernel on the GPU: ms per layer and unique K+V bytes per second."""
    from pagedkv.kernels import UnifiedAttentionMetadata, gather_kv

    print("unified_paged_attention (cuda), 32 query heads / 8 KV heads, head 128, fp16, block 16")
    print(f"{'batch':<36} {'ms':>8} {'GB/s':>7}  vs SDPA per sequence (pre-gathered)")
    wrong = 0
    for name, (q_lens, seq_lens) in GPU_UNIFIED_CASES.items():
        query, key_cache, value_cache, meta = unified_case(q_lens, seq_lens, num_heads=32, num_kv_heads=8,
                                                           head_size=128)
        query, key_cache, value_cache = (t.half().cuda() for t in (query, key_cache, value_cache))
        meta = UnifiedAttentionMetadata(*(t.cuda() for t in (meta.cu_seqlens_q, meta.seq_lens, meta.block_tables)))
        gathered = [gather_kv(key_cache, value_cache, meta.block_tables[s], n) for s, n in enumerate(seq_lens)]
        expected = per_sequence(query, key_cache, value_cache, meta, gathered)
        run = lambda: meta.attend(query, key_cache, value_cache, backend="cuda")
        error = (run().float() - expected.float()).abs().max().item()  # checked before it is timed
        if error > 2e-2:
            print(f"{name:<36} WRONG, max error {error:.3g} against SDPA; not timed")
            wrong += 1
            continue
        t = cuda_time(run)
        t_sdpa = cuda_time(lambda: per_sequence(query, key_cache, value_cache, meta, gathered))
        bytes_read = 2 * sum(seq_lens) * 8 * 128 * 2
        print(f"{name:<36} {t * 1e3:8.3f} {bytes_read / t / 1e9:7.0f}  {t_sdpa / t:6.2f}x")
    return int(wrong > 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run the GPU case")
    parser.add_argument("--unified", action="store_true",
                        help="unified_paged_attention's CPU path on mixed batches, against SDPA")
    parser.add_argument("--static", action="store_true",
                        help="the static report (pagedkv.kernels.static_report), no GPU needed")
    args = parser.parse_args()
    if args.static:  # in its own process: numba.cuda must start in real (not simulator) mode to compile
        import os
        import subprocess
        env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PAGEDKV_QUIET": "1"}
        return subprocess.run([sys.executable, "-m", "pagedkv.kernels.static_report"], env=env).returncode
    if args.unified:
        return unified_cpu_case()
    return gpu_case() if args.gpu else cpu_case()


if __name__ == "__main__":
    sys.exit(main())
