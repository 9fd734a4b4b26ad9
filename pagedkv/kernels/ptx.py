"""Compile the CUDA kernels to PTX for a real GPU, with no GPU present.

The simulator runs kernels as Python, so it never type-checks them; this
compiles them with NVVM (from NVIDIA's pip wheels) exactly as a GPU run would,
and looks for float64 arithmetic that would slow them down.  numba.cuda must be
in *real* mode for this; run as its own process it switches the simulator off
for itself (it only compiles, so no GPU is needed)::

    python -m pagedkv.kernels.ptx --cc 9.0
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from types import SimpleNamespace

from ..errors import PagedKVError


def signatures(dtype: str, words: bool = False) -> dict:
    """numba type signatures of the v1, v2 and reduce kernels for a cache dtype (for the 'vllm' flavours, the
    caches as flat int64 words and the number of KV heads last)."""
    q = f"{dtype}[:, :, ::1]"
    cache = "int64[::1]" if words else f"{dtype}[:, :, :, ::1]"
    common = f"{q}, {cache}, {cache}, int32[:, ::1], int32[::1], float32, int32" + (", int32" if words else "")
    return {
        "v1": f"void(float32[:, :, ::1], {common})",
        "v2": f"void(float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], {common})",
        "reduce": "void(float32[:, :, ::1], float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], "
                  "int32[::1], int32)",
    }


TOOLKIT_WORDS = ("nvrtc", "nvvm", "nvjitlink", "libcudart", "cuda.core", "cuda_core", "nvidia")


def missing_toolkit(error: BaseException) -> str | None:
    """One line that names the extra to install, when ``error`` says NVIDIA's compiler libraries are missing."""
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0][:200]
    if not any(word in text.lower() for word in TOOLKIT_WORDS):
        return None
    return (f"compiling the kernels needs NVIDIA's compiler libraries, which this environment lacks ({text}). "
            "Install the cuda extra, pip install -e '.[cuda]' (for the static report, '.[perf]'), no GPU needed.")


def report_missing_toolkit(run) -> int:
    """``run()``'s exit code; a missing NVIDIA library is one line on stderr and exit code 2, not a traceback."""
    try:
        return run()
    except Exception as error:  # noqa: BLE001 - anything else is re-raised as it was
        hint = missing_toolkit(error)
        if hint is None:
            raise
        print(f"pagedkv: {hint}", file=sys.stderr)
        return 2


def without_simulator(module: str, argv) -> int | None:
    """Compiling needs numba.cuda in real mode, which it cannot enter once imported in the simulator: then run
    ``python -m module argv`` again with ``NUMBA_ENABLE_CUDASIM=0`` and return its exit code (None: already real)."""
    from .backend import AUTO_MARKER, imported_cuda_is_simulator

    if not imported_cuda_is_simulator():
        return None
    env = {k: v for k, v in os.environ.items() if k != AUTO_MARKER}
    env["NUMBA_ENABLE_CUDASIM"] = "0"  # the user's setting now: pagedkv keeps it
    argv = sys.argv[1:] if argv is None else list(argv)
    return subprocess.run([sys.executable, "-m", module, *argv], env=env).returncode


def fp64_lines(ptx: str) -> list[str]:
    """PTX lines doing float64 arithmetic (conversions *to* f64 count too)."""
    return [line.strip() for line in ptx.splitlines() if ".f64" in line and not line.strip().startswith("//")]


