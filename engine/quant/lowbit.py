"""The formats of the smaller GGUFs people download: Q2_K, Q3_K, IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS.

Registered by subclassing :class:`QuantFormat` (engine/quant/block_base.py); formats.py imports
this module, so importing formats registers every format. Decoding does its float32 arithmetic in the order of
``ggml-quants.c`` (``dequantize_row_*``), which ``gguf.quants`` follows, so the output is
bit-identical to that oracle. The IQ grids and the IQ4 non-linear levels are read from the
``gguf`` package (``gguf.quants.IQ3_S.grid`` etc.), never retyped.

The encoders exist for the model factory (seeded random weights): simple, vectorised, and
decodable by llama.cpp -- each writes valid blocks with a per-sub-block scale fitted to the
values; they do not reproduce llama.cpp's quantizers bit for bit, nor need an importance
matrix (llama-quantize requires one for IQ2_XXS / IQ2_XS / IQ1_*, which we do not write).
"""
from __future__ import annotations

import functools

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as _gq

from .block_base import QK_K, QuantFormat
from .block_base import abs_max_signed as _abs_max_signed
from .block_base import f16_column as _f16
from .block_base import fit_scale_min as _fit_scale_min
from .block_base import safe_inv as _safe_inv
from .block_base import to_f16_bytes as _to_f16_bytes

_F32 = np.float32

# IQ4_NL / IQ4_XS levels, from gguf (kvalues_iq4nl in ggml-common.h)
IQ4_LEVELS = np.array(_gq.IQ4_NL.kvalues, dtype=np.int8)


@functools.cache
def iq_grid(qtype: GGMLQuantizationType) -> np.ndarray:
    """The lattice of an IQ format as uint8 (entries, values per entry), from gguf.quants."""
    cls = {GGMLQuantizationType.IQ3_S: _gq.IQ3_S, GGMLQuantizationType.IQ3_XXS: _gq.IQ3_XXS}[qtype]
    cls.init_grid()
    g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    out = g.astype(np.uint8)
    if not np.array_equal(out.astype(np.float32), g):  # the grids hold small integers
        raise RuntimeError(f"{qtype.name} grid from gguf is not integral")
    out.setflags(write=False)
    return out


@functools.cache
def ksigns() -> np.ndarray:
    """ksigns_iq2xs: 7 sign bits -> 8 (the 8th makes the count of minus signs even), from gguf."""
    a = np.frombuffer(_gq.IQ2_XXS.ksigns, dtype=np.uint8).copy()
    a.setflags(write=False)
    return a


def _level_midpoints() -> np.ndarray:
    lv = IQ4_LEVELS.astype(_F32)
    return (lv[1:] + lv[:-1]) * _F32(0.5)


def _level_table() -> tuple[np.ndarray, int]:
    """(table, bound) for :func:`_nearest_level`: the IQ4 levels are integers, so their midpoints
    are multiples of 1/2 and "midpoints below t" depends only on ceil(2t) (for an integer 2m,
    2m < 2t exactly when 2m < ceil(2t)); the table holds that count for ceil(2t) in
    [-bound, bound], past which it is 0 or 15."""
    twice = _level_midpoints() * _F32(2)
    if not np.array_equal(twice, np.rint(twice)):
        raise RuntimeError("IQ4 level midpoints from gguf are not multiples of 1/2")
    bound = int(np.abs(twice).max()) + 1
    table = np.searchsorted(twice, np.arange(-bound, bound + 1, dtype=_F32)).astype(np.uint8)
    table.setflags(write=False)
    return table, bound


_LEVEL_TABLE, _LEVEL_BOUND = _level_table()


def _nearest_level(t: np.ndarray) -> np.ndarray:
    """Index of the IQ4 level nearest each value of t (float32) -> uint8: the count of level
    midpoints below t, ``np.searchsorted(midpoints, t)``, read from a table by ceil(2t) (4x
    faster than the binary search, which was 70 % of the IQ4_XS encoder: the 9B factory model
    has 7 G values to encode). NaN counts as above every midpoint, as searchsorted sorts it."""
    u = np.ceil(t * _F32(2))
    nan = np.isnan(u)
    u[nan] = _F32(_LEVEL_BOUND)
    np.clip(u, -_LEVEL_BOUND, _LEVEL_BOUND, out=u)
    return _LEVEL_TABLE[u.astype(np.int32) + _LEVEL_BOUND]


