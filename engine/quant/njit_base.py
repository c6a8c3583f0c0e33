"""numba helpers every kernel file shares: the compile options of the exact decoders and of the
reductions, and the small inlined readers of block fields. A leaf: it imports no kernel file, so
kernels.py, lowbit_kernels.py and arm/lowbit.py all build on it without importing each other.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from engine.llvm_ops import half_bits_to_f32

__all__ = ["DQ", "MV", "f16_at", "group_sums", "half", "qf", "scale_min_k4", "scale_min_k4_int", "u32_at"]

_F32 = np.float32
DQ: dict[str, bool] = dict(parallel=True, fastmath=False, cache=True)  # exact decode
MV: dict[str, bool] = dict(parallel=True, fastmath=True, cache=True)   # reductions


@njit(inline="always", cache=True)
def half(h):
    """IEEE half (as an integer 0..65535) -> float32, exact."""
    return half_bits_to_f32(h)


@njit(inline="always", cache=True)
def f16_at(w, p):
    return half(np.uint16(w[p]) | (np.uint16(w[p + 1]) << np.uint16(8)))


@njit(inline="always", cache=True)
def qf(v):
    """Small non-negative integer -> float32 through int32, so LLVM keeps the lane math 32-bit
    (numba types integer expressions as int64; a 64-bit sitofp would demand every bit)."""
    return _F32(np.int32(v))


@njit(cache=True)
def group_sums(x, group):
    """Sums of consecutive groups of ``group`` values of x (float32)."""
    n = x.shape[0] // group
    s = np.empty(n, dtype=np.float32)
    for i in range(n):
        acc = _F32(0.0)
        for l in range(group):
            acc += x[i * group + l]
        s[i] = acc
    return s


@njit(inline="always", cache=True)
def u32_at(w, p):
    return (np.int64(w[p]) | (np.int64(w[p + 1]) << 8)
            | (np.int64(w[p + 2]) << 16) | (np.int64(w[p + 3]) << 24))


@njit(inline="always", cache=True)
def scale_min_k4_int(w, p, j):
    """get_scale_min_k4 for sub-block j of the 12 scale bytes at w[p:p+12], as integers."""
    if j < 4:
        sc = w[p + j] & 63
        m = w[p + j + 4] & 63
    else:
        sc = (w[p + j + 4] & 0xF) | ((w[p + j - 4] >> 6) << 4)
        m = (w[p + j + 4] >> 4) | ((w[p + j] >> 6) << 4)
    return sc, m


@njit(inline="always", cache=True)
def scale_min_k4(w, p, j):
    sc, m = scale_min_k4_int(w, p, j)
    return _F32(sc), _F32(m)
