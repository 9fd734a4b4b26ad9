"""Choose how ``numba.cuda`` runs: on a real GPU, or in numba's CUDA simulator.

``numba.cuda`` reads ``NUMBA_ENABLE_CUDASIM`` once, when it is first imported,
so this runs before anything in pagedkv imports it.  The rule:

1. if you set ``NUMBA_ENABLE_CUDASIM`` yourself, that wins;
2. otherwise ask the NVIDIA driver (NVML, through ctypes, which does *not*
   create a CUDA context in this process) how many GPUs there are, and turn the
   simulator on when there are none.

Inside the simulator ``numba.cuda.is_available()`` is always True, so the mode
is read from numba's config, never from that call.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from dataclasses import dataclass

# What pagedkv itself wrote into NUMBA_ENABLE_CUDASIM, so a child process (a notebook kernel, a
# subprocess) inheriting it detects the GPU afresh instead of taking it for the user's choice.
AUTO_MARKER = "PAGEDKV_CUDASIM_AUTO"


@dataclass(frozen=True)
class CudaMode:
    simulator: bool  # True: kernels run in numba's CUDA simulator (Python threads on the CPU)
    reason: str  # why, in words

    def describe(self) -> str:
        where = "numba's CUDA simulator (slow, tiny launches only)" if self.simulator else "a CUDA GPU"
        return f"numba.cuda kernels run on {where}: {self.reason}"


def nvml_gpu_count() -> int | None:
    """GPUs the NVIDIA driver sees, or None when no driver is installed."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    count = ctypes.c_uint(0)
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0
    finally:
        nvml.nvmlShutdown()


def detect_gpu() -> tuple[bool, str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False, f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    count = nvml_gpu_count()
    if count is None:
        return False, "no NVIDIA driver found (libnvidia-ml.so.1 cannot be loaded)"
    if count == 0:
        return False, "the NVIDIA driver reports no usable GPU"
    return True, f"the NVIDIA driver reports {count} GPU(s)"


def imported_cuda_is_simulator() -> bool | None:
    """The mode numba.cuda was imported in (None if it is not imported yet).

    The config can be re-read later, so look at what the module really is:
    in the simulator its API comes from ``numba.cuda.simulator``.
    """
    module = sys.modules.get("numba.cuda")
    if module is None or not hasattr(module, "jit"):
        return None
    return module.jit.__module__.startswith("numba.cuda.simulator")


def configure_cuda_mode(announce: bool = True) -> CudaMode:
    """Set ``NUMBA_ENABLE_CUDASIM`` for this process (unless you did) and report the mode."""
    user_value = os.environ.get("NUMBA_ENABLE_CUDASIM")
    if user_value is not None and os.environ.get(AUTO_MARKER) == user_value:
        user_value = None  # pagedkv set it in a parent process; the user did not
    if user_value is not None:
        mode = CudaMode(user_value.strip() not in ("", "0"), f"you set NUMBA_ENABLE_CUDASIM={user_value}")
    else:
        has_gpu, why = detect_gpu()
        mode = CudaMode(not has_gpu, why)
        os.environ["NUMBA_ENABLE_CUDASIM"] = os.environ[AUTO_MARKER] = "0" if has_gpu else "1"
    for name in ("numba.core.config", "numba.cuda.core.config"):  # imported already: re-read the variable
        if name in sys.modules:
            sys.modules[name].reload_config()

    imported = imported_cuda_is_simulator()
    if imported is not None and imported != mode.simulator:
        warnings.warn(f"numba.cuda was imported before pagedkv in the other mode, so it stays in that mode "
                      f"({'the simulator' if imported else 'real GPU mode'}) until Python restarts; pagedkv wanted: "
                      f"{mode.describe()}. Fix: import pagedkv before numba.cuda, or set NUMBA_ENABLE_CUDASIM="
                      f"{int(mode.simulator)} before starting Python.", RuntimeWarning, stacklevel=2)
    elif mode.simulator and user_value is None:
        _pending_notice.append(mode.reason)
        if announce:
            announce_simulator()
    return mode


_pending_notice: list = []  # the reason pagedkv switched the simulator on, until it has been said once


def announce_simulator() -> None:
    """Say once per process that numba.cuda kernels run in the simulator, and why; pagedkv calls it when a CUDA
    kernel is first launched, so only notebooks that use one show it (``PAGEDKV_QUIET=1`` silences it)."""
    if _pending_notice and not os.environ.get("PAGEDKV_QUIET"):
        # In a notebook a plain line without the driver's detail (stderr would show in a pink error box, and a
        # stored output should not name this machine's libraries); in a terminal, stderr, with the reason.
        in_notebook = "ipykernel" in sys.modules
        stream = sys.stdout if in_notebook else sys.stderr
        why = "" if in_notebook else f" ({_pending_notice[0]})"
        stream.flush()  # one write, line and newline together: a notebook's stream never splits it
        stream.write(f"pagedkv: no CUDA GPU{why}; numba.cuda kernels run in numba's CUDA simulator.\n")
        stream.flush()
    _pending_notice.clear()
