"""Activations rounded the way llama.cpp's CPU backend rounds them before a quantized product.

ggml multiplies a quantized weight by activations converted to the weight's `vec_dot_type`:
Q8_K (256-value blocks, f32 scale) for the K formats, Q8_0 (32-value blocks, f16 scale) for
Q8_0/Q4_0/Q5_0, Q8_1 for Q4_1/Q5_1 (same rounding as Q8_0), F16 for F16 and BF16 for BF16.
Doing the same rounding (then our f32 kernels / BLAS) reproduces llama.cpp's numerics: on
random-weight models, which amplify small differences, skipping it left cosine ≈ 0.98 between
our Q4_K_M logits and llama.cpp's; with it the only difference left is summation order.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

_Q8K = {Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K}
_Q8_0 = {Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_1, Q.Q5_1}


def _q8_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K then dequantize: scale from the signed value of largest magnitude."""
    b = x.reshape(-1, 256)
    idx = np.argmax(np.abs(b), axis=1)
    mx = b[np.arange(b.shape[0]), idx]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0.0)).astype(np.float32)
    q = np.minimum(np.rint(b * iscale[:, None]), 127.0)
    with np.errstate(divide="ignore"):
        d = np.where(iscale != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)
    return (q * d[:, None]).astype(np.float32).reshape(x.shape)


def _q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 then dequantize: d = amax/127 stored as f16, values round(x·127/amax)."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(b * inv[:, None])
    d16 = d.astype(np.float16).astype(np.float32)
    return (q * d16[:, None]).astype(np.float32).reshape(x.shape)


def _bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def round_activations(x: np.ndarray, weight_type: Q) -> np.ndarray:
    """x (T, in) f32 as the product with a `weight_type` matrix sees it in llama.cpp."""
    if weight_type in _Q8K:
        return _q8_k(np.ascontiguousarray(x, dtype=np.float32))
    if weight_type in _Q8_0:
        return _q8_0(np.ascontiguousarray(x, dtype=np.float32))
    if weight_type == Q.F16:
        return x.astype(np.float16).astype(np.float32)
    if weight_type == Q.BF16:
        return _bf16(x)
    return x
