"""For tests of the static kernel report: skip without the perf extra; run numba.cuda in real mode."""

import os

import pytest

from pagedkv import PagedKVError


def require_perf_extra() -> None:
    """Skip the calling test unless cuda.core and NVIDIA's disassembler (the perf extra) are installed."""
    pytest.importorskip("cuda.core")
    try:
        from pagedkv.kernels.static_report import nvdisasm
        nvdisasm()
    except PagedKVError as error:
        pytest.skip(str(error))  # the perf extra is not installed


def real_mode_env(**extra) -> dict:
    """The environment of a child process that compiles the kernels for a real GPU (no simulator)."""
    return {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", **extra}
