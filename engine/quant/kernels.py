"""Fast numba kernels for every weight format in :mod:`engine.quant.formats`.

Two operations per format, one njit kernel each, chosen by a Python-level dispatch on qtype:

* ``dequantize_rows_into(qtype, raw, out)`` -- prefill: decode a whole matrix into a reused
  float32 buffer, then BLAS does ``X @ W.T``. Compiled *without* fastmath (there is no
  reduction to reassociate, and forbidding FMA contraction keeps the output bit-identical to
  :func:`engine.quant.formats.dequantize` and therefore to ``gguf.quants``).
* ``matvec(qtype, raw, x, out)`` -- decode: ``out = W @ round_activations(x)`` reading each
  weight byte once. Where paths.has_int8 says so (the x86 levels, arm64 with dot products) the
  K formats, Q8_0 and the low-bit formats run in integer arithmetic against Q8_K / Q8_0
  activations, as llama.cpp does. Everything else is the float path, ``fastmath=True`` so
  LLVM vectorises the per-block loop; every 256-value K block
  is one loop with all its sub-block scales inside, i.e. one horizontal reduction per block.
  Constant offsets and Q4_K/Q5_K mins are folded out with per-sub-block sums of ``x`` that are
  computed once per call (``sum_l q*x - 32*sum_l x`` instead of ``sum_l (q-32)*x``).

The float kernels are portable LLVM, the same code on arm64 Graviton and x86_64. The integer
kernels are per ISA: int8_dot.py's generic IR and x86_avx2.py / x86_avx512.py / x86_lowbit.py on
the x86 levels, arm_neon.py / arm_lowbit.py (`sdot`, `smmla`) on arm64 with dot products, chosen
by the level engine/quant/paths.py reads once. f16 scales are decoded with LLVM's `fpext half`
(engine/llvm_ops.py).

``bench_matvec(qtype, rows, cols, reps)`` returns weight-bytes GB/s for the benchmark script.
"""

from __future__ import annotations

import platform
import time

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from engine.jit import SERIAL_BELOW, serial_twin
from engine.llvm_ops import bits_to_f32

from .activations import Q8KTokens, quantize_q8_0, quantize_q8_k, quantize_q8_k_tokens, round_activations
from . import paths
from . import arm_neon
from . import x86_avx2, x86_avx512  # noqa: F401 (they register their block bodies with int8_dot)
from .arm_neon import q4_k_row_pair_smmla, q5_k_row_pair_smmla, q6_k_row_pair_smmla, q8_0_row_pair_smmla
from .arm_neon import q4_k_x4_dot, q4_k_x4_smmla, q4_k_x4_tile, q6_k_x4_dot, q6_k_x4_smmla, q6_k_x4_tile
from .formats import get_format, quantize, row_bytes
from .njit_base import DQ as _DQ
from .njit_base import MV as _MV
from .njit_base import f16_at as _f16_at
from .njit_base import group_sums as _group_sums
from .njit_base import half as _half
from .njit_base import qf as _qf
from .njit_base import u32_at as _u32_at
from .int8_dot import (KNOBS, TILE, WIDE_TILE, q4_k_row_dot, q4_k_row_dot_tile, q5_k_row_dot, q5_k_row_dot_tile,
                       q6_k_row_dot, q6_k_row_dot_tile, q8_0_row_dot, q8_0_row_dot_tile)
from .lowbit_kernels import DEQUANT as _LOWBIT_DEQUANT, MATVEC as _LOWBIT_MATVEC
from .lowbit_kernels import MATVEC_INT8 as _LOWBIT_MATVEC_INT8, MULTI_TOKEN_INT8 as _LOWBIT_MM
from .lowbit_kernels import PANEL as _LOWBIT_PANEL

_F32 = np.float32


# ----------------------------------------------------------------------------- scalar helpers

@njit(inline="always", cache=True)
def _scale_min_k4_int(w, p, j):
    """get_scale_min_k4 for sub-block j of the 12 scale bytes at w[p:p+12], as integers."""
    if j < 4:
        sc = w[p + j] & 63
        m = w[p + j + 4] & 63
    else:
        sc = (w[p + j + 4] & 0xF) | ((w[p + j - 4] >> 6) << 4)
        m = (w[p + j + 4] >> 4) | ((w[p + j] >> 6) << 4)
    return sc, m


@njit(inline="always", cache=True)
def _scale_min_k4(w, p, j):
    sc, m = _scale_min_k4_int(w, p, j)
    return _F32(sc), _F32(m)


# ----------------------------------------------------------------------------- float formats

@njit(**_DQ)
def _dq_f32(w, out):
    for r in prange(w.shape[0]):
        for c in range(out.shape[1]):
            out[r, c] = w[r, c]


@njit(**_DQ)
def _dq_f16(w, out):
    for r in prange(w.shape[0]):
        for c in range(out.shape[1]):
            out[r, c] = _half(np.int64(w[r, c]))


@njit(**_DQ)
def _dq_bf16(w, out):
    for r in prange(w.shape[0]):
        for c in range(out.shape[1]):
            out[r, c] = bits_to_f32(np.uint32(w[r, c]) << 16)


@njit(**_MV)
def _mv_f32(w, x, out):
    for r in prange(w.shape[0]):
        s = _F32(0.0)
        for c in range(x.shape[0]):
            s += w[r, c] * x[c]
        out[r] = s


@njit(**_MV)
def _mv_f16(w, x, out):
    for r in prange(w.shape[0]):
        s = _F32(0.0)
        for c in range(x.shape[0]):
            s += _half(np.int64(w[r, c])) * x[c]
        out[r] = s


@njit(**_MV)
def _mv_bf16(w, x, out):
    for r in prange(w.shape[0]):
        s = _F32(0.0)
        for c in range(x.shape[0]):
            s += bits_to_f32(np.uint32(w[r, c]) << 16) * x[c]
        out[r] = s


# ----------------------------------------------------------------------------- 32-value formats

@njit(**_DQ)
def _dq_q8_0(w, out):
    nb = out.shape[1] // 32
    for r in prange(w.shape[0]):
        for b in range(nb):
            p = b * 34
            d = _f16_at(w[r], p)
            for l in range(32):
                q = np.int64(w[r, p + 2 + l])
                q = q - ((q & 128) << 1)  # int8
                out[r, b * 32 + l] = _F32(q) * d



@njit(**_DQ)
def _dq_q4_0(w, out):
    nb = out.shape[1] // 32
    for r in prange(w.shape[0]):
        for b in range(nb):
            p = b * 18
            d = _f16_at(w[r], p)
            for l in range(16):
                q = w[r, p + 2 + l]
                # through int32 (_qf): an int64 -> float conversion kept this loop scalar on arm64
                out[r, b * 32 + l] = d * (_qf(q & 15) - _F32(8.0))
                out[r, b * 32 + 16 + l] = d * (_qf(q >> 4) - _F32(8.0))


