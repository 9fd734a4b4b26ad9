"""Shared bits of the benchmark scripts: timing and a description of the machine."""

import os
import platform
import time


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def best_of(fn, repeat=3):
    """Best wall time of ``repeat`` runs of ``fn()`` in seconds (the least disturbed run)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
