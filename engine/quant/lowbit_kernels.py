"""numba kernels for the formats of engine/quant/lowbit.py: exact decode rows, float decode rows,
and (x86, AVX2 and up) integer decode rows.

* ``_dq_*`` decode a matrix into f32 (prefill: dequantize + BLAS), ``fastmath=False`` so the
  bytes come out bit-identical to :mod:`engine.quant.lowbit` (and therefore ``gguf.quants``).
* ``_mv_*`` are the matrix-vector (decode) rows: portable float kernels (``fastmath=True``)
  against activations rounded as llama.cpp rounds them (Q8_K for Q2_K / Q3_K / IQ4_XS / IQ3_S
  / IQ3_XXS, Q8_0 for IQ4_NL: ``activations.round_activations``), the same scheme as Q5_K's
  rows. Sub-block offsets (Q2_K's mins) come out of the inner loop with per-16 sums of x.

* ``_mv_*_q8`` (``MATVEC_INT8``) and ``_mm_*_q8`` (``MULTI_TOKEN_INT8``, several tokens): on x86
  (every level from AVX2 up) Q2_K, Q3_K, IQ4_XS, IQ3_S, IQ4_NL and Q5_K multiply in integer arithmetic against the activations quantized as llama.cpp
  quantizes them (engine/quant/x86/lowbit.py); arm64 takes arm/lowbit.py's instead, IQ3_XXS
  keeps the float rows above. engine/quant/traits.py names the kernels per format and level.
* ``_mm_*_panel`` (``PANEL``, AVX-512 VNNI, IQ4_XS, Q3_K, Q5_K and Intel's Q4_K, Q6_K): the
  panel tiles, for prompts of every length there (`_panel_rows`).

The other x86 tiles run prefills up to kernels.SHORT_PREFILL tokens (a chat turn's suffix) but
on Zen with AVX-512; longer ones dequantize + BLAS (traits.py). See docs/formats.md.

The IQ grids and levels are module-level arrays (numba freezes them into the compiled code)
built from the gguf package by engine/quant/lowbit.py.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from .kernel_rows import FloatKernels
from .njit_base import DQ as _DQ
from .njit_base import MV as _MV
from .njit_base import f16_at as _f16_at
from .njit_base import group_sums as _group_sums
from .njit_base import qf as _qf
from .njit_base import u32_at as _u32_at
from .lowbit import IQ4_LEVELS, iq_grid, ksigns
from .x86.lowbit import (PANEL_BYTES, PANEL_ROWS, PANEL_SCALES, PANEL_TOKENS, TILE, iq3_s_row_dot, iq3_s_row_dot_tile,
                         iq4_nl_row_dot, iq4_nl_row_dot_tile, iq4_xs_row_dot, iq4_xs_row_dot_tile, iq4_xs_unpack_panel,
                         panel_tile, q2_k_row_dot, q2_k_row_dot_tile, q3_k_row_dot, q3_k_row_dot_tile,
                         q3_k_unpack_panel, q4_0_row_dot, q4_0_row_dot_tile, q4_1_row_dot, q4_1_row_dot_tile,
                         q4_k_unpack_panel, q5_0_row_dot, q5_0_row_dot_tile, q5_1_row_dot, q5_1_row_dot_tile,
                         q5_k_row_dot, q5_k_row_dot_tile, q5_k_unpack_panel, q6_k_unpack_panel)

_F32 = np.float32
_LV = IQ4_LEVELS.astype(np.float32)
_G3S = np.ascontiguousarray(iq_grid(T.IQ3_S)).copy()
_G3XXS = np.ascontiguousarray(iq_grid(T.IQ3_XXS)).copy()
_KS = ksigns().copy()
# the IQ3_S lattice rows as one little-endian uint32 each (the integer rows load a row at a time)
G3S_U32 = np.ascontiguousarray(_G3S).view("<u4").reshape(-1).copy()


# ----------------------------------------------------------------------------- Q2_K (84 bytes)

@njit(**_DQ)
def _dq_q2_k(w, out):
    nb = out.shape[1] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 84
            d = _f16_at(row, p + 80)
            dmin = _f16_at(row, p + 82)
            for h in range(2):
                for s in range(4):
                    for half in range(2):
                        sc = row[p + 8 * h + 2 * s + half]
                        dl = d * _qf(sc & 15)
                        ml = dmin * _qf(sc >> 4)
                        q0 = p + 16 + 32 * h + 16 * half
                        o = b * 256 + 128 * h + 32 * s + 16 * half
                        for l in range(16):
                            out[r, o + l] = dl * _qf((row[q0 + l] >> (2 * s)) & 3) - ml


@njit(**_MV)
def _mv_q2_k(w, x, out):
    nb = x.shape[0] // 256
    xs = _group_sums(x, 16)
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 84
            d = _f16_at(row, p + 80)
            dmin = _f16_at(row, p + 82)
            mins = _F32(0.0)
            for j in range(16):
                mins += _qf(row[p + j] >> 4) * xs[b * 16 + j]
            s = _F32(0.0)
            for h in range(2):
                for sh in range(4):
                    for half in range(2):
                        q0 = p + 16 + 32 * h + 16 * half
                        o = b * 256 + 128 * h + 32 * sh + 16 * half
                        t = _F32(0.0)
                        for l in range(16):
                            t += _qf((row[q0 + l] >> (2 * sh)) & 3) * x[o + l]
                        s += _qf(row[p + 8 * h + 2 * sh + half] & 15) * t
            acc += d * s - dmin * mins
        out[r] = acc


# ----------------------------------------------------------------------------- Q3_K (110 bytes)

@njit(inline="always", cache=True)
def _q3_k_scale(row, p, j):
    """Scale j (0..15) of the Q3_K block at p, as a signed integer in [-32, 31]."""
    lo = (np.int32(row[p + 96 + (j & 7)]) >> (4 * (j >> 3))) & 15
    hi = (np.int32(row[p + 104 + (j & 3)]) >> (2 * (j >> 2))) & 3
    return (lo | (hi << 4)) - 32


@njit(**_DQ)
def _dq_q3_k(w, out):
    nb = out.shape[1] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 110
            d = _f16_at(row, p + 108)
            for h in range(2):
                for s in range(4):
                    for half in range(2):
                        dl = d * _F32(_q3_k_scale(row, p, 8 * h + 2 * s + half))
                        o = b * 256 + 128 * h + 32 * s + 16 * half
                        for l in range(16 * half, 16 * half + 16):
                            ql = (np.int32(row[p + 32 + 32 * h + l]) >> (2 * s)) & 3
                            hb = (np.int32(row[p + l]) >> (4 * h + s)) & 1
                            out[r, o + l - 16 * half] = dl * _F32(ql - 4 + 4 * hb)


@njit(**_MV)
def _mv_q3_k(w, x, out):
    nb = x.shape[0] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 110
            d = _f16_at(row, p + 108)
            s = _F32(0.0)
            for h in range(2):
                for sh in range(4):
                    for half in range(2):
                        o = b * 256 + 128 * h + 32 * sh + 16 * half
                        t = _F32(0.0)
                        for l in range(16 * half, 16 * half + 16):
                            ql = (np.int32(row[p + 32 + 32 * h + l]) >> (2 * sh)) & 3
                            hb = (np.int32(row[p + l]) >> (4 * h + sh)) & 1
                            t += _F32(ql - 4 + 4 * hb) * x[o + l - 16 * half]
                        s += _F32(_q3_k_scale(row, p, 8 * h + 2 * sh + half)) * t
            acc += d * s
        out[r] = acc


# ----------------------------------------------------------------------------- IQ4_NL (18 bytes / 32)

@njit(**_DQ)
def _dq_iq4_nl(w, out):
    nb = out.shape[1] // 32
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 18
            d = _f16_at(row, p)
            for l in range(16):
                q = row[p + 2 + l]
                out[r, b * 32 + l] = d * _LV[q & 15]
                out[r, b * 32 + 16 + l] = d * _LV[q >> 4]


@njit(**_MV)
def _mv_iq4_nl(w, x, out):
    nb = x.shape[0] // 32
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 18
            s = _F32(0.0)
            for l in range(16):
                q = row[p + 2 + l]
                s += _LV[q & 15] * x[b * 32 + l] + _LV[q >> 4] * x[b * 32 + 16 + l]
            acc += _f16_at(row, p) * s
        out[r] = acc


# ----------------------------------------------------------------------------- IQ4_XS (136 bytes)

@njit(inline="always", cache=True)
def _iq4_xs_scale(row, p, j):
    sh = np.int32(row[p + 2]) | (np.int32(row[p + 3]) << 8)
    lo = (np.int32(row[p + 4 + (j >> 1)]) >> (4 * (j & 1))) & 15
    return (lo | (((sh >> (2 * j)) & 3) << 4)) - 32


@njit(**_DQ)
def _dq_iq4_xs(w, out):
    nb = out.shape[1] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 136
            d = _f16_at(row, p)
            for j in range(8):
                dl = d * _F32(_iq4_xs_scale(row, p, j))
                o = b * 256 + 32 * j
                for l in range(16):
                    q = row[p + 8 + 16 * j + l]
                    out[r, o + l] = dl * _LV[q & 15]
                    out[r, o + 16 + l] = dl * _LV[q >> 4]


@njit(**_MV)
def _mv_iq4_xs(w, x, out):
    nb = x.shape[0] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 136
            s = _F32(0.0)
            for j in range(8):
                o = b * 256 + 32 * j
                t = _F32(0.0)
                for l in range(16):
                    q = row[p + 8 + 16 * j + l]
                    t += _LV[q & 15] * x[o + l] + _LV[q >> 4] * x[o + 16 + l]
                s += _F32(_iq4_xs_scale(row, p, j)) * t
            acc += _f16_at(row, p) * s
        out[r] = acc


# ----------------------------------------------------------------------------- IQ3_S (110 bytes)

@njit(**_DQ)
def _dq_iq3_s(w, out):
    nb = out.shape[1] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 110
            d = _f16_at(row, p)
            for k in range(8):
                db = d * _qf(1 + 2 * ((row[p + 106 + (k >> 1)] >> (4 * (k & 1))) & 15))
                qh = np.int32(row[p + 66 + k])
                for gg in range(8):
                    g = 8 * k + gg
                    idx = np.int32(row[p + 2 + g]) | (((qh >> gg) & 1) << 8)
                    sg = np.int32(row[p + 74 + (g >> 1)]) >> (4 * (g & 1))
                    for i in range(4):
                        v = db * _qf(_G3S[idx, i])
                        out[r, b * 256 + 4 * g + i] = -v if (sg >> i) & 1 else v


@njit(**_MV)
def _mv_iq3_s(w, x, out):
    nb = x.shape[0] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 110
            s = _F32(0.0)
            for k in range(8):
                qh = np.int32(row[p + 66 + k])
                t = _F32(0.0)
                for gg in range(8):
                    g = 8 * k + gg
                    idx = np.int32(row[p + 2 + g]) | (((qh >> gg) & 1) << 8)
                    sg = np.int32(row[p + 74 + (g >> 1)]) >> (4 * (g & 1))
                    o = b * 256 + 4 * g
                    for i in range(4):
                        v = _qf(_G3S[idx, i]) * x[o + i]
                        t += -v if (sg >> i) & 1 else v
                s += _qf(1 + 2 * ((row[p + 106 + (k >> 1)] >> (4 * (k & 1))) & 15)) * t
            acc += _f16_at(row, p) * s
        out[r] = acc


# ----------------------------------------------------------------------------- IQ3_XXS (98 bytes)

@njit(**_DQ)
def _dq_iq3_xxs(w, out):
    nb = out.shape[1] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        for b in range(nb):
            p = b * 98
            d = _f16_at(row, p)
            for k in range(8):
                aux = _u32_at(row, p + 66 + 4 * k)
                db = d * (_F32(0.5) + _qf(aux >> 28)) * _F32(0.5)
                for l in range(4):
                    sg = np.int32(_KS[(aux >> (7 * l)) & 127])
                    for gg in range(2):
                        idx = row[p + 2 + 8 * k + 2 * l + gg]
                        o = b * 256 + 32 * k + 8 * l + 4 * gg
                        for i in range(4):
                            v = db * _qf(_G3XXS[idx, i])
                            out[r, o + i] = -v if (sg >> (4 * gg + i)) & 1 else v


@njit(**_MV)
def _mv_iq3_xxs(w, x, out):
    nb = x.shape[0] // 256
    for r in prange(w.shape[0]):
        row = w[r]
        acc = _F32(0.0)
        for b in range(nb):
            p = b * 98
            s = _F32(0.0)
            for k in range(8):
                aux = _u32_at(row, p + 66 + 4 * k)
                t = _F32(0.0)
                for l in range(4):
                    sg = np.int32(_KS[(aux >> (7 * l)) & 127])
                    for gg in range(2):
                        idx = row[p + 2 + 8 * k + 2 * l + gg]
                        o = b * 256 + 32 * k + 8 * l + 4 * gg
                        for i in range(4):
                            v = _qf(_G3XXS[idx, i]) * x[o + i]
                            t += -v if (sg >> (4 * gg + i)) & 1 else v
                s += (_F32(0.5) + _qf(aux >> 28)) * t
            acc += _f16_at(row, p) * _F32(0.5) * s
        out[r] = acc


FLOAT = {
    T.Q2_K: FloatKernels(_dq_q2_k, _mv_q2_k),
    T.Q3_K: FloatKernels(_dq_q3_k, _mv_q3_k),
    T.IQ4_NL: FloatKernels(_dq_iq4_nl, _mv_iq4_nl),
    T.IQ4_XS: FloatKernels(_dq_iq4_xs, _mv_iq4_xs),
    T.IQ3_S: FloatKernels(_dq_iq3_s, _mv_iq3_s),
    T.IQ3_XXS: FloatKernels(_dq_iq3_xxs, _mv_iq3_xxs),
}


# ----------------------------------------------------------------------------- integer rows (x86)
# (w, xq, xd, xs16, out) like int8_kernels.mv_k_q8k without its knobs; IQ4_NL takes Q8_0 activations
# (w, xq int8, xd f32 per 32, out). The format is one kernel each: a plan compiles only its own.

@njit(**_MV)
def _mv_q2_k_q8(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q2_k_row_dot(w[r], nb, xq, xd, xs16)


@njit(**_MV)
def _mv_q3_k_q8(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q3_k_row_dot(w[r], nb, xq, xd, xs16)


@njit(**_MV)
def _mv_q5_k_q8(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q5_k_row_dot(w[r], nb, xq, xd, xs16)


@njit(**_MV)
def _mv_iq4_xs_q8(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = iq4_xs_row_dot(w[r], nb, xq, xd)


@njit(**_MV)
def _mv_iq3_s_q8(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = iq3_s_row_dot(w[r], nb, xq, xd, G3S_U32)


@njit(**_MV)
def _mv_iq4_nl_q8(w, xq, xd, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = iq4_nl_row_dot(w[r], nb, xq, xd)


@njit(**_MV)
def _mv_q4_0_q8(w, xq, xd, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q4_0_row_dot(w[r], nb, xq, xd)


@njit(**_MV)
def _mv_q5_0_q8(w, xq, xd, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q5_0_row_dot(w[r], nb, xq, xd)


@njit(**_MV)
def _mv_q4_1_q8(w, xq, xd, xs, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q4_1_row_dot(w[r], nb, xq, xd, xs)


@njit(**_MV)
def _mv_q5_1_q8(w, xq, xd, xs, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q5_1_row_dot(w[r], nb, xq, xd, xs)


MATVEC_INT8 = {T.Q2_K: _mv_q2_k_q8, T.Q3_K: _mv_q3_k_q8, T.IQ4_XS: _mv_iq4_xs_q8, T.IQ3_S: _mv_iq3_s_q8,
               T.IQ4_NL: _mv_iq4_nl_q8, T.Q5_K: _mv_q5_k_q8,  # Q5_K: arm64 has arm/neon.py's instead
               T.Q4_0: _mv_q4_0_q8, T.Q5_0: _mv_q5_0_q8, T.Q4_1: _mv_q4_1_q8, T.Q5_1: _mv_q5_1_q8}
# the formats whose rows and tiles take Q8_0 activations (int8, f32 scale per 32: their vec_dot_type)
# and Q8_1 ones (the same, with each block's s: llama.cpp's vec_dot_type for Q4_1 and Q5_1)
Q8_0_ACTIVATIONS = frozenset({T.IQ4_NL, T.Q4_0, T.Q5_0})
Q8_1_ACTIVATIONS = frozenset({T.Q4_1, T.Q5_1})


# Several tokens (x86.lowbit's tiles, TILE tokens per weight block): xq (Tp*cols) int8, xd
# (Tp*nb) f32, xs16 (Tp*cols/16) int16, Tp a multiple of TILE (padding tokens are zeros), out
# (Tp, rows); rows in chunks of 16 so the tile's activations stay in L1 (int8_kernels.mm_k_q8k).
_ROW_CHUNK = 16


@njit(inline="always", cache=True)
def _tile_rows(w, xq, xd, xs16, out, kind):
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(TILE, np.float32)
        for t0 in range(0, tp, TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                args = (w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, xs16, t0 * cols // 16, cols // 16, res, G3S_U32)
                if kind == 0:
                    q2_k_row_dot_tile(*args)
                elif kind == 1:
                    q3_k_row_dot_tile(*args)
                elif kind == 2:
                    iq4_xs_row_dot_tile(*args)
                elif kind == 3:
                    iq3_s_row_dot_tile(*args)
                else:
                    q5_k_row_dot_tile(*args)
                for t in range(TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_q2_k_q8(w, xq, xd, xs16, out):
    _tile_rows(w, xq, xd, xs16, out, 0)


@njit(**_MV)
def _mm_q3_k_q8(w, xq, xd, xs16, out):
    _tile_rows(w, xq, xd, xs16, out, 1)


@njit(**_MV)
def _mm_iq4_xs_q8(w, xq, xd, xs16, out):
    _tile_rows(w, xq, xd, xs16, out, 2)


# Panels: _PANEL rows' blocks k0..k0 + _PANEL_K unpacked once (x86.lowbit.*_unpack_panel:
# 64 x 16 x 384 bytes = 384 KB, in L2), then every 4-token tile (20 KB of activations and sums,
# in L1) passes every row pair of the panel. Single-thread sweeps on Emerald Rapids (4096 x 4096 x
# 512, separate processes, best of 3) put 16-128 rows and 8-32 blocks within the host's noise.
_PANEL = 64
_PANEL_K = 16


@njit(inline="always", cache=True)
def _panel_rows(w, xqp, xd, xsf, out, kind, bpb):
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    wrow, srow = _PANEL_K * PANEL_BYTES, _PANEL_K * PANEL_SCALES
    for c in prange((rows + _PANEL - 1) // _PANEL):
        r0 = c * _PANEL
        nr = min(rows, r0 + _PANEL) - r0
        # 64-byte aligned, as the activations (Q8KTokens.p16): a zmm load across two cache lines
        # costs two (4096 x 4096 x 512, 2 threads: 57 ms unaligned, 42-48 aligned, one run)
        wq0 = np.empty(_PANEL * wrow + 64, np.uint8)
        ws0 = np.empty(_PANEL * srow + 16, np.float32)
        wq = wq0[(-wq0.ctypes.data) % 64:]
        ws = ws0[((-ws0.ctypes.data) % 64) // 4:]
        res = np.empty(PANEL_ROWS * PANEL_TOKENS, np.float32)
        for k0 in range(0, nb, _PANEL_K):
            kn = min(nb - k0, _PANEL_K)
            for r in range(nr):
                src = w[r0 + r, k0 * bpb:(k0 + kn) * bpb]
                if kind == 0:
                    iq4_xs_unpack_panel(src, kn, wq[r * wrow:], ws[r * srow:])
                elif kind == 1:
                    q5_k_unpack_panel(src, kn, wq[r * wrow:], ws[r * srow:])
                elif kind == 2:
                    q3_k_unpack_panel(src, kn, wq[r * wrow:], ws[r * srow:])
                elif kind == 3:
                    q4_k_unpack_panel(src, kn, wq[r * wrow:], ws[r * srow:])
                else:
                    q6_k_unpack_panel(src, kn, wq[r * wrow:], ws[r * srow:])
            for t0 in range(0, tp, PANEL_TOKENS):
                for r in range(0, nr, PANEL_ROWS):
                    # rows past nr (the last panel's) multiply what the buffer holds; not stored
                    panel_tile(wq, r * wrow, wrow, ws, r * srow, srow, kn,
                               xqp, t0 * cols + k0 * 256, cols, xd, t0 * nb + k0, nb,
                               xsf, (t0 * nb + k0) * 16, nb * 16, res)
                    for t in range(PANEL_TOKENS):
                        for j in range(min(PANEL_ROWS, nr - r)):
                            if k0 == 0:
                                out[t0 + t, r0 + r + j] = res[PANEL_ROWS * t + j]
                            else:
                                out[t0 + t, r0 + r + j] += res[PANEL_ROWS * t + j]


@njit(**_MV)
def _mm_iq4_xs_panel(w, xqp, xd, xsf, out):
    _panel_rows(w, xqp, xd, xsf, out, 0, 136)


@njit(**_MV)
def _mm_q5_k_panel(w, xqp, xd, xsf, out):
    _panel_rows(w, xqp, xd, xsf, out, 1, 176)


@njit(**_MV)
def _mm_q3_k_panel(w, xqp, xd, xsf, out):
    _panel_rows(w, xqp, xd, xsf, out, 2, 110)


@njit(**_MV)
def _mm_q4_k_panel(w, xqp, xd, xsf, out):
    _panel_rows(w, xqp, xd, xsf, out, 3, 144)


@njit(**_MV)
def _mm_q6_k_panel(w, xqp, xd, xsf, out):
    _panel_rows(w, xqp, xd, xsf, out, 4, 210)


@njit(**_MV)
def _mm_iq3_s_q8(w, xq, xd, xs16, out):
    _tile_rows(w, xq, xd, xs16, out, 3)


@njit(**_MV)
def _mm_q5_k_q8(w, xq, xd, xs16, out):
    _tile_rows(w, xq, xd, xs16, out, 4)


@njit(inline="always", cache=True)
def _q8_0_tile_rows(w, xq, xd, out, kind):
    """The 32-value formats' tiles against Q8_0 activations: xq (Tp*cols) int8, xd (Tp*cols/32)."""
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 32
    rows = w.shape[0]
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(TILE, np.float32)
        for t0 in range(0, tp, TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                if kind == 0:
                    iq4_nl_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, res)
                elif kind == 1:
                    q4_0_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, res)
                else:
                    q5_0_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, res)
                for t in range(TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_iq4_nl_q8(w, xq, xd, out):
    _q8_0_tile_rows(w, xq, xd, out, 0)


@njit(**_MV)
def _mm_q4_0_q8(w, xq, xd, out):
    _q8_0_tile_rows(w, xq, xd, out, 1)


@njit(**_MV)
def _mm_q5_0_q8(w, xq, xd, out):
    _q8_0_tile_rows(w, xq, xd, out, 2)


@njit(inline="always", cache=True)
def _q8_1_tile_rows(w, xq, xd, xs, out, kind):
    """Q4_1's and Q5_1's tiles against Q8_1 activations: xq (Tp*cols) int8, xd and xs (Tp*cols/32)."""
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 32
    rows = w.shape[0]
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(TILE, np.float32)
        for t0 in range(0, tp, TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                if kind == 0:
                    q4_1_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, xs, t0 * nb, nb, res)
                else:
                    q5_1_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, xs, t0 * nb, nb, res)
                for t in range(TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_q4_1_q8(w, xq, xd, xs, out):
    _q8_1_tile_rows(w, xq, xd, xs, out, 0)


@njit(**_MV)
def _mm_q5_1_q8(w, xq, xd, xs, out):
    _q8_1_tile_rows(w, xq, xd, xs, out, 1)


MULTI_TOKEN_INT8 = {T.Q2_K: _mm_q2_k_q8, T.Q3_K: _mm_q3_k_q8, T.IQ4_XS: _mm_iq4_xs_q8, T.IQ3_S: _mm_iq3_s_q8,
                    T.IQ4_NL: _mm_iq4_nl_q8, T.Q5_K: _mm_q5_k_q8, T.Q4_0: _mm_q4_0_q8, T.Q5_0: _mm_q5_0_q8,
                    T.Q4_1: _mm_q4_1_q8, T.Q5_1: _mm_q5_1_q8}
# The panel tiles (AVX-512 VNNI), which take the activations in the P16 order (Q8KTokens.p16):
# traits.py gives IQ4_XS's, Q3_K's and Q5_K's to every AVX-512 VNNI core, Q4_K's and Q6_K's
# where x86/avx512.py's tiles do not win at every prompt length (Intel).
PANEL = {T.IQ4_XS: _mm_iq4_xs_panel, T.Q3_K: _mm_q3_k_panel, T.Q5_K: _mm_q5_k_panel, T.Q4_K: _mm_q4_k_panel,
         T.Q6_K: _mm_q6_k_panel}