@njit(**_MV)
def _mv_q4_0(w, x, out, h):
    nb = x.shape[0] // 32
    xs = _group_sums(x, 32)
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 18
            d = _f16_at(row, p)
            s = _F32(0.0)
            for l in range(h):
                q = row[p + 2 + l]
                s += _qf(q & 15) * x[b * 32 + l] + _qf(q >> 4) * x[b * 32 + 16 + l]
            acc += d * (s - _F32(8.0) * xs[b])
        out[r] = acc


@njit(**_DQ)
def _dq_q4_1(w, out):
    nb = out.shape[1] // 32
    for r in prange(w.shape[0]):
        for b in range(nb):
            p = b * 20
            d = _f16_at(w[r], p)
            m = _f16_at(w[r], p + 2)
            for l in range(16):
                q = w[r, p + 4 + l]
                out[r, b * 32 + l] = d * _qf(q & 15) + m
                out[r, b * 32 + 16 + l] = d * _qf(q >> 4) + m


@njit(**_MV)
def _mv_q4_1(w, x, out, h):
    nb = x.shape[0] // 32
    xs = _group_sums(x, 32)
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 20
            d = _f16_at(row, p)
            m = _f16_at(row, p + 2)
            s = _F32(0.0)
            for l in range(h):
                q = row[p + 4 + l]
                s += _qf(q & 15) * x[b * 32 + l] + _qf(q >> 4) * x[b * 32 + 16 + l]
            acc += d * s + m * xs[b]
        out[r] = acc


@njit(**_DQ)
def _dq_q5_0(w, out):
    nb = out.shape[1] // 32
    for r in prange(w.shape[0]):
        for b in range(nb):
            p = b * 22
            d = _f16_at(w[r], p)
            qh = _u32_at(w[r], p + 2)
            for l in range(16):
                q = np.int64(w[r, p + 6 + l])
                lo = (q & 15) | (((qh >> l) & 1) << 4)
                hi = (q >> 4) | (((qh >> (l + 16)) & 1) << 4)
                out[r, b * 32 + l] = d * _F32(lo - 16)
                out[r, b * 32 + 16 + l] = d * _F32(hi - 16)


@njit(**_MV)
def _mv_q5_0(w, x, out, h):
    nb = x.shape[0] // 32
    xs = _group_sums(x, 32)
    for r in prange(w.shape[0]):
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 22
            d = _f16_at(w[r], p)
            qh = _u32_at(w[r], p + 2)
            s = _F32(0.0)
            for l in range(h):
                q = np.int64(w[r, p + 6 + l])
                lo = (q & 15) | (((qh >> l) & 1) << 4)
                hi = (q >> 4) | (((qh >> (l + 16)) & 1) << 4)
                s += _F32(lo) * x[b * 32 + l] + _F32(hi) * x[b * 32 + 16 + l]
            acc += d * (s - _F32(16.0) * xs[b])
        out[r] = acc


@njit(**_DQ)
def _dq_q5_1(w, out):
    nb = out.shape[1] // 32
    for r in prange(w.shape[0]):
        for b in range(nb):
            p = b * 24
            d = _f16_at(w[r], p)
            m = _f16_at(w[r], p + 2)
            qh = _u32_at(w[r], p + 4)
            for l in range(16):
                q = np.int64(w[r, p + 8 + l])
                lo = (q & 15) | (((qh >> l) & 1) << 4)
                hi = (q >> 4) | (((qh >> (l + 16)) & 1) << 4)
                out[r, b * 32 + l] = d * _F32(lo) + m
                out[r, b * 32 + 16 + l] = d * _F32(hi) + m


@njit(**_MV)
def _mv_q5_1(w, x, out, h):
    nb = x.shape[0] // 32
    xs = _group_sums(x, 32)
    for r in prange(w.shape[0]):
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 24
            d = _f16_at(w[r], p)
            m = _f16_at(w[r], p + 2)
            qh = _u32_at(w[r], p + 4)
            s = _F32(0.0)
            for l in range(h):
                q = np.int64(w[r, p + 8 + l])
                lo = (q & 15) | (((qh >> l) & 1) << 4)
                hi = (q >> 4) | (((qh >> (l + 16)) & 1) << 4)
                s += _F32(lo) * x[b * 32 + l] + _F32(hi) * x[b * 32 + 16 + l]
            acc += d * s + m * xs[b]
        out[r] = acc


# ----------------------------------------------------------------------------- K formats

@njit(**_DQ)
def _dq_q4_k(w, out):
    nb = out.shape[1] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 144
            d = _f16_at(row, p)
            dmin = _f16_at(row, p + 2)
            for c in range(4):
                sa, ma = _scale_min_k4(row, p + 4, 2 * c)
                sb, mb = _scale_min_k4(row, p + 4, 2 * c + 1)
                da = d * sa
                db = d * sb
                mma = dmin * ma
                mmb = dmin * mb
                q0 = p + 16 + 32 * c
                o = b * 256 + 64 * c
                for l in range(32):
                    q = row[q0 + l]
                    out[r, o + l] = da * _F32(q & 15) - mma
                    out[r, o + 32 + l] = db * _F32(q >> 4) - mmb


@njit(inline="always", cache=True)
def _k4_block_scales(row, p):
    d = _f16_at(row, p)
    dmin = _f16_at(row, p + 2)
    s0, m0 = _scale_min_k4(row, p + 4, 0)
    s1, m1 = _scale_min_k4(row, p + 4, 1)
    s2, m2 = _scale_min_k4(row, p + 4, 2)
    s3, m3 = _scale_min_k4(row, p + 4, 3)
    s4, m4 = _scale_min_k4(row, p + 4, 4)
    s5, m5 = _scale_min_k4(row, p + 4, 5)
    s6, m6 = _scale_min_k4(row, p + 4, 6)
    s7, m7 = _scale_min_k4(row, p + 4, 7)
    return (d * s0, d * s1, d * s2, d * s3, d * s4, d * s5, d * s6, d * s7,
            dmin, m0, m1, m2, m3, m4, m5, m6, m7)


