"""A workaround for a race in numba-cuda's CUDA simulator (seen in numba-cuda 0.30.4, the latest release).

In the simulator every CUDA thread is a Python thread, and ``cuda.shared.array``
hands each thread of a block the block's array, created on first use:
``FakeCUDAShared.array`` looks the array up by the caller's file and line and, if
it is missing, creates and stores it, with no lock.  When the interpreter
switches threads between the look-up and the store, two threads of one block
each create their *own* "shared" array and never see each other's writes: a
kernel returns a wrong answer once in a few hundred launches (or fails further
on), with nothing wrong in the kernel.  pagedkv switches threads often in the
simulator (see ``_fast_thread_switching`` in ``cuda.py``), which makes it likelier.

The patched method does the same look-up and store under a lock.  It is installed
only when the simulator is in use, and only once.
"""

from __future__ import annotations

import sys
import threading

_lock = threading.Lock()


def make_simulator_shared_arrays_thread_safe() -> bool:
    """Install the locked ``FakeCUDAShared.array``; returns True if it was installed now."""
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "pagedkv_locked", False):
        return False
    original = shared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory (one buffer) or an error: as before
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)  # the simulator's own key: one array per line
        with _lock:
            found = self._allocations.get(key)
            if found is None:
                found = self._allocations[key] = kernelapi.np.empty(shape, dtype)
        return found

    array.pagedkv_locked = True
    shared.array = array
    return True
