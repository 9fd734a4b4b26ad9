#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, as one script: the kernel tests with numba.cuda on the device (the
# simulator does no type checking and skips the shuffles), then `bench_attention.py --gpu` (every decode flavour
# and unified_paged_attention against torch's SDPA, checked before timed). Run from the repository root on a
# machine with a GPU, torch, numba and numba-cuda (numba-cuda 0.30 needs numpy < 2.5: np.row_stack); logs go to
# $OUT (or ./gpu-out).
#
#     bash benchmarks/gpu_checks.sh
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONPATH="$PWD:$PWD/tests:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PY:-python3}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $py -c "import sys; from importlib.metadata import version as v; print('python', sys.version.split()[0],
*(f'| {n} {v(n)}' for n in ('torch', 'numba', 'numba-cuda')))"
  $py -m pagedkv info
} 2>&1 | tee "$out/versions.txt"
# The kernel tests: pytest's options from pyproject.toml name nbval, which only the notebooks need.
timeout "${TESTS_S:-270}" $py -m pytest -o addopts="" -p no:cacheprovider -q -rs --durations=10 \
  tests/test_kernels.py tests/test_unified.py 2>&1 | tee "$out/tests.txt"
timeout "${BENCH_S:-240}" $py benchmarks/bench_attention.py --gpu 2>&1 | tee "$out/bench.txt"