@njit(**_MV)
def _mv_q4_k(w, x, out):
    nb = x.shape[0] // 256
    xs = _group_sums(x, 32)
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 144
            (d0, d1, d2, d3, d4, d5, d6, d7,
             dmin, m0, m1, m2, m3, m4, m5, m6, m7) = _k4_block_scales(row, p)
            g = b * 8
            mins = dmin * (m0 * xs[g] + m1 * xs[g + 1] + m2 * xs[g + 2] + m3 * xs[g + 3]
                           + m4 * xs[g + 4] + m5 * xs[g + 5] + m6 * xs[g + 6] + m7 * xs[g + 7])
            sixteenth = _F32(0.0625)
            d1 *= sixteenth
            d3 *= sixteenth
            d5 *= sixteenth
            d7 *= sixteenth
            q = p + 16
            o = b * 256
            s = _F32(0.0)
            for l in range(32):
                a0 = row[q + l]
                a1 = row[q + 32 + l]
                a2 = row[q + 64 + l]
                a3 = row[q + 96 + l]
                # high nibbles as (a & 0xF0) with the scale pre-divided by 16: no shifts
                s += (d0 * _qf(a0 & 15) * x[o + l] + d1 * _qf(a0 & 240) * x[o + 32 + l]
                      + d2 * _qf(a1 & 15) * x[o + 64 + l] + d3 * _qf(a1 & 240) * x[o + 96 + l]
                      + d4 * _qf(a2 & 15) * x[o + 128 + l] + d5 * _qf(a2 & 240) * x[o + 160 + l]
                      + d6 * _qf(a3 & 15) * x[o + 192 + l] + d7 * _qf(a3 & 240) * x[o + 224 + l])
            acc += s - mins
        out[r] = acc


@njit(**_DQ)
def _dq_q5_k(w, out):
    nb = out.shape[1] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 176
            d = _f16_at(row, p)
            dmin = _f16_at(row, p + 2)
            for c in range(4):
                sa, ma = _scale_min_k4(row, p + 4, 2 * c)
                sb, mb = _scale_min_k4(row, p + 4, 2 * c + 1)
                da = d * sa
                db = d * sb
                mma = dmin * ma
                mmb = dmin * mb
                q0 = p + 48 + 32 * c
                o = b * 256 + 64 * c
                for l in range(32):
                    q = np.int64(row[q0 + l])
                    h = np.int64(row[p + 16 + l])
                    out[r, o + l] = da * _F32((q & 15) | (((h >> (2 * c)) & 1) << 4)) - mma
                    out[r, o + 32 + l] = db * _F32((q >> 4) | (((h >> (2 * c + 1)) & 1) << 4)) - mmb


@njit(**_MV)
def _mv_q5_k(w, x, out):
    nb = x.shape[0] // 256
    xs = _group_sums(x, 32)
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 176
            (d0, d1, d2, d3, d4, d5, d6, d7,
             dmin, m0, m1, m2, m3, m4, m5, m6, m7) = _k4_block_scales(row, p)
            g = b * 8
            mins = dmin * (m0 * xs[g] + m1 * xs[g + 1] + m2 * xs[g + 2] + m3 * xs[g + 3]
                           + m4 * xs[g + 4] + m5 * xs[g + 5] + m6 * xs[g + 6] + m7 * xs[g + 7])
            sixteenth = _F32(0.0625)
            d1 *= sixteenth
            d3 *= sixteenth
            d5 *= sixteenth
            d7 *= sixteenth
            d6 *= _F32(0.25)
            q = p + 48
            o = b * 256
            s = _F32(0.0)
            for l in range(32):
                h = row[p + 16 + l]
                a0 = row[q + l]
                a1 = row[q + 32 + l]
                a2 = row[q + 64 + l]
                a3 = row[q + 96 + l]
                # 16*q for high nibbles, 4*q for sub-block 6: masks and left shifts only
                s += (d0 * _qf((a0 & 15) | ((h & 1) << 4)) * x[o + l]
                      + d1 * _qf((a0 & 240) | ((h & 2) << 7)) * x[o + 32 + l]
                      + d2 * _qf((a1 & 15) | ((h & 4) << 2)) * x[o + 64 + l]
                      + d3 * _qf((a1 & 240) | ((h & 8) << 5)) * x[o + 96 + l]
                      + d4 * _qf((a2 & 15) | (h & 16)) * x[o + 128 + l]
                      + d5 * _qf((a2 & 240) | ((h & 32) << 3)) * x[o + 160 + l]
                      + d6 * _qf(((a3 & 15) << 2) | (h & 64)) * x[o + 192 + l]
                      + d7 * _qf((a3 & 240) | ((h & 128) << 1)) * x[o + 224 + l])
            acc += s - mins
        out[r] = acc


@njit(**_DQ)
def _dq_q6_k(w, out):
    nb = out.shape[1] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 210
            d = _f16_at(row, p + 208)
            for h in range(2):
                for t in range(4):
                    qlo = p + 64 * h + 32 * (t & 1)
                    qhi = p + 128 + 32 * h
                    sh = 4 * (t >> 1)
                    for half in range(2):  # 16 values per scale: hoisted out of the lane loop
                        ds = d * _i8(row[p + 192 + 8 * h + 2 * t + half])
                        o = b * 256 + 128 * h + 32 * t + 16 * half
                        for l in range(16 * half, 16 * half + 16):
                            q = ((np.int32(row[qlo + l]) >> sh) & 15) | (((np.int32(row[qhi + l]) >> (2 * t)) & 3) << 4)
                            out[r, o + l - 16 * half] = ds * _F32(q - 32)


@njit(inline="always", cache=True)
def _i8(v):
    v = np.int64(v)
    return _F32(v - ((v & 128) << 1))



# ----------------------------------------------------------------------------- prepared scales
# Per-block scales decoded once (at load or on first use) into float32 arrays beside the mmap'd
# quant bytes, so the hot loop does no f16 decoding. Measured (1 thread, CPU-s, L3-resident):
# Q8_0 3.7 -> ~8-10 GB/s (f16 decode per 32 values dominated), Q6_K 1.5 -> 2.0-2.7 GB/s.

@njit(parallel=True, cache=True)
def _prep_q8_0(w, nb, qk, d):
    for r in prange(w.shape[0]):
        for b in range(nb):
            d[r, b] = _f16_at(w[r], b * (qk + 2))


@njit(parallel=True, cache=True)
def _prep_q6_k(w, nb, sc):
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 210
            d = _f16_at(row, p + 208)
            for j in range(16):
                sc[r, b * 16 + j] = d * _i8(row[p + 192 + j])


@njit(**_MV)
def _mv_q8_0p(w, d, x, out, qk):
    nb = x.shape[0] // qk
    for r in prange(w.shape[0]):
        row8 = w[r].view(np.int8)
        acc = _F32(0.0)
        for b in range(nb):
            p = b * (qk + 2) + 2
            s = _F32(0.0)
            for l in range(qk):
                s += _F32(np.int32(row8[p + l])) * x[b * qk + l]
            acc += d[r, b] * s
        out[r] = acc


