"""Weight formats: one class per GGML type, registered by ``gguf.GGMLQuantizationType``.

Each class knows its block geometry (``block_size`` values in ``type_size`` bytes), decodes
blocks with vectorised numpy (``dequantize_blocks``) and encodes them (``quantize_blocks``).
Adding a format is one subclass of :class:`QuantFormat`; the fast numba kernels for the same
format live side by side in :mod:`engine.quant.kernels`.

Decoding does its float32 arithmetic in the same order as ``ggml-quants.c`` (and therefore as
``gguf.quants``), so results are bit-identical to that oracle. The block quantizers follow
the ideas of llama.cpp's reference quantizers (``quantize_row_*_ref``): Q4_0/Q4_1/Q5_0/Q5_1/Q8_0
reproduce them bit for bit; the K formats use the same two-level scheme (search a scale per
sub-block, quantize the sub-block scales to 6/8 bits against a block super-scale, re-round the
values against the quantized scales) with a smaller candidate search, evaluated for all blocks
at once.

Raw data always arrives as uint8 bytes, F32/F16/BF16 included (callers ``.view(np.uint8)``).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

# the registry and the block arithmetic every format shares (block_base.py); the low-bit formats
# (Q2_K, Q3_K, IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS) register themselves from lowbit.py, imported here
from . import lowbit as _lowbit  # noqa: F401
from .block_base import QK_K, QuantFormat, get_format
from .block_base import UnsupportedWeightType, supported_types  # noqa: F401 (formats' public API)
from .block_base import abs_max_signed as _abs_max_signed
from .block_base import f16_column as _f16
from .block_base import fit_scale_min as _fit_scale_min
from .block_base import nibbles as _nibbles
from .block_base import pack_nibbles as _pack_nibbles
from .block_base import round_half_away as _round_half_away
from .block_base import safe_inv as _safe_inv
from .block_base import to_f16_bytes as _to_f16_bytes
from .block_base import trunc_clip as _trunc_clip

# Blocks per chunk when (de)quantizing large tensors: bounds temporaries to a few MB each.
_CHUNK_VALUES = 1 << 18


# ----------------------------------------------------------------------------- float formats

class F32(QuantFormat, qtype=GGMLQuantizationType.F32):
    @classmethod
    def dequantize_blocks(cls, blocks):
        return np.ascontiguousarray(blocks).view(np.float32).copy()

    @classmethod
    def quantize_blocks(cls, values):
        return np.ascontiguousarray(values, dtype=np.float32).view(np.uint8).copy()


class F16(QuantFormat, qtype=GGMLQuantizationType.F16):
    vec_dot_type = "f16"

    @classmethod
    def dequantize_blocks(cls, blocks):
        return np.ascontiguousarray(blocks).view(np.float16).astype(np.float32)

    @classmethod
    def quantize_blocks(cls, values):
        return np.ascontiguousarray(values, dtype=np.float32).astype(np.float16).view(np.uint8)


class BF16(QuantFormat, qtype=GGMLQuantizationType.BF16):
    vec_dot_type = "bf16"

    @classmethod
    def dequantize_blocks(cls, blocks):
        u = np.ascontiguousarray(blocks).view(np.uint16).astype(np.uint32) << np.uint32(16)
        return u.view(np.float32)

    @classmethod
    def quantize_blocks(cls, values):
        u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        # round to nearest even on the 16 dropped bits; NaNs become quiet NaNs
        rounded = (u.astype(np.uint64) + (np.uint64(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint64(16)
        quiet = (u >> np.uint32(16)) | np.uint32(64)
        out = np.where(nan, quiet, rounded).astype(np.uint16)
        return out.view(np.uint8)


# ----------------------------------------------------------------------------- 32-value formats

class Q8_0(QuantFormat, qtype=GGMLQuantizationType.Q8_0):
    vec_dot_type = "q8_0"

    # d: f16, qs: int8[32];  x = qs * d
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = _f16(blocks[:, :2])
        q = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
        return q * d

    @classmethod
    def quantize_blocks(cls, values):
        v = np.asarray(values, dtype=np.float32)
        d = np.abs(v).max(axis=1, keepdims=True) / np.float32(127)
        q = _round_half_away(v * _safe_inv(d)).astype(np.int8).view(np.uint8)
        return np.concatenate([_to_f16_bytes(d), q], axis=1)


class Q4_0(QuantFormat, qtype=GGMLQuantizationType.Q4_0):
    vec_dot_type = "q8_0"

    # d: f16, qs: 16 bytes; value j = low nibble of qs[j], value 16+j = high nibble; x = (q-8)*d
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = _f16(blocks[:, :2])
        q = _nibbles(blocks[:, 2:]).reshape(len(blocks), 32).astype(np.int8) - np.int8(8)
        return d * q.astype(np.float32)

    @classmethod
    def quantize_blocks(cls, values):
        v = np.asarray(values, dtype=np.float32)
        d = _abs_max_signed(v) / np.float32(-8)
        q = _trunc_clip(v * _safe_inv(d) + np.float32(8.5), 15)
        return np.concatenate([_to_f16_bytes(d), _pack_nibbles(q[:, :16], q[:, 16:])], axis=1)


class Q4_1(QuantFormat, qtype=GGMLQuantizationType.Q4_1):
    vec_dot_type = "q8_0"

    # d: f16, m: f16, qs: 16 bytes; x = q*d + m
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = _f16(blocks[:, 0:2])
        m = _f16(blocks[:, 2:4])
        q = _nibbles(blocks[:, 4:]).reshape(len(blocks), 32).astype(np.float32)
        return d * q + m

    @classmethod
    def quantize_blocks(cls, values):
        v = np.asarray(values, dtype=np.float32)
        lo = v.min(axis=1, keepdims=True)
        hi = v.max(axis=1, keepdims=True)
        d = (hi - lo) / np.float32(15)
        q = _trunc_clip((v - lo) * _safe_inv(d) + np.float32(0.5), 15)
        return np.concatenate([_to_f16_bytes(d), _to_f16_bytes(lo), _pack_nibbles(q[:, :16], q[:, 16:])], axis=1)


def _q5_payload(q: np.ndarray) -> np.ndarray:
    """5-bit values (n, 32) -> qh (4 bytes, bit j = bit 4 of value j) + qs (16 nibble-pairs)."""
    qh = np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=1, bitorder="little")
    return np.concatenate([qh, _pack_nibbles(q[:, :16], q[:, 16:])], axis=1)


def _q5_values(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """qh (n, 4), qs (n, 16) -> uint8 5-bit values (n, 32)."""
    high = np.unpackbits(np.ascontiguousarray(qh), axis=1, bitorder="little")
    low = _nibbles(qs).reshape(len(qs), 32)
    return low | (high << np.uint8(4))


class Q5_0(QuantFormat, qtype=GGMLQuantizationType.Q5_0):
    vec_dot_type = "q8_0"

    # d: f16, qh: u32, qs: 16 bytes; x = (q-16)*d
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = _f16(blocks[:, :2])
        q = _q5_values(blocks[:, 2:6], blocks[:, 6:]).astype(np.int8) - np.int8(16)
        return d * q.astype(np.float32)

    @classmethod
    def quantize_blocks(cls, values):
        v = np.asarray(values, dtype=np.float32)
        d = _abs_max_signed(v) / np.float32(-16)
        q = _trunc_clip(v * _safe_inv(d) + np.float32(16.5), 31)
        return np.concatenate([_to_f16_bytes(d), _q5_payload(q)], axis=1)


class Q5_1(QuantFormat, qtype=GGMLQuantizationType.Q5_1):
    vec_dot_type = "q8_0"

    # d: f16, m: f16, qh: u32, qs: 16 bytes; x = q*d + m
    @classmethod
    def dequantize_blocks(cls, blocks):
        d = _f16(blocks[:, 0:2])
        m = _f16(blocks[:, 2:4])
        q = _q5_values(blocks[:, 4:8], blocks[:, 8:]).astype(np.float32)
        return d * q + m

    @classmethod
    def quantize_blocks(cls, values):
        v = np.asarray(values, dtype=np.float32)
        lo = v.min(axis=1, keepdims=True)
        hi = v.max(axis=1, keepdims=True)
        d = (hi - lo) / np.float32(31)
        q = _trunc_clip((v - lo) * _safe_inv(d) + np.float32(0.5), 31)
        return np.concatenate([_to_f16_bytes(d), _to_f16_bytes(lo), _q5_payload(q)], axis=1)


# ----------------------------------------------------------------------------- K formats

def unpack_scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of Q4_K/Q5_K -> (sc, m), each uint8 (n, 8) with 6-bit values.

    Bytes 0-3 hold sc[0:4] in their low 6 bits and the top 2 bits of sc[4:8]; bytes 4-7 the
    same for m; bytes 8-11 hold the low nibbles of sc[4:8] (low) and m[4:8] (high).
    """
    a, b, c = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    six = np.uint8(0x3F)
    sc = np.concatenate([a & six, (c & np.uint8(0x0F)) | ((a >> np.uint8(6)) << np.uint8(4))], axis=1)
    m = np.concatenate([b & six, (c >> np.uint8(4)) | ((b >> np.uint8(6)) << np.uint8(4))], axis=1)
    return sc, m


def pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Inverse of :func:`unpack_scale_min_k4` for 6-bit sc, m (n, 8) -> uint8 (n, 12)."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    a = sc[:, :4] | ((sc[:, 4:] >> np.uint8(4)) << np.uint8(6))
    b = m[:, :4] | ((m[:, 4:] >> np.uint8(4)) << np.uint8(6))
    c = (sc[:, 4:] & np.uint8(0x0F)) | ((m[:, 4:] & np.uint8(0x0F)) << np.uint8(4))
    return np.concatenate([a, b, c], axis=1)


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K header -> per-sub-block (d*sc, dmin*m), float32 (n, 8, 1)."""
    d = _f16(blocks[:, 0:2])
    dmin = _f16(blocks[:, 2:4])
    sc, m = unpack_scale_min_k4(blocks[:, 4:16])
    return (d * sc.astype(np.float32))[:, :, None], (dmin * m.astype(np.float32))[:, :, None]


def _k4_low_values(qs: np.ndarray) -> np.ndarray:
    """128 nibble bytes -> uint8 (n, 8, 32): sub-block 2c = low nibbles of qs[32c:32c+32], 2c+1 = high."""
    n = len(qs)
    return _nibbles(qs.reshape(n, 4, 32).reshape(n * 4, 32)).reshape(n, 8, 32)


def _k4_pack_low(L: np.ndarray) -> np.ndarray:
    """uint8 (n, 8, 32) values (low 4 bits used) -> 128 nibble bytes."""
    return _pack_nibbles(L[:, 0::2, :], L[:, 1::2, :]).reshape(len(L), 128)


def _quantize_k_affine(values: np.ndarray, nmax: int, offsets: np.ndarray):
    """Shared Q4_K/Q5_K encoder: (n, 256) -> (d f16 bytes, dmin f16 bytes, packed scales, L (n, 8, 32))."""
    f32 = np.float32
    n = len(values)
    x = np.asarray(values, dtype=f32).reshape(n * 8, 32)
    xt = np.ascontiguousarray(x.T)  # (32, n*8): lane-major
    av = np.sqrt((xt * xt).sum(axis=0) / f32(32))
    w = av + np.abs(xt)
    scale, mn = _fit_scale_min(xt, w, nmax, offsets)
    scale = scale.reshape(n, 8)
    mn = mn.reshape(n, 8)
    max_scale = np.maximum(scale.max(axis=1, keepdims=True), f32(0))
    max_min = np.maximum(mn.max(axis=1, keepdims=True), f32(0))
    ls = np.clip(np.rint(_safe_inv(max_scale) * f32(63) * scale), 0, 63).astype(np.uint8)
    lm = np.clip(np.rint(_safe_inv(max_min) * f32(63) * mn), 0, 63).astype(np.uint8)
    d_b = _to_f16_bytes(max_scale / f32(63))
    dmin_b = _to_f16_bytes(max_min / f32(63))
    # re-round every value against the scales as they will be decoded
    dq = (_f16(d_b) * ls.astype(f32))[:, :, None]
    mq = (_f16(dmin_b) * lm.astype(f32))[:, :, None]
    xv = x.reshape(n, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.rint((xv + mq) / dq)
    L = np.where(dq == 0, f32(0), np.clip(L, 0, nmax)).astype(np.uint8)
    return d_b, dmin_b, pack_scale_min_k4(ls, lm), L


class Q4_K(QuantFormat, qtype=GGMLQuantizationType.Q4_K):
    vec_dot_type = "q8_k"

    # d: f16, dmin: f16, scales: 12 bytes (8 x 6-bit sc, 8 x 6-bit m), qs: 128 bytes.
    # value 32*s + l = (d*sc[s]) * q - (dmin*m[s]); q = nibble (s&1) of qs[32*(s>>1) + l]
    OFFSETS = np.array([-0.5, 0.5], dtype=np.float32)

    @classmethod
    def dequantize_blocks(cls, blocks):
        ds, ms = _k_scales(blocks)
        q = _k4_low_values(blocks[:, 16:]).astype(np.float32)
        return (ds * q - ms).reshape(len(blocks), QK_K)

    @classmethod
    def quantize_blocks(cls, values):
        d_b, dmin_b, sc_b, L = _quantize_k_affine(values, 15, cls.OFFSETS)
        return np.concatenate([d_b, dmin_b, sc_b, _k4_pack_low(L)], axis=1)


class Q5_K(QuantFormat, qtype=GGMLQuantizationType.Q5_K):
    vec_dot_type = "q8_k"

    # as Q4_K plus qh: 32 bytes; bit s of qh[l] is bit 4 of value 32*s + l.
    OFFSETS = np.array([-0.5, 0.5], dtype=np.float32)

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = len(blocks)
        ds, ms = _k_scales(blocks)
        low = _k4_low_values(blocks[:, 48:])
        high = np.unpackbits(np.ascontiguousarray(blocks[:, 16:48]).reshape(n, 32, 1), axis=2, bitorder="little")
        q = (low | (high.transpose(0, 2, 1) << np.uint8(4))).astype(np.float32)
        return (ds * q - ms).reshape(n, QK_K)

    @classmethod
    def quantize_blocks(cls, values):
        n = len(values)
        d_b, dmin_b, sc_b, L = _quantize_k_affine(values, 31, cls.OFFSETS)
        high = ((L >> np.uint8(4)) & np.uint8(1)).transpose(0, 2, 1)  # (n, 32 lanes, 8 sub-blocks)
        qh = np.packbits(high, axis=2, bitorder="little").reshape(n, 32)
        return np.concatenate([d_b, dmin_b, sc_b, qh, _k4_pack_low(L)], axis=1)


class Q6_K(QuantFormat, qtype=GGMLQuantizationType.Q6_K):
    vec_dot_type = "q8_k"

    # ql: 128 bytes, qh: 64 bytes, scales: int8[16], d: f16.  For half h, t in 0..3, lane l:
    # value 128h + 32t + l = (d*scales[(128h+32t+l)//16]) * (q - 32), with
    # q = nibble (t>>1) of ql[64h + 32(t&1) + l]  |  ((qh[32h + l] >> 2t) & 3) << 4
    SEARCH = np.array([-0.9, -0.45, 0.45, 0.9], dtype=np.float32)

    @classmethod
    def _levels(cls, blocks):
        n = len(blocks)
        ql = blocks[:, 0:128].reshape(n, 2, 2, 32)          # (h, t&1, l)
        low = _nibbles(ql.reshape(n * 2, 64)).reshape(n, 2, 2, 2, 32)  # (h, t>>1, t&1, l)
        low = low.reshape(n, 2, 4, 32)                       # t = 2*(t>>1) + (t&1)
        qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
        high = (qh >> (np.arange(4, dtype=np.uint8) * np.uint8(2))[None, None, :, None]) & np.uint8(3)
        return (low | (high << np.uint8(4))).reshape(n, QK_K)

    @classmethod
    def dequantize_blocks(cls, blocks):
        n = len(blocks)
        sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
        d = _f16(blocks[:, 208:210])
        q = (cls._levels(blocks).astype(np.int8) - np.int8(32)).astype(np.float32)
        return ((d * sc)[:, :, None] * q.reshape(n, 16, 16)).reshape(n, QK_K)

    @classmethod
    def _subblock_scales(cls, x: np.ndarray) -> np.ndarray:
        """make_qx_quants(nmax=32, rmse_type=1) idea: x (16, g) lane-major -> signed scale (g,)
        maximising sumlx^2/suml2 (weights x^2) over the base grid and a few stretched ones."""
        f32 = np.float32
        hi = x.max(axis=0)
        lo = x.min(axis=0)
        mx = np.where(hi >= -lo, hi, lo)  # the signed value of largest magnitude
        zero = np.abs(mx) < f32(1e-15)
        mx = np.where(zero, f32(1), mx)
        w = x * x
        wx = w * x
        best_scale = None
        best = None
        for off in np.concatenate([[f32(0)], cls.SEARCH]):
            iscale = -(f32(32) + off) / mx
            L = np.rint(iscale * x)
            np.clip(L, -32, 31, out=L)
            sumlx = (wx * L).sum(axis=0)
            suml2 = (w * L * L).sum(axis=0)
            s = sumlx / np.where(suml2 > 0, suml2, f32(1))
            score = s * sumlx  # = sumlx^2/suml2, larger is better
            if best is None:
                best, best_scale = score, s
            else:
                better = (suml2 > 0) & (score > best)
                best = np.where(better, score, best)
                best_scale = np.where(better, s, best_scale)
        assert best_scale is not None  # the search always has its first candidate
        return np.where(zero, f32(0), best_scale).astype(f32)

    @classmethod
    def quantize_blocks(cls, values):
        f32 = np.float32
        n = len(values)
        x = np.asarray(values, dtype=f32).reshape(n, 16, 16)
        scales = cls._subblock_scales(np.ascontiguousarray(x.reshape(n * 16, 16).T)).reshape(n, 16)
        max_scale = _abs_max_signed(scales)  # (n, 1), signed
        empty = np.abs(max_scale) < f32(1e-15)
        iscale = np.where(empty, f32(0), f32(-128) / np.where(empty, f32(1), max_scale))
        d_b = _to_f16_bytes(np.where(empty, f32(0), f32(1) / np.where(empty, f32(1), iscale)))
        ls = np.clip(np.rint(iscale * scales), -128, 127).astype(np.int8)
        dq = (_f16(d_b) * ls.astype(f32))[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            L = np.rint(x / dq)
        L = (np.where(dq == 0, f32(0), np.clip(L, -32, 31)) + f32(32)).astype(np.uint8).reshape(n, 2, 4, 32)
        lo = L & np.uint8(0x0F)
        ql = (lo[:, :, 0:2, :] | (lo[:, :, 2:4, :] << np.uint8(4))).reshape(n, 128)
        hi = L >> np.uint8(4)
        qh = (hi[:, :, 0] | (hi[:, :, 1] << np.uint8(2)) | (hi[:, :, 2] << np.uint8(4)) | (hi[:, :, 3] << np.uint8(6)))
        return np.concatenate([ql, qh.reshape(n, 64), ls.view(np.uint8), d_b], axis=1)


# ----------------------------------------------------------------------------- public API

def row_bytes(qtype, n_cols: int) -> int:
    fmt = get_format(qtype)
    if n_cols % fmt.block_size:
        raise ValueError(
            f"{fmt.qtype.name} rows must be a multiple of {fmt.block_size} values; got {n_cols}"
        )
    return n_cols // fmt.block_size * fmt.type_size


def dequantize(raw: np.ndarray, qtype, shape: tuple[int, ...]) -> np.ndarray:
    """Raw bytes of a tensor -> float32 array of numpy ``shape`` (last dim = row length)."""
    fmt = get_format(qtype)
    shape = tuple(int(s) for s in shape)
    n_values = int(np.prod(shape, dtype=np.int64)) if shape else 1
    ncols = shape[-1] if shape else 1
    rb = row_bytes(fmt.qtype, ncols)
    need = (n_values // max(ncols, 1)) * rb
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise TypeError(f"raw data must be uint8 bytes, got {raw.dtype}")
    if raw.size != need:
        raise ValueError(f"{fmt.qtype.name} tensor of shape {shape} needs {need} bytes, got {raw.size}")
    blocks = np.ascontiguousarray(raw).reshape(-1, fmt.type_size)
    out = np.empty((len(blocks), fmt.block_size), dtype=np.float32)
    step = max(1, _CHUNK_VALUES // fmt.block_size)
    for i in range(0, len(blocks), step):
        out[i:i + step] = fmt.dequantize_blocks(blocks[i:i + step])
    return out.reshape(shape)


def quantize(values: np.ndarray, qtype) -> np.ndarray:
    """float32 (rows, cols) -> uint8 (rows, row_bytes), chunked over blocks to bound memory."""
    fmt = get_format(qtype)
    values = np.asarray(values, dtype=np.float32)
    if values.ndim != 2:
        raise ValueError(f"quantize expects a 2-D (rows, cols) array, got shape {values.shape}")
    rows, cols = values.shape
    rb = row_bytes(fmt.qtype, cols)
    blocks = np.ascontiguousarray(values).reshape(-1, fmt.block_size)
    out = np.empty((len(blocks), fmt.type_size), dtype=np.uint8)
    step = max(1, (1 << 16) // fmt.block_size) if fmt.block_size > 1 else _CHUNK_VALUES
    for i in range(0, len(blocks), step):
        out[i:i + step] = fmt.quantize_blocks(blocks[i:i + step])
    return out.reshape(rows, rb)

