"""Every attention backend against the dense reference and torch's SDPA.

The "cuda" backend runs in numba's CUDA simulator on machines without a GPU
(one Python thread per CUDA thread), so its cases stay tiny.
"""

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numba import float32
from perf_extra import real_mode_env, require_perf_extra

from pagedkv import BlockTableError, PagedKVValueError, ShapeError, paged_attention, reference_paged_attention
from pagedkv.kernels import CUDA_MODE, check_attention_args, gather_kv  # first: sets the CUDA mode
from pagedkv.kernels.cuda import max_v1_tokens, paged_attention_cuda
from pagedkv.kernels.ptx import fp64_lines

cuda = importlib.import_module("numba.cuda")  # only after pagedkv, which chooses the simulator or a real GPU

ON_GPU = not CUDA_MODE.simulator
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


def make_case(seq_lens, num_heads=4, num_kv_heads=2, head_size=8, block_size=4, dtype=torch.float32, seed=0,
              spare_blocks=3):
    """A cache with each sequence's blocks scattered at random (non-contiguous) places."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=g).tolist()
    width = max(per_seq)
    tables = torch.zeros((len(seq_lens), width), dtype=torch.int32)
    for s, n in enumerate(per_seq):
        tables[s, :n] = torch.tensor(order[:n], dtype=torch.int32)
        order = order[n:]
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(shape, generator=g).to(dtype)
    value_cache = torch.randn(shape, generator=g).to(dtype)
    query = torch.randn((len(seq_lens), num_heads, head_size), generator=g).to(dtype)
    return query, key_cache, value_cache, tables, torch.tensor(seq_lens, dtype=torch.int32)


def sdpa(query, key_cache, value_cache, tables, seq_lens):
    """torch's scaled_dot_product_attention on each sequence's gathered K/V."""
    out = []
    group = query.shape[1] // key_cache.shape[2]
    for s in range(query.shape[0]):
        k, v = gather_kv(key_cache, value_cache, tables[s], int(seq_lens[s]))
        k = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, tokens, head_size]
        v = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
        q = query[s].float().unsqueeze(1)  # [heads, 1, head_size]
        out.append(F.scaled_dot_product_attention(q, k, v).squeeze(1))
    return torch.stack(out)


def check(backend, case, **kw):
    query = case[0]
    out = paged_attention(*case, backend=backend, **kw)
    assert out.shape == query.shape and out.dtype == query.dtype
    expected = sdpa(*case)
    torch.testing.assert_close(out.float(), expected, atol=TOL[query.dtype], rtol=TOL[query.dtype])
    torch.testing.assert_close(reference_paged_attention(*case).float(), expected,
                               atol=TOL[query.dtype], rtol=TOL[query.dtype])


RAGGED = [1, 4, 7, 16]  # length 1, exact block multiples, a partial last block


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_host_backends_match_sdpa(backend, heads, dtype):
    case = make_case(RAGGED + [33], num_heads=heads[0], num_kv_heads=heads[1], head_size=32, dtype=dtype)
    check(backend, case)


def test_cpu_twin_on_a_larger_case():
    case = make_case([100, 257, 64, 5], num_heads=8, num_kv_heads=2, head_size=64, block_size=16, seed=3)
    check("cpu", case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads", [(2, 2), (2, 1)], ids=["MHA", "MQA"])
def test_cuda_v1_matches_sdpa(heads, dtype):
    case = make_case([1, 7, 16], num_heads=heads[0], num_kv_heads=heads[1], head_size=8, dtype=dtype)
    check("cuda", case)


def test_cuda_v1_gqa_head_32():
    check("cuda", make_case([5, 12], num_heads=2, num_kv_heads=1, head_size=32, block_size=8, seed=1))


@pytest.mark.parametrize("partition_size", [4, 8])
def test_cuda_v2_several_partitions(partition_size):
    # lengths 1, 9, 20 make 1, 3 and 5 partitions of 4: the shorter sequences leave partitions empty
    case = make_case([1, 9, 20], num_heads=2, num_kv_heads=1, head_size=8, seed=2)
    check("cuda", case, partition_size=partition_size)


def test_cuda_v2_fp16():
    check("cuda", make_case([6, 13], num_heads=2, num_kv_heads=2, head_size=8, dtype=torch.float16),
          partition_size=4)


VLLM_CASES = [  # (block_size, (heads, kv heads), head_size, dtype, partition_size): every block size vLLM's
    # mapping changes at, every head layout (MHA, GQA 2/3/4, MQA), fp16 and fp32, v1 and v2
    (1, (2, 2), 8, torch.float16, None),     # a thread group of 32 threads per token; MHA
    (8, (4, 2), 16, torch.float32, None),    # groups of 4; GQA 2
    (16, (4, 1), 32, torch.float16, None),   # groups of 2 (vLLM's default block); MQA
    (32, (8, 2), 32, torch.float32, None),   # a thread per token; GQA 4
    (8, (6, 2), 16, torch.float16, 8),       # v2, one block per partition; GQA 3
    (16, (4, 4), 12, torch.float16, 16),     # v2; head_size 12: 3 words, lanes left over; MHA
    (32, (4, 1), 32, torch.float32, 32),     # v2, MQA
    (16, (8, 2), 16, torch.float16, 32),     # v2, two blocks per partition; GQA 4
]


@pytest.mark.parametrize("block_size, heads, head_size, dtype, partition_size", VLLM_CASES)
def test_grouped_vllm_flavour_matches_sdpa(block_size, heads, head_size, dtype, partition_size):
    """The grouped vLLM-shaped kernel (a thread block per KV head and its query heads, a warp per block,
    thread groups, 8-byte words from flat caches); in the simulator its group shuffles become a shared-memory
    exchange, everything else is the body a GPU runs. Ragged lengths: 1 token, part of a block, exact blocks."""
    case = make_case([1, 5, 19, 2 * block_size], num_heads=heads[0], num_kv_heads=heads[1],
                     head_size=head_size, block_size=block_size, dtype=dtype, seed=block_size)
    shape = check_attention_args(*case, None, "cuda", partition_size)
    out = paged_attention_cuda(*case, shape, CUDA_MODE, partition_size, flavour="vllm-gqa")
    torch.testing.assert_close(out.float(), sdpa(*case), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("case_index", [1, 4, 6])
def test_per_head_vllm_flavour_matches_sdpa(case_index):
    """The same body with one query head per thread block (vLLM's CUDA mapping): GQA 2 and 3, MQA."""
    block_size, heads, head_size, dtype, partition_size = VLLM_CASES[case_index]
    case = make_case([1, 5, 19, 2 * block_size], num_heads=heads[0], num_kv_heads=heads[1],
                     head_size=head_size, block_size=block_size, dtype=dtype, seed=block_size)
    shape = check_attention_args(*case, None, "cuda", partition_size)
    out = paged_attention_cuda(*case, shape, CUDA_MODE, partition_size, flavour="vllm")
    torch.testing.assert_close(out.float(), sdpa(*case), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("flavour", ["tree", "vllm-gqa"])
def test_v1_and_v2_can_be_forced(flavour):
    """partition_size=0 forces v1, a partition size forces v2: both agree with SDPA in the simulator."""
    case = make_case([3, 17, 40], num_heads=4, num_kv_heads=2, head_size=16, block_size=8, dtype=torch.float16)
    for partition_size in (0, 8, 16):
        shape = check_attention_args(*case, None, "cuda", partition_size)
        out = paged_attention_cuda(*case, shape, CUDA_MODE, partition_size, flavour=flavour)
        torch.testing.assert_close(out.float(), sdpa(*case), atol=TOL[torch.float16], rtol=TOL[torch.float16])
    torch.testing.assert_close(paged_attention(*case, backend="cuda", partition_size=0).float(), sdpa(*case),
                               atol=TOL[torch.float16], rtol=TOL[torch.float16])


def test_paged_attention_takes_a_flavour_on_the_cuda_backend_only():
    case = make_case([3, 10], num_heads=4, num_kv_heads=2, head_size=8, block_size=4)
    for flavour in ("vllm", "vllm-gqa"):
        out = paged_attention(*case, backend="cuda", partition_size=0, flavour=flavour)
        torch.testing.assert_close(out, sdpa(*case), atol=TOL[torch.float32], rtol=TOL[torch.float32])
    with pytest.raises(PagedKVValueError, match="needs backend='cuda'"):
        paged_attention(*case, backend="cpu", flavour="vllm")


def test_forced_v1_refuses_what_its_shared_memory_cannot_hold():
    case = make_case([9000], num_heads=1, num_kv_heads=1, head_size=8, block_size=16)
    with pytest.raises(ValueError, match="partition_size=0 forces v1"):
        paged_attention(*case, backend="cuda", partition_size=0)


def test_the_gpu_default_is_the_grouped_flavour_where_it_fits():
    from pagedkv.kernels.cuda import _default_flavour

    fits = check_attention_args(*make_case([5], num_heads=8, num_kv_heads=2, head_size=16, block_size=16))
    odd = check_attention_args(*make_case([5], num_heads=2, num_kv_heads=2, head_size=6, block_size=16))
    many = check_attention_args(*make_case([5], num_heads=32, num_kv_heads=1, head_size=16, block_size=16))
    long = check_attention_args(*make_case([3000], num_heads=8, num_kv_heads=2, head_size=16, block_size=16))
    assert _default_flavour(fits, torch.float16, simulator=False) == "vllm-gqa"
    assert _default_flavour(odd, torch.float16, simulator=False) == "tree"  # 6 fp16 values: no whole words
    assert _default_flavour(many, torch.float16, simulator=False) == "vllm"  # 32 heads' logits: too much smem
    assert _default_flavour(long, torch.float16, simulator=False, partition_size=None) == "vllm-gqa"  # v2
    assert _default_flavour(long, torch.float16, simulator=False, partition_size=0) == "vllm"  # a forced v1
    assert _default_flavour(fits, torch.float16, simulator=True) == "tree"


def test_grouped_v1_refuses_a_context_its_shared_memory_cannot_hold():
    from pagedkv.kernels.cuda import max_v1_tokens

    assert max_v1_tokens("vllm-gqa", 4) == 2048 and max_v1_tokens("vllm", 4) == 8192
    case = make_case([2100], num_heads=4, num_kv_heads=1, head_size=8, block_size=16, dtype=torch.float16)
    shape = check_attention_args(*case, None, "cuda", 0)
    with pytest.raises(ValueError, match="at most 2048 tokens of logits per query head"):
        paged_attention_cuda(*case, shape, CUDA_MODE, 0, flavour="vllm-gqa")


def test_vllm_flavour_refuses_sizes_it_cannot_split():
    case = make_case([5], num_heads=2, num_kv_heads=2, head_size=6, block_size=4, dtype=torch.float16)
    shape = check_attention_args(*case, None, "cuda", None)
    for flavour in ("vllm", "vllm-gqa"):
        with pytest.raises(ValueError, match="multiple of 4 for float16"):  # 6 fp16 values are not whole words
            paged_attention_cuda(*case, shape, CUDA_MODE, None, flavour=flavour)
    with pytest.raises(ValueError, match="flavour must be one of 'tree', 'vllm', 'vllm-gqa'"):
        paged_attention_cuda(*case, shape, CUDA_MODE, None, flavour="shuffle")  # retired


def test_the_kernel_modules_import_no_circle():
    """cuda.py (teaching kernel, launcher) and cuda_vllm.py share device helpers from cuda_device.py; the
    vLLM-shaped kernels import neither cuda.py nor each other's bodies."""
    import ast
    from pathlib import Path

    folder = Path(importlib.import_module("pagedkv.kernels").__file__).parent

    def imports(name):
        tree = ast.parse((folder / f"{name}.py").read_text())
        return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}

    assert "cuda" not in imports("cuda_vllm") and "cuda" not in imports("cuda_device")
    assert "cuda_vllm" not in imports("cuda_device")
    assert {"cuda_device", "cuda_vllm"} <= imports("cuda")


def test_default_scale_and_custom_scale():
    case = make_case([5, 9], num_heads=2, num_kv_heads=2)
    a = paged_attention(*case, scale=8 ** -0.5, backend="cpu")
    torch.testing.assert_close(a, paged_attention(*case, backend="cpu"))
    b = paged_attention(*case, scale=0.0, backend="cpu")  # uniform weights: the mean of V
    k, v = gather_kv(case[1], case[2], case[3][0], 5)
    torch.testing.assert_close(b[0, 0], v[:, 0].mean(0), atol=1e-6, rtol=1e-5)


def test_auto_backend():
    case = make_case([3], num_heads=2, num_kv_heads=2)
    torch.testing.assert_close(paged_attention(*case), paged_attention(*case, backend="torch"), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not ON_GPU, reason="the shuffles of the vLLM-shaped kernels need a real GPU (the simulator "
                    "takes shared memory instead)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("partition_size", [None, 0, 512])  # auto, forced v1, v2
def test_gpu_kernels_every_flavour(dtype, partition_size):
    case = make_case([1, 16, 600, 2000, 4096], num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                     dtype=dtype)
    shape = check_attention_args(*case)
    expected = sdpa(*case)
    for flavour in ("tree", "vllm", "vllm-gqa", None):  # None: the GPU default
        if partition_size == 0 and flavour and shape.max_seq_len > max_v1_tokens(flavour, shape.num_queries_per_kv):
            with pytest.raises(PagedKVValueError, match="leave partition_size=None"):  # a group's logits overflow
                paged_attention_cuda(*case, shape, CUDA_MODE, partition_size, flavour=flavour)
            continue
        out = paged_attention_cuda(*case, shape, CUDA_MODE, partition_size, flavour=flavour)
        torch.testing.assert_close(out.float().cpu(), expected, atol=TOL[dtype], rtol=TOL[dtype])


# ---------------------------------------------------------------- validation


def bad(case, **changes):
    names = ["query", "key_cache", "value_cache", "block_tables", "seq_lens"]
    args = dict(zip(names, case))
    args.update(changes)
    return args


@pytest.mark.parametrize("change, error, match", [
    (lambda c: dict(query=c[0][0]), ShapeError, "query has shape"),
    (lambda c: dict(query=c[0][:, :, :4].contiguous()), ShapeError, "head_size"),
    (lambda c: dict(key_cache=c[1][..., 0].contiguous()), ShapeError, "key_cache has shape"),
    (lambda c: dict(value_cache=c[2][:1]), ShapeError, "value_cache"),
    (lambda c: dict(query=c[0][:, :3].contiguous()), ShapeError, "multiple of num_kv_heads"),
    (lambda c: dict(query=c[0].double()), ShapeError, "share a dtype"),
    (lambda c: dict(block_tables=c[3].long()), ShapeError, "block_tables must be int32"),
    (lambda c: dict(seq_lens=c[4][:1]), ShapeError, "seq_lens must be int32"),
    (lambda c: dict(key_cache=c[1].transpose(0, 1)), ShapeError, "contiguous"),
    (lambda c: dict(seq_lens=torch.tensor([5, 99], dtype=torch.int32)), BlockTableError, "exceed"),
    (lambda c: dict(seq_lens=torch.tensor([0, 4], dtype=torch.int32)), BlockTableError, ">= 1"),
    (lambda c: dict(block_tables=c[3] + 100), BlockTableError, "outside the cache"),
    (lambda c: dict(block_tables=c[3] - 100), BlockTableError, "outside the cache"),
])
def test_validation_before_launch(change, error, match):
    case = make_case([5, 8], num_heads=4, num_kv_heads=2)
    with pytest.raises(error, match=match) as info:
        paged_attention(**bad(case, **change(case)), backend="cuda")
    assert isinstance(info.value, ValueError)


def test_validation_of_options():
    case = make_case([5], num_heads=2, num_kv_heads=2)
    with pytest.raises(ValueError, match="backend"):
        paged_attention(*case, backend="tpu")
    with pytest.raises(ValueError, match="multiple of block_size"):
        paged_attention(*case, backend="cuda", partition_size=6)
    with pytest.raises(ValueError, match="at most 8192 tokens"):  # 12,288 would not fit in shared memory
        paged_attention(*case, backend="cuda", partition_size=12_288)
    with pytest.raises(ShapeError, match="float32 or float16"):
        paged_attention(*[t.bfloat16() if t.is_floating_point() else t for t in case], backend="cpu")
    bf16 = [t.bfloat16() if t.is_floating_point() else t for t in case]  # the torch reference takes bf16
    torch.testing.assert_close(paged_attention(*bf16, backend="torch").float(), sdpa(*case), atol=3e-2, rtol=3e-2)


def test_unused_table_entries_are_not_checked():
    q, k, v, tables, lens = make_case([3, 9], num_heads=2, num_kv_heads=2)
    tables[0, 2] = 10_000  # padding past sequence 0's length: never read
    check("cpu", (q, k, v, tables, lens))


def test_paged_kv_cache_attention_matches_reference():
    from pagedkv import PagedKVCache

    c = PagedKVCache(num_gpu_blocks=8, block_size=4, num_kv_heads=1, head_size=8)
    g = torch.Generator().manual_seed(0)
    for seq, n in (("a", 6), ("b", 3)):
        c.add_sequence(seq, torch.randn(n, 1, 8, generator=g), torch.randn(n, 1, 8, generator=g))
    c.fork("a", "a2")
    c.append("a2", torch.randn(1, 8, generator=g), torch.randn(1, 8, generator=g))
    query = torch.randn(3, 2, 8, generator=g)
    for backend in ("cpu", "cuda"):
        out = c.attention(query, ["a", "b", "a2"], backend=backend)
        tables, lens = c.block_tables(["a", "b", "a2"])
        torch.testing.assert_close(out, sdpa(query, c.key_cache, c.value_cache, tables, lens), atol=2e-5, rtol=2e-5)


# ---------------------------------------------------------------- backend mode and PTX


def run_python(code, **env):
    fresh_shell = ("NUMBA_ENABLE_CUDASIM", "PAGEDKV_QUIET", "PAGEDKV_CUDASIM_AUTO")
    full_env = {k: v for k, v in os.environ.items() if k not in fresh_shell}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


@pytest.mark.skipif(ON_GPU, reason="checks the no-GPU path")
def test_simulator_switches_on_by_itself_and_says_so():
    """Switched on at import; said (with the reason) when a CUDA kernel first runs, see the tests below."""
    r = run_python("import pagedkv, numba.cuda as c; from numba.cuda.core import config; "
                   "print(pagedkv.CUDA_MODE.simulator, bool(config.ENABLE_CUDASIM)); "
                   "pagedkv.kernels.backend.announce_simulator()")
    assert r.stdout.split() == ["True", "True"]
    assert "simulator" in r.stderr and "no NVIDIA driver" in r.stderr


def test_user_setting_wins():
    r = run_python("import pagedkv; print(pagedkv.CUDA_MODE)", NUMBA_ENABLE_CUDASIM="1")
    assert "simulator=True" in r.stdout and "you set NUMBA_ENABLE_CUDASIM=1" in r.stdout
    assert r.stderr == ""


@pytest.mark.skipif(ON_GPU, reason="checks the no-GPU path")
def test_numba_cuda_imported_first_in_the_wrong_mode_warns():
    r = run_python("import os; os.environ['NUMBA_ENABLE_CUDASIM'] = '0'; import numba.cuda; "
                   "del os.environ['NUMBA_ENABLE_CUDASIM']; import pagedkv")
    assert "RuntimeWarning: numba.cuda was imported before pagedkv" in r.stderr
    assert "import pagedkv before numba.cuda" in r.stderr


def test_ptx_for_a_real_gpu_has_no_fp64():
    r = subprocess.run([sys.executable, "-m", "pagedkv.kernels.ptx", "--cc", "9.0"], capture_output=True,
                       text=True, env=real_mode_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 22 and all(line.endswith("ok") for line in lines)  # 3 flavours x 2 dtypes x 3 kernels + 4
    assert sum(" unified " in line for line in lines) == 4  # fp16/fp32, 2-D and 3-D (split-KV, a window)


def test_static_report_reads_the_linker_and_the_sass():
    """The cheap part of ``bench_attention.py --static``: one kernel, linked for sm_90, disassembled."""
    require_perf_extra()
    r = subprocess.run([sys.executable, "-m", "pagedkv.kernels.static_report", "--cc", "9.0", "--head-size", "32",
                        "--flavour", "tree", "--kernel", "v1"], capture_output=True, text=True,
                       env=real_mode_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    row = r.stdout.splitlines()[1].split()
    assert row[:5] == ["sm_90", "tree", "v1", "32", "-"]
    registers, spills, shared, local = map(int, row[5:9])
    assert 0 < registers <= 255 and spills == 0 and local == 0 and shared >= 4 * 32  # q staged in shared memory
    assert "instr/" in r.stdout  # at least one loop that streams the cache was found
    summary = [line for line in r.stdout.splitlines() if line.startswith("static summary:")]
    assert [line.split(":")[1] for line in summary] == [" sm_90 tree head 32 fp16 gqa 1",
                                                        " sm_90 tree head 32 fp16 gqa 4"]
    assert all("of H100 HBM bandwidth (an estimate" in line for line in summary)


def test_the_hbm_estimate_follows_its_formula():
    from pagedkv.kernels.static_report import H100_WARP_INSTRUCTIONS_PER_S, hbm_fraction, summary_line

    # head 128 fp16 at GQA 4: 128 bytes of K+V per (query head, token); 107 instructions: about a third
    assert hbm_fraction(107, 128, 4) == pytest.approx(128 * H100_WARP_INSTRUCTIONS_PER_S / 107 / 3.35e12)
    assert 0.30 < hbm_fraction(107, 128, 4) < 0.40  # 0.37 at the H100 SXM's 1.98 GHz boost clock
    assert hbm_fraction(20, 128, 1) > 1  # memory-bound: the issue rate is not the limit
    row = dict(sm="sm_90", flavour="vllm-gqa", head_size=128, occupancy=0.5, spill_bytes=0,
               loops=[(87, 8, 10.9), (65, 8, 8.1)])
    assert summary_line(row, 4).startswith("static summary: sm_90 vllm-gqa head 128 fp16 gqa 4: 19 warp "
                                           "instructions per (query head, token)")


def test_static_report_parsers():
    from pagedkv.kernels.static_report import LinkInfo, cache_loops, fp16_elements_loaded, occupancy, parse_link_log

    log = ("ptxas         .     0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "info    : used 72 registers, used 1 barriers, 0 stack, 6144 bytes smem, 1048 bytes cmem[0], 0 bytes lmem")
    assert parse_link_log(log) == LinkInfo(registers=72, spill_bytes=12, shared_bytes=6144, local_bytes=0)
    assert occupancy(LinkInfo(72, 0, 6144, 0), 128, (9, 0)) == 7 * 4 / 64  # 72 regs x 32 lanes: 7 blocks of 4 warps
    assert [fp16_elements_loaded(x) for x in ("LDG.E.U16 R6, desc[UR36][R6.64]", "@P0 LDG.E.128 R4, [R2.64]",
                                              "LDG.E R17, desc[UR36][R4.64]", "FFMA R1, R2, R3, R4")] == [1, 8, 0, 0]
    sass = ["        /*0000*/                   MOV R1, c[0x0][0x28] ;", ".L_x_1:",
            "        /*0010*/                   LDG.E.U16 R2, desc[UR4][R4.64] ;",
            "        /*0020*/                   HADD2.F32 R3, -RZ, R2.H0_H0 ;",
            "        /*0028*/                   FFMA R6, R3, R5, R6 ;",
            "        /*0030*/               @P0 BRA `(.L_x_1) ;", "        /*0040*/                   EXIT ;"]
    (loop,) = cache_loops(sass)  # a loop that loads fp16 and multiplies: a cache loop (the q copy has no FFMA)
    assert (loop.instructions, loop.cache_elements) == (4, 1)


def test_fp64_detector():
    ptx = "\tadd.f32 %f1, %f2, %f3;\n\tcvt.f64.f32 %fd1, %f1;\n// a comment about .f64\n"
    assert fp64_lines(ptx) == ["cvt.f64.f32 %fd1, %f1;"]


@pytest.mark.skipif(ON_GPU, reason="checks the no-GPU path")
def test_child_processes_detect_afresh():
    """A notebook kernel started from a process that imported pagedkv still announces the simulator (once per
    process, when a CUDA kernel is first launched: importing pagedkv says nothing, issue #27)."""
    announce = "from pagedkv.kernels.backend import announce_simulator; announce_simulator(); announce_simulator()"
    r = run_python(f"import subprocess, sys, pagedkv; {announce}; "
                   f"subprocess.run([sys.executable, '-c', 'import pagedkv; {announce}'], check=True)")
    assert r.stderr.count("numba.cuda kernels run in numba's CUDA simulator") == 2
    assert "simulator" not in run_python("import pagedkv").stderr


@pytest.mark.skipif(ON_GPU, reason="checks the no-GPU path")
def test_the_first_cuda_launch_says_the_simulator_runs_it():
    r = run_python("import torch, pagedkv; from pagedkv import paged_attention; "
                   "q = torch.ones(1, 1, 4); k = torch.ones(2, 4, 1, 4); "
                   "t = torch.tensor([[0]], dtype=torch.int32); n = torch.tensor([3], dtype=torch.int32); "
                   "[paged_attention(q, k, k, t, n, backend='cuda') for _ in range(2)]")
    assert r.stderr.count("numba.cuda kernels run in numba's CUDA simulator") == 1


@cuda.jit
def neighbours(out):
    """Each thread writes its slot of a shared array, then reads its neighbour's after a barrier."""
    buf = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    buf[t] = t
    cuda.syncthreads()
    out[cuda.blockIdx.x, t] = buf[(t + 1) % 32]


@pytest.mark.skipif(ON_GPU, reason="the race is in numba-cuda's CUDA simulator")
def test_simulator_shared_arrays_are_shared_by_every_thread_of_a_block():
    """numba-cuda's simulator can hand two threads of one block different "shared" arrays (an unlocked
    check-then-insert; pagedkv.kernels.simfix locks it). Unpatched, about 1 launch in 75 of this kernel
    goes wrong with frequent thread switches; 150 launches catch the race almost surely."""
    from numba.cuda.simulator import kernelapi

    assert getattr(kernelapi.FakeCUDAShared.array, "pagedkv_locked", False)
    expected = np.tile((np.arange(32) + 1) % 32, (4, 1))
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race needs a switch mid-allocation
    try:
        for _ in range(150):
            out = np.zeros((4, 32), np.float32)
            neighbours[4, 32](out)
            assert np.array_equal(out, expected)
    finally:
        sys.setswitchinterval(previous)


def test_a_missing_nvidia_library_is_one_line_naming_the_extra(capsys):
    """Issue #29: the PTX compile and the static report in a venv without the cuda extra."""
    from pagedkv.kernels.ptx import missing_toolkit, report_missing_toolkit

    lost = OSError("libnvrtc.so.13: cannot open shared object file: No such file or directory")
    assert "pip install -e '.[cuda]'" in missing_toolkit(lost)
    assert missing_toolkit(ModuleNotFoundError("No module named 'cuda.core'")) is not None
    assert missing_toolkit(ValueError("head_size must be a multiple of 32")) is None

    def compile_without_nvrtc():
        raise lost

    assert report_missing_toolkit(compile_without_nvrtc) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "libnvrtc.so.13" in err and ".[cuda]" in err
    with pytest.raises(ValueError):  # anything else is not explained away
        report_missing_toolkit(lambda: (_ for _ in ()).throw(ValueError("a real bug")))


def test_static_report_of_the_unified_kernel():
    """The unified kernel's rows: a prefill tile and a decode tile, linked for sm_90 and disassembled; run without
    NUMBA_ENABLE_CUDASIM=0, the report switches the simulator off for itself (it only compiles)."""
    require_perf_extra()
    env = {k: v for k, v in real_mode_env().items() if k not in ("NUMBA_ENABLE_CUDASIM", "PAGEDKV_CUDASIM_AUTO")}
    r = subprocess.run([sys.executable, "-m", "pagedkv.kernels.static_report", "--cc", "9.0", "--head-size", "32",
                        "--gqa", "2", "--kernel", "unified"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("sm     unified tile")
    prefill, decode = (line.split() for line in lines[1:3])
    assert prefill[:3] == ["sm_90", "prefill", "8x2"] and decode[:3] == ["sm_90", "decode", "1x2"]  # 16 // 2 queries
    for row in (prefill, decode):
        registers, spills, shared, local = map(int, row[5:9])
        assert 0 < registers <= 255 and spills == 0 and local == 0
        k, v, load, total = (float(x) for x in row[10::2])
        assert k > 0 and v > 0 and total == pytest.approx(k + v + load, abs=1.5)
    assert float(prefill[14]) > 0 and float(decode[14]) == 0  # a decode tile stages no page: K/V straight to FFMAs
    summary = [line for line in lines if line.startswith("static summary:")]
    assert [line.split(":")[1] for line in summary] == [
        " sm_90 unified prefill tile (8 queries x 2 heads) head 32 fp16",
        " sm_90 unified decode tile (1 query x 2 heads) head 32 fp16"]
    assert all("warp instructions per (query head, key)" in line and "not measured" in line for line in summary)


def test_unified_loop_costs_follow_their_formula():
    from pagedkv.kernels.static_report import decode_tile_loops, unified_loops

    def loop(label, body):
        lines = [f".L_x_{label}:"] + [f"        /*{label:02x}{i:02x}*/                   {text} ;"
                                      for i, text in enumerate(body)]
        return lines + [f"        /*{label:02x}ff*/                   @P0 BRA `(.L_x_{label}) ;"]

    stage = ["LDG.E.U16 R2, desc[UR4][R4.64]", "STS [R8], R2"]  # the queries: 2-byte loads, not a page load
    load = ["LDG.E.64 R2, desc[UR4][R4.64]", "LDG.E.64 R6, desc[UR4][R6.64]", "STS [R8], R2", "STS [R9], R3"]
    dot = ["LDS R2, [R8]", "LDS R3, [R9]", "FFMA R6, R2, R3, R6"]
    cache = ["LDG.E.64 R2, desc[UR4][R4.64]", "LDS R3, [R9]", "FFMA R6, R2, R3, R6"]  # a decode tile's loop
    sass = loop(1, stage) + loop(2, load) + loop(3, dot) + loop(4, cache) \
        + loop(5, ["MUFU.EX2 R2, R3", "FFMA R6, R2, R3, R6", "LDS R2, [R8]"]) + loop(6, dot + ["IADD3 R8, R8, 0x4, RZ"])
    costs = unified_loops(sass, head_size=64, block_m=8)
    # K: 4 instructions per FFMA (3 + the branch) x 64 / 32 lanes; V: 5 per FFMA; the MUFU loop is the softmax and
    # the loop that loads the cache belongs to the decode tile (not counted); load: 5 instructions per 8 elements
    # (two 8-byte words) x 128 (K and V rows) / 32 lanes / 8 rows sharing it
    assert costs == {"K": 8.0, "V": 10.0, "load": 0.3125}
    # a decode tile: 4 instructions per 4 fp16 elements, x 64 / 32 lanes, shared by a group of 2 query heads
    assert decode_tile_loops(loop(1, cache) + loop(2, cache), head_size=64, gqa=2) == {"K": 1.0, "V": 1.0,
                                                                                       "load": 0.0}