@njit(**_MV)
def _mv_q6_kp(w, sc, x, out, n):
    nb = x.shape[0] // 256
    xs = _group_sums(x, 16)
    sixteenth = _F32(0.0625)
    for r in prange(w.shape[0]):
        row = w[r]
        offs = _F32(0.0)
        for j in range(nb * 16):
            offs += sc[r, j] * xs[j]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 210
            g = b * 16
            # scale of (half h, t, lane-half hh) is sc[8h + 2t + hh]; t = 2, 3 decoded as 16*q
            c00 = sc[r, g]; c01 = sc[r, g + 1]; c10 = sc[r, g + 2]; c11 = sc[r, g + 3]
            c20 = sc[r, g + 4] * sixteenth; c21 = sc[r, g + 5] * sixteenth
            c30 = sc[r, g + 6] * sixteenth; c31 = sc[r, g + 7] * sixteenth
            e00 = sc[r, g + 8]; e01 = sc[r, g + 9]; e10 = sc[r, g + 10]; e11 = sc[r, g + 11]
            e20 = sc[r, g + 12] * sixteenth; e21 = sc[r, g + 13] * sixteenth
            e30 = sc[r, g + 14] * sixteenth; e31 = sc[r, g + 15] * sixteenth
            o = b * 256
            s = _F32(0.0)
            for i in range(n):
                a = row[p + i]; bb = row[p + 32 + i]; c = row[p + 128 + i]
                A = row[p + 16 + i]; B = row[p + 48 + i]; C = row[p + 144 + i]
                s += (c00 * _qf((a & 15) | ((c & 3) << 4)) * x[o + i]
                      + c10 * _qf((bb & 15) | ((c & 12) << 2)) * x[o + 32 + i]
                      + c20 * _qf((a & 240) | ((c & 48) << 4)) * x[o + 64 + i]
                      + c30 * _qf((bb & 240) | ((c & 192) << 2)) * x[o + 96 + i]
                      + c01 * _qf((A & 15) | ((C & 3) << 4)) * x[o + 16 + i]
                      + c11 * _qf((B & 15) | ((C & 12) << 2)) * x[o + 48 + i]
                      + c21 * _qf((A & 240) | ((C & 48) << 4)) * x[o + 80 + i]
                      + c31 * _qf((B & 240) | ((C & 192) << 2)) * x[o + 112 + i])
                a = row[p + 64 + i]; bb = row[p + 96 + i]; c = row[p + 160 + i]
                A = row[p + 80 + i]; B = row[p + 112 + i]; C = row[p + 176 + i]
                s += (e00 * _qf((a & 15) | ((c & 3) << 4)) * x[o + 128 + i]
                      + e10 * _qf((bb & 15) | ((c & 12) << 2)) * x[o + 160 + i]
                      + e20 * _qf((a & 240) | ((c & 48) << 4)) * x[o + 192 + i]
                      + e30 * _qf((bb & 240) | ((c & 192) << 2)) * x[o + 224 + i]
                      + e01 * _qf((A & 15) | ((C & 3) << 4)) * x[o + 144 + i]
                      + e11 * _qf((B & 15) | ((C & 12) << 2)) * x[o + 176 + i]
                      + e21 * _qf((A & 240) | ((C & 48) << 4)) * x[o + 208 + i]
                      + e31 * _qf((B & 240) | ((C & 192) << 2)) * x[o + 240 + i])
            acc += s
        out[r] = acc - _F32(32.0) * offs


# ----------------------------------------------------------------------------- int8 path
# K formats times Q8_K activations and Q8_0 times Q8_0 activations in integer arithmetic, as
# llama.cpp does it (int8_dot.py has the why): each row in LLVM IR with a float accumulator
# vector carried across its blocks. The f16 block scales are decoded in the loop: nothing
# prepared beside the mmap. Measured with `python -m bench.kernels` (GB/s of weight bytes, 2
# threads wall, 1024x3584): Q4_K 4.6 (float kernel) -> 14-15 (one reduction per block) -> 20-23
# (one per row); Q6_K 3.5 -> 12-16 -> 19-21; Q8_0 8.8 -> 16-19.

@njit(**_MV)
def _mv_k_q8k(w, xq, xd, xs16, out, knobs, q6):
    # one kernel for both K formats: the format test is per row, not per block
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        if q6:
            out[r] = q6_k_row_dot(w[r], nb, xq, xd, xs16, knobs)
        else:
            out[r] = q4_k_row_dot(w[r], nb, xq, xd, xs16, knobs)


@njit(**_MV)
def _mv_q5_k_q8k(w, xq, xd, xs16, out, knobs, q6):
    # arm64 only (arm_neon.py): _mv_k_q8k's arguments, so MatvecPlan calls both alike
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q5_k_row_dot(w[r], nb, xq, xd, xs16, knobs)


