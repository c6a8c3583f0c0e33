"""The float kernels of the 32-value and K formats and of F32/F16/BF16: per format an exact
decoder into float32 (prefill: then BLAS does ``X @ W.T``) and a float matrix-vector product
(decode where no integer kernel runs here), one `FLOAT` row per format (traits.py reads them).

The decoders are compiled *without* fastmath (there is no reduction to reassociate, and
forbidding FMA contraction keeps the output bit-identical to :func:`engine.quant.formats.dequantize`
and therefore to ``gguf.quants``). The products are ``fastmath=True`` so LLVM vectorises the
per-block loop; every 256-value K block is one loop with all its sub-block scales inside, i.e.
one horizontal reduction per block. Constant offsets and Q4_K/Q5_K mins are folded out with
per-sub-block sums of ``x`` that are computed once per call (``sum_l q*x - 32*sum_l x`` instead
of ``sum_l (q-32)*x``). Portable LLVM: the same code on arm64 Graviton and x86_64.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from engine.llvm_ops import bits_to_f32

from .kernel_rows import FloatKernels
from .njit_base import DQ as _DQ
from .njit_base import MV as _MV
from .njit_base import f16_at as _f16_at
from .njit_base import group_sums as _group_sums
from .njit_base import half as _half
from .njit_base import qf as _qf
from .njit_base import scale_min_k4
from .njit_base import u32_at as _u32_at

__all__ = ["FLOAT", "prepare_scales"]

_F32 = np.float32


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
                sa, ma = scale_min_k4(row, p + 4, 2 * c)
                sb, mb = scale_min_k4(row, p + 4, 2 * c + 1)
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
    s0, m0 = scale_min_k4(row, p + 4, 0)
    s1, m1 = scale_min_k4(row, p + 4, 1)
    s2, m2 = scale_min_k4(row, p + 4, 2)
    s3, m3 = scale_min_k4(row, p + 4, 3)
    s4, m4 = scale_min_k4(row, p + 4, 4)
    s5, m5 = scale_min_k4(row, p + 4, 5)
    s6, m6 = scale_min_k4(row, p + 4, 6)
    s7, m7 = scale_min_k4(row, p + 4, 7)
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
                sa, ma = scale_min_k4(row, p + 4, 2 * c)
                sb, mb = scale_min_k4(row, p + 4, 2 * c + 1)
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


def prepare_scales(qt: T, w: np.ndarray, rows: int, cols: int) -> np.ndarray | None:
    """Load-time preparation for the float product of `qt` (its per-block scales decoded to
    float32 beside the mmap'd bytes), or None when its kernel reads everything from the raw
    bytes. `w` is the validated (rows, row_bytes) view kernels.MatvecPlan holds."""
    if qt == T.Q8_0:
        d = np.empty((rows, cols // 32), np.float32)
        _prep_q8_0(w, cols // 32, 32, d)
        return d
    if qt == T.Q6_K:
        sc = np.empty((rows, cols // 256 * 16), np.float32)
        _prep_q6_k(w, cols // 256, sc)
        return sc
    return None


# Inner-loop trip counts (args) are passed at run time, not as constants: with a constant count
# LLVM fully unrolls the per-block loop and then vectorises the *block* loop (stride 34/144/210
# bytes: byte gathers with vpinsrb), 4-8x slower than vectorising the contiguous inner loop. Q4_K
# and Q5_K keep the constant 32 (measured better: LLVM keeps a vector accumulator).
FLOAT = {
    T.F32: FloatKernels(_dq_f32, _mv_f32),
    T.F16: FloatKernels(_dq_f16, _mv_f16),
    T.BF16: FloatKernels(_dq_bf16, _mv_bf16),
    T.Q8_0: FloatKernels(_dq_q8_0, _mv_q8_0p, (32,), prepared=True),
    T.Q4_0: FloatKernels(_dq_q4_0, _mv_q4_0, (16,)),
    T.Q4_1: FloatKernels(_dq_q4_1, _mv_q4_1, (16,)),
    T.Q5_0: FloatKernels(_dq_q5_0, _mv_q5_0, (16,)),
    T.Q5_1: FloatKernels(_dq_q5_1, _mv_q5_1, (16,)),
    T.Q4_K: FloatKernels(_dq_q4_k, _mv_q4_k),
    T.Q5_K: FloatKernels(_dq_q5_k, _mv_q5_k),
    T.Q6_K: FloatKernels(_dq_q6_k, _mv_q6_kp, (16,), prepared=True),
}