def _nearest_grid(t: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """t (g, k) non-negative targets -> index (g,) of the nearest grid row (squared distance)."""
    # elementwise IEEE arithmetic in a fixed order, no BLAS: a product whose rounding depends on
    # the host's kernels could pick a different row on another CPU, and the factory's bytes
    # (which the recorded fixtures pin by sha256) must not depend on the host
    gf = grid.astype(_F32).T  # (k, entries)
    out = np.empty(len(t), np.int64)
    for i in range(0, len(t), 2048):
        c = t[i:i + 2048]
        d = np.square(c[:, 0:1] - gf[0][None, :])
        for j in range(1, gf.shape[0]):
            d += np.square(c[:, j:j + 1] - gf[j][None, :])
        out[i:i + 2048] = d.argmin(axis=1)
    return out


# ----------------------------------------------------------------------------- Q2_K

class Q2_K(QuantFormat, qtype=GGMLQuantizationType.Q2_K):
    vec_dot_type = "q8_k"

    # scales: 16 bytes (low nibble scale, high nibble min), qs: 64 bytes, d: f16, dmin: f16.
    # value 128h + 32s + l (sub-block j = its index // 16) = (d*sc_j) * ((qs[32h+l] >> 2s) & 3) - dmin*m_j
    OFFSETS = np.array([-0.5, -0.25, 0.25, 0.5], dtype=np.float32)

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = len(blocks)
        sc = blocks[:, 0:16]
        d = _f16(blocks[:, 80:82])
        dmin = _f16(blocks[:, 82:84])
        dl = (d * (sc & np.uint8(0xF)).astype(_F32))[:, :, None]
        ml = (dmin * (sc >> np.uint8(4)).astype(_F32))[:, :, None]
        qs = blocks[:, 16:80].reshape(n, 2, 1, 32) >> (np.arange(4, dtype=np.uint8) * np.uint8(2))[None, None, :, None]
        q = (qs & np.uint8(3)).reshape(n, 16, 16).astype(_F32)
        return (dl * q - ml).reshape(n, QK_K)

    @classmethod
    def quantize_blocks(cls, values):
        n = len(values)
        x = np.asarray(values, dtype=_F32).reshape(n * 16, 16)
        xt = np.ascontiguousarray(x.T)
        w = np.abs(xt) + np.sqrt((xt * xt).mean(axis=0))
        scale, mn = _fit_scale_min(xt, w, 3, cls.OFFSETS)
        scale = scale.reshape(n, 16)
        mn = mn.reshape(n, 16)
        max_scale = np.maximum(scale.max(axis=1, keepdims=True), _F32(0))
        max_min = np.maximum(mn.max(axis=1, keepdims=True), _F32(0))
        ls = np.clip(np.rint(_safe_inv(max_scale) * _F32(15) * scale), 0, 15).astype(np.uint8)
        lm = np.clip(np.rint(_safe_inv(max_min) * _F32(15) * mn), 0, 15).astype(np.uint8)
        d_b = _to_f16_bytes(max_scale / _F32(15))
        dmin_b = _to_f16_bytes(max_min / _F32(15))
        dq = (_f16(d_b) * ls.astype(_F32))[:, :, None]
        mq = (_f16(dmin_b) * lm.astype(_F32))[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            L = np.rint((x.reshape(n, 16, 16) + mq) / dq)
        L = np.where(dq == 0, _F32(0), np.clip(L, 0, 3)).astype(np.uint8).reshape(n, 2, 4, 32)
        qs = (L[:, :, 0] | (L[:, :, 1] << np.uint8(2)) | (L[:, :, 2] << np.uint8(4)) | (L[:, :, 3] << np.uint8(6)))
        return np.concatenate([ls | (lm << np.uint8(4)), qs.reshape(n, 64), d_b, dmin_b], axis=1)


# ----------------------------------------------------------------------------- Q3_K

def _q3_k_scales(sc12: np.ndarray) -> np.ndarray:
    """The 12 packed scale bytes of Q3_K -> int (n, 16) in [-32, 31]. Scale j (j = 8k + i, i < 8)
    has its low nibble in nibble k of byte i; scale j (j = 4k + i, i < 4) its top 2 bits in
    bits 2k of byte 8 + i."""
    n = len(sc12)
    lo = (sc12[:, 0:8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (sc12[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    return ((lo & np.uint8(0xF)) | ((hi & np.uint8(3)) << np.uint8(4))).astype(np.int8) - np.int8(32)


def _q3_k_pack_scales(ls: np.ndarray) -> np.ndarray:
    """int (n, 16) in [-32, 31] -> the 12 bytes :func:`_q3_k_scales` reads."""
    u = (ls.astype(np.int16) + 32).astype(np.uint8)
    lo = u & np.uint8(0xF)
    hi = u >> np.uint8(4)
    a = lo[:, 0:8] | (lo[:, 8:16] << np.uint8(4))
    b = hi[:, 0:4] | (hi[:, 4:8] << np.uint8(2)) | (hi[:, 8:12] << np.uint8(4)) | (hi[:, 12:16] << np.uint8(6))
    return np.concatenate([a, b], axis=1)


class Q3_K(QuantFormat, qtype=GGMLQuantizationType.Q3_K):
    vec_dot_type = "q8_k"

    # hmask: 32 bytes, qs: 64 bytes, scales: 12 bytes (16 x 6 bits), d: f16.
    # value v = 128h + 32s + l: (d*(sc_j - 32)) * (((qs[32h+l] >> 2s) & 3) - (bit (v >> 5) of hmask[l] ? 0 : 4))
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = len(blocks)
        d = _f16(blocks[:, 108:110])
        dl = (d * _q3_k_scales(blocks[:, 96:108]).astype(_F32)).reshape(n, 16, 1)
        ql = blocks[:, 32:96].reshape(n, 2, 1, 32) >> (np.arange(4, dtype=np.uint8) * np.uint8(2))[None, None, :, None]
        qh = blocks[:, 0:32].reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
        ql = ql.reshape(n, 16, 16) & np.uint8(3)
        qh = (qh.reshape(n, 16, 16) & np.uint8(1)) ^ np.uint8(1)
        q = (ql.astype(np.int8) - (qh << np.uint8(2)).astype(np.int8)).astype(_F32)
        return (dl * q).reshape(n, QK_K)

    @classmethod
    def quantize_blocks(cls, values):
        n = len(values)
        x = np.asarray(values, dtype=_F32).reshape(n, 16, 16)
        scales = _abs_max_signed(x)[:, :, 0] / _F32(-4)           # the largest magnitude -> -4
        max_scale = _abs_max_signed(scales)                        # (n, 1), signed
        empty = np.abs(max_scale) < _F32(1e-30)
        iscale = np.where(empty, _F32(0), _F32(-32) / np.where(empty, _F32(1), max_scale))
        ls = np.clip(np.rint(iscale * scales), -32, 31).astype(np.int8)
        d_b = _to_f16_bytes(np.where(empty, _F32(0), _F32(1) / np.where(empty, _F32(1), iscale)))
        dq = (_f16(d_b) * ls.astype(_F32))[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            L = np.rint(x / dq)
        L = (np.where(dq == 0, _F32(0), np.clip(L, -4, 3)) + _F32(4)).astype(np.uint8).reshape(n, 256)
        low = (L & np.uint8(3)).reshape(n, 2, 4, 32)
        qs = (low[:, :, 0] | (low[:, :, 1] << np.uint8(2)) | (low[:, :, 2] << np.uint8(4))
              | (low[:, :, 3] << np.uint8(6))).reshape(n, 64)
        high = (L >> np.uint8(2)).reshape(n, 8, 32)                # bit j of hmask[l]: value 32j + l
        hmask = np.packbits(high.transpose(0, 2, 1), axis=2, bitorder="little").reshape(n, 32)
        return np.concatenate([hmask, qs, _q3_k_pack_scales(ls), d_b], axis=1)


# ----------------------------------------------------------------------------- IQ4_NL, IQ4_XS

class IQ4_NL(QuantFormat, qtype=GGMLQuantizationType.IQ4_NL):
    vec_dot_type = "q8_0"

    # d: f16, qs: 16 bytes; value j = d * level[qs[j] & 15], value 16 + j = d * level[qs[j] >> 4]
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = len(blocks)
        d = _f16(blocks[:, 0:2])
        qs = blocks[:, 2:18].reshape(n, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
        return d * IQ4_LEVELS[(qs & np.uint8(0xF)).reshape(n, 32)].astype(_F32)

    @classmethod
    def quantize_blocks(cls, values):
        x = np.asarray(values, dtype=_F32)
        d0 = _abs_max_signed(x) / _F32(-127)
        idx = _nearest_level(x * _safe_inv(d0))
        # refit d by least squares for the chosen levels
        lv = IQ4_LEVELS[idx].astype(_F32)
        den = (lv * lv).sum(axis=1, keepdims=True)
        d = np.where(den > 0, (lv * x).sum(axis=1, keepdims=True) / np.where(den > 0, den, _F32(1)), _F32(0))
        d_b = _to_f16_bytes(d)
        idx = _nearest_level(x * _safe_inv(_f16(d_b)))
        return np.concatenate([d_b, idx[:, :16] | (idx[:, 16:] << np.uint8(4))], axis=1)


class IQ4_XS(QuantFormat, qtype=GGMLQuantizationType.IQ4_XS):
    vec_dot_type = "q8_k"

    # d: f16, scales_h: u16, scales_l: 4 bytes, qs: 128 bytes. Sub-block j (32 values):
    # ls = (nibble j&1 of scales_l[j/2]) | ((scales_h >> 2j) & 3) << 4; dl = d * (ls - 32);
    # value 32j + l = dl * level[qs[16j + l] & 15], 32j + 16 + l = dl * level[qs[16j + l] >> 4]
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = len(blocks)
        d = _f16(blocks[:, 0:2])
        sh = np.ascontiguousarray(blocks[:, 2:4]).view(np.uint16)        # (n, 1)
        sl = blocks[:, 4:8].reshape(n, 4, 1) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2)
        sl = sl.reshape(n, 8) & np.uint8(0xF)
        hi = ((sh >> (np.arange(8, dtype=np.uint16) * np.uint16(2))[None, :]) & np.uint16(3)).astype(np.uint8)
        ls = (sl | (hi << np.uint8(4))).astype(np.int8) - np.int8(32)
        dl = (d * ls.astype(_F32)).reshape(n, 8, 1)
        qs = blocks[:, 8:136].reshape(n, 8, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = IQ4_LEVELS[(qs & np.uint8(0xF)).reshape(n, 8, 32)].astype(_F32)
        return (dl * q).reshape(n, QK_K)

    @classmethod
    def quantize_blocks(cls, values):
        n = len(values)
        x = np.asarray(values, dtype=_F32).reshape(n, 8, 32)
        scales = _abs_max_signed(x)[:, :, 0] / _F32(-127)
        max_scale = _abs_max_signed(scales)
        empty = np.abs(max_scale) < _F32(1e-30)
        iscale = np.where(empty, _F32(0), _F32(-32) / np.where(empty, _F32(1), max_scale))
        ls = np.clip(np.rint(iscale * scales), -32, 31).astype(np.int8)
        d_b = _to_f16_bytes(np.where(empty, _F32(0), _F32(1) / np.where(empty, _F32(1), iscale)))
        dl = (_f16(d_b) * ls.astype(_F32))[:, :, None]
        idx = _nearest_level(x * _safe_inv(dl)).reshape(n, 8, 32)
        qs = (idx[:, :, :16] | (idx[:, :, 16:] << np.uint8(4))).reshape(n, 128)
        u = (ls.astype(np.int16) + 32).astype(np.uint16)
        sh = np.bitwise_or.reduce((u >> np.uint16(4)) << (np.arange(8, dtype=np.uint16) * np.uint16(2)), axis=1)
        lo = (u & np.uint16(0xF)).astype(np.uint8)
        sl = lo[:, 0::2] | (lo[:, 1::2] << np.uint8(4))
        return np.concatenate([d_b, sh.astype(np.uint16).reshape(n, 1).view(np.uint8), sl, qs], axis=1)


# ----------------------------------------------------------------------------- IQ3_S, IQ3_XXS

class IQ3_S(QuantFormat, qtype=GGMLQuantizationType.IQ3_S):
    vec_dot_type = "q8_k"

    # d: f16, qs: 64 bytes, qh: 8 bytes, signs: 32 bytes, scales: 4 bytes. Group g of 4 values
    # (g < 64): grid row qs[g] | ((qh[g/8] >> g%8) & 1) << 8 of the 512 x 4 lattice (odd 1..15);
    # sub-block k = g/8: db = d * (1 + 2*nibble k&1 of scales[k/2]); value v gets a minus sign
    # where bit v%8 of signs[v/8] is set.
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = len(blocks)
        d = _f16(blocks[:, 0:2])
        sc = blocks[:, 106:110].reshape(n, 4, 1) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2)
        sc = sc.reshape(n, 8) & np.uint8(0xF)
        db = (d * (np.uint8(1) + np.uint8(2) * sc)).reshape(n, 8, 1, 1)
        bits = np.unpackbits(np.ascontiguousarray(blocks[:, 74:106]), axis=1, bitorder="little")
        signs = np.where(bits == 0, _F32(1), _F32(-1)).reshape(n, 8, 8, 4)
        qh = np.unpackbits(np.ascontiguousarray(blocks[:, 66:74]), axis=1, bitorder="little").astype(np.uint16)
        idx = blocks[:, 2:66].astype(np.uint16) | (qh << np.uint16(8))
        grid = iq_grid(cls.qtype).astype(_F32)[idx].reshape(n, 8, 8, 4)
        return (db * grid * signs).reshape(n, QK_K)

    @classmethod
    def quantize_blocks(cls, values):
        n = len(values)
        x = np.asarray(values, dtype=_F32).reshape(n, 8, 32)
        a = np.abs(x)
        scale = a.max(axis=2) / _F32(15)                            # the largest value -> 15
        dmax = scale.max(axis=1, keepdims=True) / _F32(31)
        d_b = _to_f16_bytes(dmax)
        d = _f16(d_b)
        s = np.clip(np.rint((scale * _safe_inv(d) - _F32(1)) * _F32(0.5)), 0, 15).astype(np.uint8)
        db = d * (np.uint8(1) + np.uint8(2) * s).astype(_F32)
        t = (a * _safe_inv(db)[:, :, None]).reshape(-1, 4)
        idx = _nearest_grid(t, iq_grid(cls.qtype)).astype(np.uint16).reshape(n, 64)
        qs = (idx & np.uint16(0xFF)).astype(np.uint8)
        qh = np.packbits((idx >> np.uint16(8)).astype(np.uint8), axis=1, bitorder="little")
        signs = np.packbits((x < 0).reshape(n, 256).astype(np.uint8), axis=1, bitorder="little")
        return np.concatenate([d_b, qs, qh, signs, s[:, 0::2] | (s[:, 1::2] << np.uint8(4))], axis=1)


class IQ3_XXS(QuantFormat, qtype=GGMLQuantizationType.IQ3_XXS):
    vec_dot_type = "q8_k"

    # d: f16, qs: 64 grid indices (256 x 4 lattice), then 8 u32 (one per 32 values):
    # bits 7l..7l+6 index ksigns for the 8 values 8l.., bits 28..31 the scale s;
    # db = d * (0.5 + s) * 0.5.
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = len(blocks)
        d = _f16(blocks[:, 0:2])
        aux = np.ascontiguousarray(blocks[:, 66:98]).view(np.uint32)          # (n, 8)
        db = (d * (_F32(0.5) + (aux >> np.uint32(28)).astype(_F32)) * _F32(0.5)).reshape(n, 8, 1, 1)
        s7 = (aux.reshape(n, 8, 1) >> (np.arange(4, dtype=np.uint32) * np.uint32(7))) & np.uint32(0x7F)
        sbits = np.unpackbits(ksigns()[s7].reshape(n, 32), axis=1, bitorder="little")
        signs = np.where(sbits == 0, _F32(1), _F32(-1)).reshape(n, 8, 8, 4)
        grid = iq_grid(cls.qtype).astype(_F32)[blocks[:, 2:66]].reshape(n, 8, 8, 4)
        return (db * grid * signs).reshape(n, QK_K)

    @classmethod
    def quantize_blocks(cls, values):
        n = len(values)
        x = np.asarray(values, dtype=_F32).reshape(n, 8, 32)
        a = np.abs(x)
        scale = a.max(axis=2) / _F32(62)
        d_b = _to_f16_bytes(scale.max(axis=1, keepdims=True) / _F32(7.75))
        d = _f16(d_b)
        s = np.clip(np.rint(scale * _safe_inv(d) * _F32(2) - _F32(0.5)), 0, 15).astype(np.uint32)
        db = d * (_F32(0.5) + s.astype(_F32)) * _F32(0.5)
        t = (a * _safe_inv(db)[:, :, None]).reshape(-1, 4)
        idx = _nearest_grid(t, iq_grid(cls.qtype)).astype(np.uint8).reshape(n, 64)
        # 7 stored sign bits per 8 values: the 8th is implied (an even number of minus signs);
        # where the count is odd flip the value of smallest magnitude, as llama.cpp does
        neg = (x < 0).reshape(n, 32, 8)
        odd = (neg.sum(axis=2) % 2) == 1
        smallest = a.reshape(n, 32, 8).argmin(axis=2)
        flip = np.zeros_like(neg)
        np.put_along_axis(flip, smallest[..., None], odd[..., None], axis=2)
        neg = neg ^ flip
        s7 = np.packbits(neg[:, :, :7].astype(np.uint8), axis=2, bitorder="little").reshape(n, 8, 4).astype(np.uint32)
        aux = (s7[:, :, 0] | (s7[:, :, 1] << np.uint32(7)) | (s7[:, :, 2] << np.uint32(14))
               | (s7[:, :, 3] << np.uint32(21)) | (s << np.uint32(28)))
        return np.concatenate([d_b, idx, aux.astype(np.uint32).view(np.uint8).reshape(n, 32)], axis=1)