@njit(**_MV)
def _mv_q8_0_q8(w, xq16, xd, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q8_0_row_dot(w[r], nb, xq16, xd)


# Several tokens at once (a prefill, or a chat turn's suffix): each weight block is unpacked once
# per WIDE_TILE tokens (Q8_0: TILE). xq (Tp*cols) int8, xd (Tp*nb) f32, xs16 (Tp*cols/16) int16
# with Tp a multiple of the tile (padding tokens are zeros); out (Tp, rows). Rows go in chunks of
# ROW_CHUNK: the tile's activations stay in L1 across the chunk's rows, and the small result
# buffer is allocated per chunk, not per row.
_ROW_CHUNK = 16


@njit(**_MV)
def _mm_k_q8k(w, xq, xd, xs16, out, knobs, q6):
    # Q4_K: out holds the mins' product on entry (MatvecPlan.tokens_q8k) and the kernel subtracts
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                if q6:
                    q6_k_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                      xs16, t0 * cols // 16, cols // 16, res, knobs)
                    for t in range(WIDE_TILE):
                        out[t0 + t, r] = res[t]
                else:
                    q4_k_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                      xs16, t0 * cols // 16, cols // 16, res, knobs)
                    for t in range(WIDE_TILE):
                        out[t0 + t, r] = res[t] - out[t0 + t, r]


@njit(**_MV)
def _mm_q5_k_q8k(w, xq, xd, xs16, out, knobs):
    # _mm_k_q8k for Q5_K (arm64 only, arm_neon.py): out holds the mins' product on entry
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                q5_k_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                  xs16, t0 * cols // 16, cols // 16, res, knobs)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t] - out[t0 + t, r]


@njit(parallel=True, cache=True)
def _q4_k_mins(w, nb, out, block_bytes=144):
    """out[r, 8b + j] = dmin * min j of block b of row r (get_scale_min_k4's mins; Q5_K's blocks,
    176 bytes, have the same header)."""
    for r in prange(w.shape[0]):
        for i in range(nb):
            p = i * block_bytes
            dmin = _f16_at(w[r], p + 2)
            for j in range(8):
                out[r, 8 * i + j] = dmin * _scale_min_k4(w[r], p + 4, j)[1]


@njit(**_MV)
def _mm_q8_0_q8(w, xq16, xd, out):
    # the Q8_0 twin of _mm_k_q8k (Q8_0 activations: int16 values, f32 scale per 32)
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 32
    rows = w.shape[0]
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(TILE, np.float32)
        for t0 in range(0, tp, TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                q8_0_row_dot_tile(w[r], nb, xq16, t0 * cols, cols, xd, t0 * nb, nb, res)
                for t in range(TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_k_smmla(w, xq, xd, xs16, out, knobs, kind):
    # _mm_k_q8k / _mm_q5_k_q8k on arm64's i8mm level (arm_neon.py): two rows per `smmla` tile;
    # kind 0 Q4_K, 1 Q6_K, 2 Q5_K; Q4_K/Q5_K: out holds the mins' product on entry
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(2 * WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK), 2):
                r2 = min(r + 1, rows - 1)
                if kind == 1:
                    q6_k_row_pair_smmla(w[r], w[r2], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                        xs16, t0 * cols // 16, cols // 16, res, knobs)
                elif kind == 2:
                    q5_k_row_pair_smmla(w[r], w[r2], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                        xs16, t0 * cols // 16, cols // 16, res, knobs)
                else:
                    q4_k_row_pair_smmla(w[r], w[r2], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                        xs16, t0 * cols // 16, cols // 16, res, knobs)
                for t in range(WIDE_TILE):
                    if kind == 1:
                        out[t0 + t, r] = res[t]
                    else:
                        out[t0 + t, r] = res[t] - out[t0 + t, r]
                    if r2 > r:
                        if kind == 1:
                            out[t0 + t, r2] = res[WIDE_TILE + t]
                        else:
                            out[t0 + t, r2] = res[WIDE_TILE + t] - out[t0 + t, r2]


@njit(**_MV)
def _mm_q8_0_smmla(w, xq, xd, out):
    # _mm_q8_0_q8 on arm64's i8mm level (arm_neon.py): two rows per `smmla` tile (an odd last
    # row is paired with itself and its twin result dropped); _ROW_CHUNK is even
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 32
    rows = w.shape[0]
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(2 * TILE, np.float32)
        for t0 in range(0, tp, TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK), 2):
                r2 = min(r + 1, rows - 1)
                q8_0_row_pair_smmla(w[r], w[r2], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, res)
                for t in range(TILE):
                    out[t0 + t, r] = res[t]
                    if r2 > r:
                        out[t0 + t, r2] = res[TILE + t]


# arm64's Q4_K and Q6_K in the x4 layout (arm_neon.repack_x4: 4 rows interleaved, one `sdot` lane
# per row): w4 (ceil(rows / 4), blocks * X4_BLOCK). A group of 4 rows is one intrinsic call; the
# last, partial group goes through a 4-row scratch. q6: Q6_K, else Q4_K.
@njit(**_MV)
def _mv_k_x4(w4, xq, xd, xs16, out, rows, q6):
    nb = xd.shape[0]
    full = rows // 4
    for g in prange(w4.shape[0]):
        if g < full:
            if q6:
                q6_k_x4_dot(w4[g], nb, xq, xd, xs16, out, 4 * g)
            else:
                q4_k_x4_dot(w4[g], nb, xq, xd, xs16, out, 4 * g)
        else:
            tmp = np.empty(4, np.float32)
            if q6:
                q6_k_x4_dot(w4[g], nb, xq, xd, xs16, tmp, 0)
            else:
                q4_k_x4_dot(w4[g], nb, xq, xd, xs16, tmp, 0)
            for r in range(rows - 4 * g):
                out[4 * g + r] = tmp[r]


_X4_CHUNK = _ROW_CHUNK // 4  # groups per chunk: the tile's activations stay in L1 across them


@njit(inline="always", cache=True)
def _x4_tile_dst(out, tmp, rows, t0, g):
    """Where group g's tile results go: out itself (flat (Tp, rows), at t0 * rows + 4g, stride
    rows), or for the last, partial group tmp (4 rows x WIDE_TILE tokens) loaded with what out
    holds (Q4_K: the mins' product)."""
    if 4 * g + 4 <= rows:
        return out, t0 * rows + 4 * g, rows
    for t in range(WIDE_TILE):
        for r in range(4):
            tmp[4 * t + r] = out[(t0 + t) * rows + 4 * g + r] if 4 * g + r < rows else 0.0
    return tmp, 0, 4


@njit(inline="always", cache=True)
def _x4_tile_tail(out, tmp, rows, t0, g):
    if 4 * g + 4 > rows:
        for t in range(WIDE_TILE):
            for r in range(rows - 4 * g):
                out[(t0 + t) * rows + 4 * g + r] = tmp[4 * t + r]


@njit(**_MV)
def _mm_k_x4(w4, xq, xd, out, rows, q6):
    # `sdot` tiles of x4 groups (N1); out (Tp * rows) flat, Q4_K: holds the mins' product on
    # entry, which the tiles subtract
    tp = out.shape[0] // rows
    nb = xd.shape[0] // tp
    cols = nb * 256
    groups = w4.shape[0]
    for c in prange((groups + _X4_CHUNK - 1) // _X4_CHUNK):
        tmp = np.empty(4 * WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for g in range(c * _X4_CHUNK, min(groups, (c + 1) * _X4_CHUNK)):
                dst, o, stride = _x4_tile_dst(out, tmp, rows, t0, g)
                if q6:
                    q6_k_x4_tile(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                else:
                    q4_k_x4_tile(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                _x4_tile_tail(out, tmp, rows, t0, g)


@njit(**_MV)
def _mm_k_x4_smmla(w4, xq, xd, out, rows, q6):
    # _mm_k_x4 with `smmla` (i8mm: V1/V2 only; N1 never compiles it)
    tp = out.shape[0] // rows
    nb = xd.shape[0] // tp
    cols = nb * 256
    groups = w4.shape[0]
    for c in prange((groups + _X4_CHUNK - 1) // _X4_CHUNK):
        tmp = np.empty(4 * WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for g in range(c * _X4_CHUNK, min(groups, (c + 1) * _X4_CHUNK)):
                dst, o, stride = _x4_tile_dst(out, tmp, rows, t0, g)
                if q6:
                    q6_k_x4_smmla(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                else:
                    q4_k_x4_smmla(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                _x4_tile_tail(out, tmp, rows, t0, g)


@njit(parallel=True, cache=True)
def _q4_k_mins_x4(w4, nb, out):
    """_q4_k_mins of an x4 Q4_K matrix: out[4g + r, 8b + j] = dmin_r * min j of block b (the
    rows of the last group past out's are skipped)."""
    rows = out.shape[0]
    for g in prange(w4.shape[0]):
        for i in range(nb):
            p = i * 592
            for r in range(min(4, rows - 4 * g)):
                dmin = _f16_at(w4[g], p + 8 + 2 * r)
                for j in range(8):
                    out[4 * g + r, 8 * i + j] = dmin * _F32(w4[g][p + 48 + 4 * j + r])


def prepare(qtype, raw: np.ndarray, rows: int, cols: int):
    """Load-time preparation for :func:`matvec` (decoded per-block scales), or None when the
    format's kernel reads everything from the raw bytes. Pass the result as ``prepared``."""
    qt, w = _weights(qtype, raw, rows, cols)
    if qt == T.Q8_0:
        d = np.empty((rows, cols // 32), np.float32)
        _prep_q8_0(w, cols // 32, 32, d)
        return d
    if qt == T.Q6_K:
        sc = np.empty((rows, cols // 256 * 16), np.float32)
        _prep_q6_k(w, cols // 256, sc)
        return sc
    return None


# ----------------------------------------------------------------------------- dispatch

_DEQUANT = {
    T.F32: _dq_f32, T.F16: _dq_f16, T.BF16: _dq_bf16,
    T.Q8_0: _dq_q8_0, T.Q4_0: _dq_q4_0, T.Q4_1: _dq_q4_1, T.Q5_0: _dq_q5_0, T.Q5_1: _dq_q5_1,
    T.Q4_K: _dq_q4_k, T.Q5_K: _dq_q5_k, T.Q6_K: _dq_q6_k,
}
_MATVEC = {
    T.F32: _mv_f32, T.F16: _mv_f16, T.BF16: _mv_bf16,
    T.Q8_0: _mv_q8_0p, T.Q4_0: _mv_q4_0, T.Q4_1: _mv_q4_1, T.Q5_0: _mv_q5_0, T.Q5_1: _mv_q5_1,
    T.Q4_K: _mv_q4_k, T.Q5_K: _mv_q5_k, T.Q6_K: _mv_q6_kp,
}
# The smaller downloads' formats (Q2_K, Q3_K, IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS): engine/quant/lowbit_kernels.py
# (imported at the top), arm64's `sdot` rows and tiles for them instead (arm_lowbit.py)
if paths.target().level.is_arm:
    from .arm_lowbit import MATVEC_INT8 as _LOWBIT_MATVEC_INT8, MULTI_TOKEN_INT8 as _LOWBIT_MM

_DEQUANT.update(_LOWBIT_DEQUANT)
_MATVEC.update(_LOWBIT_MATVEC)
_MATVEC_SERIAL = {qt: serial_twin(k) for qt, k in _MATVEC.items()}
_PREPARED = {T.Q8_0, T.Q6_K}  # kernels taking (w, prepared, x, out, ...)
# Inner-loop trip counts passed at run time, not as constants: with a constant count LLVM fully
# unrolls the per-block loop and then vectorises the *block* loop (stride 34/144/210 bytes: byte
# gathers with vpinsrb), 4-8x slower than vectorising the contiguous inner loop.
_MV_ARGS = {
    T.Q8_0: (32,), T.Q4_0: (16,), T.Q4_1: (16,), T.Q5_0: (16,), T.Q5_1: (16,),
    T.Q6_K: (16,),  # Q4_K/Q5_K: the constant 32 measured better (LLVM keeps a vector accumulator)
}
_VIEW = {T.F32: np.float32, T.F16: np.uint16, T.BF16: np.uint16}


def _weights(qtype, raw: np.ndarray, rows: int, cols: int):
    """Validate raw bytes of a (rows, cols) matrix and return (qtype, the 2-D array a kernel takes)."""
    fmt = get_format(qtype)
    rb = row_bytes(fmt.qtype, cols)
    if type(raw) is not np.ndarray:  # memmap and other subclasses -> plain view
        raw = np.asarray(raw).view(np.ndarray)
    if raw.dtype != np.uint8:
        raise TypeError(f"raw weights must be uint8 bytes, got {raw.dtype}")
    if raw.size != rows * rb:
        raise ValueError(f"{fmt.qtype.name} ({rows}, {cols}) needs {rows * rb} bytes, got {raw.size}")
    if raw.ndim != 2 or raw.shape[0] != rows:
        raw = raw.reshape(rows, rb)
    if not raw.flags.c_contiguous:
        raw = np.ascontiguousarray(raw)
    view = _VIEW.get(fmt.qtype)
    if view is not None:
        raw = raw.view(view)
    return fmt.qtype, raw


def _check_f32(name: str, a: np.ndarray, shape: tuple[int, ...]) -> None:
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != shape or not a.flags.c_contiguous:
        got = (getattr(a, "dtype", None), getattr(a, "shape", None))
        raise ValueError(f"{name} must be a C-contiguous float32 array of shape {shape}, got {got}")


def dequantize_rows_into(qtype, raw: np.ndarray, out: np.ndarray) -> None:
    """Decode the (rows, cols) matrix in ``raw`` into the float32 buffer ``out`` (rows, cols)."""
    if out.ndim != 2:
        raise ValueError(f"out must be 2-D (rows, cols), got shape {out.shape}")
    rows, cols = out.shape
    _check_f32("out", out, (rows, cols))
    qt, w = _weights(qtype, raw, rows, cols)
    _DEQUANT[qt](w, out)


# Integer matrix-vector kernels: K formats take Q8_K activations (w, xq, xd, xs16, out, knobs,
# q6), Q8_0 takes Q8_0 activations (w, xq16, xd, out).
_MATVEC_INT8 = {T.Q4_K: _mv_k_q8k, T.Q6_K: _mv_k_q8k, T.Q8_0: _mv_q8_0_q8, T.Q5_K: _mv_q5_k_q8k,
                **_LOWBIT_MATVEC_INT8}  # x86_lowbit.py's rows: (w, xq, xd, xs16, out), IQ4_NL (w, xq, xd, out)
_KNOBBED = {T.Q4_K, T.Q6_K, T.Q5_K} - set(_LOWBIT_MATVEC_INT8)  # int8_dot's rows take (..., out, KNOBS, q6)
_Q8_0_INT8 = {T.Q8_0, T.IQ4_NL}  # integer rows against Q8_0 activations
_MATVEC_INT8_SERIAL = {qt: serial_twin(k) for qt, k in _MATVEC_INT8.items()}
_MULTI_TOKEN = {T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, *_LOWBIT_MM}  # formats with a multi-token kernel (_mm_*)
_MV_K_X4_SERIAL = serial_twin(_mv_k_x4)
_PORTABLE_INT8 = {T.Q4_K, T.Q6_K, T.Q8_0}  # int8_dot.py's generic IR (Q5_K: arm_neon.py only)


# Where int8_dot.py's generic IR runs besides the levels paths.has_int8 names (the x86 levels;
# arm64 with dot products runs arm_neon.py's own kernels): tests add a machine here to run the
# portable IR elsewhere (under emulation).
INT8_MACHINES = {"x86_64", "AMD64"}


def has_int8_kernels(qtype) -> bool:
    """Whether `qtype` matrix-vector products run the integer kernels here (MatvecPlan.int8):
    the x86 levels and arm64 with dot products (paths.has_int8), or the generic IR on another
    machine its tests list in INT8_MACHINES."""
    qt = get_format(qtype).qtype
    if qt not in _MATVEC_INT8:
        return False
    if paths.has_int8(qt):
        return True
    m = platform.machine()
    return m in INT8_MACHINES and m not in paths.X86 and qt in _PORTABLE_INT8


def _q8_0_activations():
    """The Q8_0 kernels' activation dtype: int8 for arm64's `sdot`, int16 for x86 (int8_dot)."""
    return np.int8 if paths.target().level.is_arm else np.int16


def has_multi_token_kernel(qtype) -> bool:
    """Whether `MatvecPlan.tokens` (several tokens per weight block) runs for `qtype` here."""
    return get_format(qtype).qtype in _MULTI_TOKEN and has_int8_kernels(qtype)


# Where the K-format tiles beat dequantize + fp32 BLAS at every prompt length: AVX-512 on AMD
# (Zen 4/5 run 512-bit integer multiplies on two pipes). Measured, 0.8B Q4_K_M, 2 threads:
# Zen 5, 3584x1024 Q4_K at T = 512: tile 264-278 GMAC/s vs dequantize + BLAS 216-231, whole
# 512-token forward 1.24-1.27 s vs 1.66-1.79 s. Emerald Rapids (one 512-bit integer-multiply
# port), whole 512-token forwards, two copies of the model in one process alternating, best of
# 3-4, two runs: the x86_avx512 VNNI tile 69.2 and 95.4 tok/s vs dequantize + OpenBLAS 101.1 and
# 93.4 (a loss, then a tie); the AVX2 tile (x86_avx2) lost per matrix, 42-45 vs 59-70 GMAC/s.
#
# arm64 with dot products: the `sdot` tiles at every length. Not measured (no Graviton here):
# Arm's Neoverse N1 Software Optimization Guide (its ASIMD integer and floating-point instruction tables) gives SDOT (16 int8 MACs)
# and FMLA .4s (4 f32 MACs) the same throughput of 2 per cycle, so the tile does 4x the
# multiplies per instruction of fp32 SGEMM and skips the f32 dequantization of every matrix;
# llama.cpp runs the same `sdot` products for every prompt length there. `make bench-arm64`
# is the emulated cost model that compares them.
def _tiles_win_at_every_length() -> bool:
    t = paths.target()
    if t.level.is_arm:
        return True
    return t.level.is_avx512 and t.cpu_name.startswith("znver")


# Up to this many tokens, Q8_0 products (and Q4_K/Q6_K where the tiles do not win at every
# length) run in the multi-token int8 kernel (each weight block unpacked once per 4 tokens)
# instead of dequantize + BLAS, whose cost is mostly fixed
# (the whole matrix decoded to f32). Measured on whole forwards after a 504-token prefix (0.8B,
# 2 threads, both paths alternating in one process, min of 3, ms): Q4_K_M T=32 734 vs 1057,
# T=48 1042 vs 1193, T=64 1261 vs 1392, T=96 1759 vs 1656 (the 256-bit tile, before the 512-bit
# one took every length on AVX-512); Q8_0 T=32 946 vs 1175, T=64 1477 vs
# 1457, T=96 2014 vs 1698. (Per-matrix sweeps had put the crossover at ~32: a forward also pays
# the dequantization of every matrix, and a chat turn of 33-64 tokens took up to 1.8x longer.)
SHORT_PREFILL = 64


# The low-bit formats' 256-bit tiles (x86_lowbit.py) against dequantize + BLAS at 512 tokens,
# whole forwards of the 0.8B IQ4_XS file, 2 threads, Zen 5, separate processes alternating, best
# of 2 each, on the shared host: at load average 15-17 tiles 20.73 and 13.90 tok/s, dequantize +
# BLAS 13.63 and 12.81; at load average 3.4-5 tiles 85.48 and 70.27, dequantize + BLAS 46.67 and 47.0. Their dequantization is costlier than Q4_K's (lookups, lattices), which
# a prompt pays per matrix. On AVX-512 VNNI the panel tiles (lowbit_kernels.PANEL) take every
# length instead, Intel's and AMD's (has_int8_prefill); elsewhere on Intel the Q4_K rule (<= 64 tokens).
_LOWBIT_TILES = frozenset(_LOWBIT_MM)


def has_int8_prefill(qtype) -> bool:
    """Whether a batched prefill of any length multiplies `qtype` in the multi-token int8 kernel
    rather than dequantize + fp32 BLAS (`_tiles_win_at_every_length`; the panel tiles of
    lowbit_kernels.PANEL on every AVX-512 VNNI core)."""
    qt = get_format(qtype).qtype
    if qt in _LOWBIT_PANEL:
        return True
    formats = _MULTI_TOKEN if paths.target().level.is_arm else (T.Q4_K, T.Q6_K, *_LOWBIT_TILES)
    return qt in formats and has_multi_token_kernel(qtype) and _tiles_win_at_every_length()


def int8_prefill_wins(qtype, tokens: int) -> bool:
    """Whether a product of `tokens` tokens with `qtype` runs the int8 tile (weights.Linear)."""
    return has_int8_prefill(qtype) or (1 < tokens <= SHORT_PREFILL and has_multi_token_kernel(qtype))


class MatvecPlan:
    """`plan(x, out)` = ``out[:] = W @ round_activations(x)`` (what llama.cpp computes) with
    everything about W (validation, view, prepared scales, kernel) settled once: decode calls it
    ~240 times per token, and re-validating each call cost ~20 µs of Python per matrix."""

    def __init__(self, qtype, raw: np.ndarray, rows: int, cols: int) -> None:
        qt, self.w = _weights(qtype, raw, rows, cols)
        self.qtype, self.rows, self.cols = qt, rows, cols
        small = rows * cols < SERIAL_BELOW  # the 16-row DeltaNet beta/alpha: a launch costs more
        self.int8 = has_int8_kernels(qt)
        self.x4 = self.int8 and paths.x4_layout(qt)
        if self.int8:
            self.kernel = (_MATVEC_INT8_SERIAL if small else _MATVEC_INT8)[qt]
            if qt in _Q8_0_INT8:
                # IQ4_NL's rows (x86_lowbit.py) take the int8 values; Q8_0's x86 row int16
                self.xq = np.empty(cols, _q8_0_activations() if qt == T.Q8_0 else np.int8)
                self.xd = np.empty(cols // 32, np.float32)
            else:
                self.xq = np.empty(cols, np.int8)
                self.xd = np.empty(cols // 256, np.float32)
                self.xs16 = np.empty(cols // 16, np.int16)
            self.prepared = None
            self.args: tuple = (KNOBS, qt == T.Q6_K) if qt in _KNOBBED else ()
            if self.x4:
                # arm64: the x4 layout replaces the row-major bytes (this plan holds only w4;
                # the file's pages of the matrix are given back, arm_neon.release_pages)
                raw_rows = self.w
                self.w = arm_neon.repack_x4(qt, raw_rows)
                arm_neon.release_pages(raw_rows)
                del raw_rows
                self.kernel = _MV_K_X4_SERIAL if small else _mv_k_x4
                self.args = (rows, qt == T.Q6_K)
        else:
            self.kernel = (_MATVEC_SERIAL if small else _MATVEC)[qt]
            self.prepared = prepare(qt, self.w, rows, cols) if qt in _PREPARED else None
            self.args = _MV_ARGS.get(qt, ())

    def tokens(self, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` for T tokens (x (T, cols) f32) with the multi-token int8 kernel: each weight
        block is unpacked once per TILE (K formats: WIDE_TILE) tokens. Only where
        `has_multi_token_kernel`."""
        if not has_multi_token_kernel(self.qtype):
            raise ValueError(f"{self.qtype.name}: no multi-token integer kernel on {platform.machine()}")
        if self.qtype not in _Q8_0_INT8:
            return self.tokens_q8k(quantize_q8_k_tokens(x, WIDE_TILE))
        t = x.shape[0]
        tp = -(-t // TILE) * TILE
        cols = self.cols
        flat = np.ascontiguousarray(x).reshape(-1)
        out = np.empty((tp, self.rows), np.float32)
        # padding tokens stay zero (their results are dropped); blocks never straddle tokens
        # (cols is a multiple of the block), so all tokens quantize in one call
        xq16 = np.zeros(tp * cols, _q8_0_activations() if self.qtype == T.Q8_0 else np.int8)
        xd = np.zeros(tp * cols // 32, np.float32)
        quantize_q8_0(flat, xq16[:t * cols], xd[:t * cols // 32])
        if self.qtype == T.IQ4_NL:
            _LOWBIT_MM[T.IQ4_NL](self.w, xq16, xd, out)
        else:
            (_mm_q8_0_smmla if paths.tile_level(T.Q8_0) == paths.Level.NEON_I8MM else _mm_q8_0_q8)(self.w, xq16, xd, out)
        return out[:t]

    def tokens_q8k(self, a: Q8KTokens) -> np.ndarray:
        """`tokens` for a K format from activations already quantized (quantize_q8_k_tokens with
        WIDE_TILE): the projections that read one input share its quantization."""
        if a.padded % WIDE_TILE or a.q.size != a.padded * self.cols:
            raise ValueError(f"activations of {a.q.size // max(a.padded, 1)} values per token padded to "
                             f"{a.padded} tokens; this matrix takes {self.cols} per token, padded to a "
                             f"multiple of {WIDE_TILE}")
        out = np.empty((a.padded, self.rows), np.float32)
        if self.x4:
            return self._tokens_x4(a, out)
        if self.qtype in _LOWBIT_PANEL:  # x86_lowbit.py's panel tiles (AVX-512 VNNI)
            qp, xsf = a.p16()
            _LOWBIT_PANEL[self.qtype](self.w, qp, a.d, xsf, out)
            return out[:a.tokens]
        if self.qtype in _LOWBIT_MM:  # x86_lowbit.py's tiles: offsets and mins inside
            _LOWBIT_MM[self.qtype](self.w, a.q, a.d, a.sums16, out)
            return out[:a.tokens]
        q6 = self.qtype == T.Q6_K
        if not q6:
            # sum over blocks b and runs j of (dmin_b m_bj) (d_b^x sums_bj^x): 1/32 of the
            # product's multiply-adds, done by BLAS into `out`, which the kernel subtracts from
            mins = np.empty((self.rows, self.cols // 32), np.float32)
            _q4_k_mins(self.w, self.cols // 256, mins, 176 if self.qtype == T.Q5_K else 144)
            np.matmul(a.scaled_sums32, mins.T, out=out)
        if paths.tile_level(self.qtype) == paths.Level.NEON_I8MM:
            kind = {T.Q4_K: 0, T.Q6_K: 1, T.Q5_K: 2}[self.qtype]
            _mm_k_smmla(self.w, a.q, a.d, a.sums16, out, KNOBS, kind)
        elif self.qtype == T.Q5_K:
            _mm_q5_k_q8k(self.w, a.q, a.d, a.sums16, out, KNOBS)
        else:
            _mm_k_q8k(self.w, a.q, a.d, a.sums16, out, KNOBS, q6)
        return out[:a.tokens]

    def _tokens_x4(self, a: Q8KTokens, out: np.ndarray) -> np.ndarray:
        q6 = self.qtype == T.Q6_K
        if not q6:  # the mins' product, as in tokens_q8k
            mins = np.empty((self.rows, self.cols // 32), np.float32)
            _q4_k_mins_x4(self.w, self.cols // 256, mins)
            np.matmul(a.scaled_sums32, mins.T, out=out)
        tile = _mm_k_x4_smmla if paths.tile_level(self.qtype) == paths.Level.NEON_I8MM else _mm_k_x4
        tile(self.w, a.q, a.d, out.reshape(-1), self.rows, q6)
        return out[:a.tokens]

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        if self.int8 and self.qtype in _Q8_0_INT8:
            quantize_q8_0(x, self.xq, self.xd)
            self.kernel(self.w, self.xq, self.xd, out)
            return
        if self.int8:
            quantize_q8_k(x, self.xq, self.xd, self.xs16)
            self.kernel(self.w, self.xq, self.xd, self.xs16, out, *self.args)
            return
        x = round_activations(x, self.qtype)
        if self.prepared is None:
            self.kernel(self.w, x, out, *self.args)
        else:
            self.kernel(self.w, self.prepared, x, out, *self.args)


def matvec(qtype, raw: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = W @ round_activations(x, qtype)`` for the quantized (rows, cols) matrix W in
    ``raw``: the product llama.cpp's CPU backend computes. Decode builds a `MatvecPlan` once per
    matrix instead."""
    if x.ndim != 1 or out.ndim != 1:
        raise ValueError("matvec takes x of shape (cols,) and out of shape (rows,)")
    rows, cols = out.shape[0], x.shape[0]
    _check_f32("x", x, (cols,))
    _check_f32("out", out, (rows,))
    MatvecPlan(qtype, raw, rows, cols)(x, out)


# ----------------------------------------------------------------------------- benchmark

def _bench_weights(qtype, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Realistic raw bytes fast: quantize a few random rows and tile them."""
    rng = np.random.default_rng(seed)
    base_rows = min(rows, 64)
    base = quantize(rng.standard_normal((base_rows, cols), dtype=np.float32), qtype)
    reps = -(-rows // base_rows)
    return np.ascontiguousarray(np.tile(base, (reps, 1))[:rows])


def bench_matvec(qtype, rows: int, cols: int, reps: int = 20) -> float:
    """Weight bytes streamed per second by :func:`matvec`, in GB/s (best of ``reps`` calls)."""
    raw = _bench_weights(qtype, rows, cols)
    x = np.random.default_rng(1).standard_normal(cols, dtype=np.float32)
    out = np.empty(rows, dtype=np.float32)
    plan = MatvecPlan(qtype, raw, rows, cols)
    plan(x, out)  # compile / warm
    best = float("inf")
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        plan(x, out)
        best = min(best, time.perf_counter() - t0)
    return raw.nbytes / best / 1e9
