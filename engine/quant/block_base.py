"""What every weight format shares: the registry (subclass :class:`QuantFormat` with
``qtype=`` to register; ``get_format`` / ``supported_types`` read it) and the block arithmetic the
codecs of formats.py and lowbit.py both use (half floats, nibbles, rounding as the C reference
does, the K formats' affine scale fit).

It imports no format module: formats.py and lowbit.py import it (and formats.py imports lowbit.py
so that importing it registers every format).
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["QK_K", "QuantFormat", "UnsupportedWeightType", "abs_max_signed", "f16_column", "fit_scale_min",
           "get_format", "nibbles", "pack_nibbles", "round_half_away", "safe_inv", "supported_types",
           "to_f16_bytes", "trunc_clip"]

QK_K = 256


class UnsupportedWeightType(ValueError):
    """A tensor's GGML type has no registered :class:`QuantFormat`."""


class QuantFormat:
    """One GGML weight format. Subclass with ``class X(QuantFormat, qtype=...)`` to register."""

    qtype: ClassVar[GGMLQuantizationType]
    block_size: ClassVar[int]
    type_size: ClassVar[int]
    # ggml's `vec_dot_type`: how a product with this weight rounds its activations
    # (activations.round_activations): "q8_k", "q8_0", "f16", "bf16" or "f32"
    vec_dot_type: ClassVar[str] = "f32"

    def __init_subclass__(cls, qtype: GGMLQuantizationType | None = None, **kw) -> None:
        super().__init_subclass__(**kw)
        if qtype is None:
            return
        cls.qtype = GGMLQuantizationType(qtype)
        cls.block_size, cls.type_size = GGML_QUANT_SIZES[cls.qtype]
        if cls.qtype in _REGISTRY:
            raise RuntimeError(f"{cls.qtype.name} registered twice")
        _REGISTRY[cls.qtype] = cls

    def __init__(self) -> None:  # pragma: no cover - formats are used as classes
        raise TypeError("QuantFormat classes are not instantiated")

    @classmethod
    def dequantize_blocks(cls, blocks: np.ndarray) -> np.ndarray:
        """uint8 (n, type_size) -> float32 (n, block_size)."""
        raise NotImplementedError

    @classmethod
    def quantize_blocks(cls, values: np.ndarray) -> np.ndarray:
        """float32 (n, block_size) -> uint8 (n, type_size)."""
        raise NotImplementedError


_REGISTRY: dict[GGMLQuantizationType, type[QuantFormat]] = {}


# ----------------------------------------------------------------------------- helpers

def f16_column(col: np.ndarray) -> np.ndarray:
    """uint8 (n, 2) little-endian half floats -> float32 (n, 1)."""
    return np.ascontiguousarray(col).view(np.float16).astype(np.float32)


