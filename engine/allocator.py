"""Keep freed activation memory in the process instead of handing it back to the kernel.

A prefill allocates and frees the same few hundred MB of activations every pass (a 421-token
Q4_K_M prefill: conv outputs, projections, their quantized copies, 1-30 MB each). glibc's
default gives big frees back to the kernel (munmap, or a heap trim past 2x the adaptive mmap
threshold), so the next pass faults the pages in again, zeroed: measured 24k-87k minor faults
and 0.06-0.25 s of system time per 421-token prefill here, the same prefill 1.10-1.23 s against
1.01-1.09 s with the two settings below (4 runs each, one process, alternating shapes).

``keep_freed_memory()`` sets them with mallopt(3) at import: blocks up to 32 MB (glibc's
largest mmap threshold) come from the heap, and the heap is trimmed only past 1 GB free.
Peak RSS is the live peak either way (retained memory is reused by the next pass). Skipped
where the user tuned malloc (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES)
and where the C library has no mallopt (musl, macOS).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Apply the settings above; True when both took effect."""
    if any(os.environ.get(k) for k in _USER_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