def compile_one(flavour: str, kernel: str, dtype: str, cc=(9, 0), head_size=128, block_size=16, logits_len=512,
                num_threads=128, gqa=4) -> str:
    """PTX of one kernel ("v1", "v2" or "reduce") for a cache dtype and compute capability.

    ``gqa`` is the number of query heads per KV head the ``"vllm-gqa"`` flavour is built for.
    """
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise PagedKVError("run with NUMBA_ENABLE_CUDASIM=0: the simulator cannot compile to PTX.")
    from numba import cuda
    from numba.cuda import dispatcher

    from .cuda import FLAVOURS, build_kernels
    from .cuda_vllm import build_vllm_kernels, heads_per_block, launch_bounds

    if flavour not in FLAVOURS:
        raise PagedKVError(f"flavour must be one of {FLAVOURS}, got {flavour!r}.")
    # Device functions are compiled for "the current device"; with no GPU there is none, so
    # stand one in with the compute capability asked for (the kernel itself gets cc= directly).
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    kernels = dict(zip(("v1", "v2", "reduce"), build_kernels(head_size, block_size, num_threads, logits_len,
                                                             jit=False)))
    heads = heads_per_block(flavour, gqa)
    if flavour != "tree":
        kernels.update(zip(("v1", "v2"), build_vllm_kernels(head_size, block_size, num_threads, logits_len, dtype,
                                                            simulated=False, heads_per_block=heads, jit=False)))
    bounds = launch_bounds(num_threads, cc, heads, head_size) if flavour != "tree" and kernel != "reduce" else None
    ptx, _ = cuda.compile_ptx(kernels[kernel], signatures(dtype, words=flavour != "tree")[kernel], cc=cc,
                              launch_bounds=bounds)
    return ptx


def unified_signature(dtype: str, head_size: int = 128) -> str:
    """numba type signature of ``cuda_unified``'s kernel for a cache dtype (the caches as flat words)."""
    from .cuda_unified import word_bytes

    words = {8: "int64", 4: "int32", 2: "int16"}[word_bytes(head_size, {"float16": 2, "float32": 4}[dtype])]
    return (f"void(float32[:, :, ::1], float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1], "
            f"{dtype}[:, :, ::1], {words}[::1], {words}[::1], int32[::1], int32[::1], int32[:, ::1], float32, int32, "
            "int32, int32)")


def compile_unified(dtype: str, cc=(9, 0), head_size=128, block_size=16, num_threads=128, block_q=4, gqa=4,
                    sliding_window=0, split=False, partition_size=None, decodes_only=False) -> str:
    """PTX of the unified kernel (``cuda_unified.py``) for tiles of ``block_q`` queries x ``gqa`` query heads."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise PagedKVError("run with NUMBA_ENABLE_CUDASIM=0: the simulator cannot compile to PTX.")
    from numba import cuda
    from numba.cuda import dispatcher

    from .cuda_unified import build_unified_kernel, launch_bounds

    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)  # see compile_one
    kernel = build_unified_kernel(head_size, block_size, num_threads, block_q, gqa, sliding_window, dtype,
                                  simulated=False, partition_size=partition_size, split=split,
                                  decodes_only=decodes_only, jit=False)
    ptx, _ = cuda.compile_ptx(kernel, unified_signature(dtype, head_size), cc=cc,
                              launch_bounds=launch_bounds(num_threads, cc, gqa, head_size, decodes_only))
    return ptx


def compile_all(cc=(9, 0), head_size=128, block_size=16, logits_len=512) -> dict:
    """{(flavour, dtype, kernel): ptx} for every flavour, fp16 and fp32, and the unified kernel's prefill tile."""
    from .cuda import FLAVOURS

    ptx = {(flavour, dtype, name): compile_one(flavour, name, dtype, cc, head_size, block_size, logits_len)
           for flavour in FLAVOURS for dtype in ("float16", "float32") for name in ("v1", "v2", "reduce")}
    for dtype in ("float16", "float32"):
        ptx["unified", dtype, "2-D"] = compile_unified(dtype, cc, head_size, block_size)
        ptx["unified", dtype, "3-D"] = compile_unified(dtype, cc, head_size, block_size, block_q=1, sliding_window=64,
                                                       split=True, decodes_only=True)
    return ptx


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="9.0", help="compute capability, e.g. 8.0 or 9.0")
    args = parser.parse_args(argv)
    rerun = without_simulator("pagedkv.kernels.ptx", argv)
    if rerun is not None:
        return rerun
    cc = tuple(int(x) for x in args.cc.split("."))
    return report_missing_toolkit(lambda: print_report(cc))


def print_report(cc: tuple[int, int]) -> int:
    failures = 0
    for (flavour, dtype, name), ptx in compile_all(cc).items():
        fp64 = fp64_lines(ptx)
        status = "ok" if not fp64 else f"{len(fp64)} float64 lines, e.g. {fp64[0]}"
        failures += bool(fp64)
        print(f"sm_{cc[0]}{cc[1]} {flavour:<8} {dtype:<7} {name:<6} {len(ptx.splitlines()):>5} PTX lines  {status}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