def to_f16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 (n, 1) -> uint8 (n, 2) (round to nearest even, as GGML_FP32_TO_FP16)."""
    return np.ascontiguousarray(v, dtype=np.float32).astype(np.float16).view(np.uint8)


def safe_inv(d: np.ndarray) -> np.ndarray:
    """1/d where d != 0, else 0 (float32)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 (n, k) -> uint8 (n, 2, k): [low nibbles, high nibbles]."""
    return np.stack([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


def pack_nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo.astype(np.uint8) & np.uint8(0x0F)) | (hi.astype(np.uint8) << np.uint8(4))


def abs_max_signed(x: np.ndarray) -> np.ndarray:
    """The value with the largest magnitude along the last axis (first one on ties), keepdims."""
    i = np.abs(x).argmax(axis=-1)[..., None]
    return np.take_along_axis(x, i, axis=-1)


def trunc_clip(v: np.ndarray, hi: int) -> np.ndarray:
    """``MIN(hi, (int8_t)v)`` for v >= 0 as in the reference quantizers."""
    return np.clip(np.trunc(v), 0, hi).astype(np.uint8)


def round_half_away(v: np.ndarray) -> np.ndarray:
    """C ``roundf`` (ties away from zero), exactly."""
    t = np.trunc(v)
    frac = v - t  # exact
    return t + np.where(np.abs(frac) >= 0.5, np.sign(v), np.float32(0)).astype(v.dtype)


def fit_scale_min(x: np.ndarray, w: np.ndarray, nmax: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sub-block affine fit ``x ~ scale*L - mn`` with integer L in [0, nmax] (make_qkx2 idea).

    x, w: float32 (k, g) -- lane-major, one column per sub-block, so every reduction is a few
    long vector adds. Start from the min/max grid, then for each offset try
    ``iscale = (nmax + offset)/(max - min)``, refit scale and min by weighted least squares for
    those levels (min clamped to <= 0), and keep whichever has the smallest weighted squared error.
    Returns (scale, mn) float32 (g,), with mn >= 0 the amount subtracted.
    """
    f32 = np.float32
    lo = np.minimum(x.min(axis=0), f32(0))
    hi = x.max(axis=0)
    span = hi - lo
    flat = span <= 0
    span = np.where(flat, f32(1), span)
    sum_w = w.sum(axis=0)
    wx = w * x
    sum_x = wx.sum(axis=0)
    swx2 = (wx * x).sum(axis=0)
    xs = x - lo

    iscale = f32(nmax) / span
    scale = f32(1) / iscale
    L = np.clip(np.rint(iscale * xs), 0, nmax)
    best_err = (w * np.square(scale * L + lo - x)).sum(axis=0)
    best_scale, best_min = scale, lo
    for off in offsets:
        iscale = (f32(nmax) + f32(off)) / span
        L = np.rint(iscale * xs)  # xs >= 0, so only the top needs clamping
        np.minimum(L, f32(nmax), out=L)
        wl = w * L
        sum_l = wl.sum(axis=0)
        sum_l2 = (wl * L).sum(axis=0)
        sum_xl = (wx * L).sum(axis=0)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Ds = np.where(ok, D, f32(1))
        s = (sum_w * sum_xl - sum_x * sum_l) / Ds
        mnv = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
        pos = mnv > 0
        s = np.where(pos, sum_xl / np.where(sum_l2 > 0, sum_l2, f32(1)), s)
        mnv = np.where(pos, f32(0), mnv)
        # weighted error without materialising the residual: sum w (s L + m - x)^2
        #   = s^2 sum wL^2 + 2 s m sum wL - 2 s sum wxL + m^2 sum w - 2 m sum wx + sum wx^2
        err = (s * s * sum_l2 + f32(2) * s * mnv * sum_l - f32(2) * s * sum_xl
               + mnv * mnv * sum_w - f32(2) * mnv * sum_x)
        err += swx2
        better = ok & (err < best_err)
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, s, best_scale)
        best_min = np.where(better, mnv, best_min)
    best_scale = np.where(flat, f32(0), best_scale).astype(f32)
    return best_scale, (-best_min).astype(f32)


# ----------------------------------------------------------------------------- the registry

def supported_types() -> list[GGMLQuantizationType]:
    return list(_REGISTRY)


def get_format(qtype) -> type[QuantFormat]:
    """The format class for ``qtype`` (a GGMLQuantizationType, its int value or its name)."""
    try:
        if isinstance(qtype, str):
            key = GGMLQuantizationType[qtype.upper()]
        else:
            key = GGMLQuantizationType(int(qtype))
        return _REGISTRY[key]
    except (KeyError, ValueError, TypeError):
        name = getattr(qtype, "name", None) or repr(qtype)
        if not isinstance(qtype, (str, GGMLQuantizationType)):
            try:
                name = f"{GGMLQuantizationType(int(qtype)).name} ({int(qtype)})"
            except (ValueError, TypeError):
                pass
        known = ", ".join(t.name for t in _REGISTRY)
        raise UnsupportedWeightType(f"unsupported weight type {name}; supported: {known}") from None
