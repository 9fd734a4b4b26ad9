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


def python_speed() -> float:
    """Seconds for a fixed pure-Python loop (best of 3): how fast this machine runs Python right now.

    Shared CI machines drift (the same run can take 1.5x longer an hour later); printing this next to a
    timing lets two sessions compare their figures.
    """
    def loop():
        total = 0
        for i in range(5_000_000):
            total += i
    return best_of(loop)
