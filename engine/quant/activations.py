"""Activations rounded the way llama.cpp's CPU backend rounds them before a quantized product.

ggml multiplies a quantized weight by activations converted to the weight's `vec_dot_type`:
Q8_K (256-value blocks, f32 scale) for the K formats, Q8_0 (32-value blocks, f16 scale) for
Q8_0/Q4_0/Q5_0, Q8_1 for Q4_1/Q5_1 (same rounding as Q8_0), F16 for F16 and BF16 for BF16.
Doing the same rounding (then our f32 kernels / BLAS) reproduces llama.cpp's numerics: on
random-weight models, which amplify small differences, skipping it left cosine ≈ 0.98 between
our Q4_K_M logits and llama.cpp's; with it the only difference left is summation order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import numpy as np
from gguf import GGMLQuantizationType as Q
from numba import njit, prange

from engine.jit import kernel
from engine.llvm_ops import f32_to_half_to_f32

from .formats import get_format



@njit(inline="always", cache=True)
def _q8_k_iscale(row):
    """quantize_row_q8_K's scale: -127 / (the signed value of largest magnitude), 0 for a zero row."""
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(row.shape[0]):
        a = abs(row[j])
        if a > amax:
            amax = a
            mx = row[j]
    return np.float32(0.0) if amax == 0 else np.float32(-127.0) / mx


@njit(inline="always", cache=True)
def _q8_k_value(v, iscale):
    """Round half to even, clamp at 127 (the scale makes -127 the most negative value)."""
    return min(np.rint(v * iscale), np.float32(127.0))


@kernel(cache=True)
def _q8_k_blocks(b, out):
    """quantize_row_q8_K then dequantize, per 256-value block."""
    for i in prange(b.shape[0]):
        iscale = _q8_k_iscale(b[i])
        d = np.float32(0.0) if iscale == 0 else np.float32(1.0) / iscale
        for j in range(b.shape[1]):
            out[i, j] = _q8_k_value(b[i, j], iscale) * d


@njit(inline="always", cache=True)
def _q8_k_block(x, i, q, d, sums16):
    """Block i (x[256i:256i+256]) -> q, its scale d[i] and its 16 sums (rounding of `_q8_k_blocks`)."""
    blk = x[i * 256:(i + 1) * 256]
    iscale = _q8_k_iscale(blk)
    d[i] = np.float32(0.0) if iscale == 0 else np.float32(1.0) / iscale
    for g in range(16):
        acc = 0
        for l in range(16):
            v = np.int32(_q8_k_value(blk[16 * g + l], iscale))
            q[i * 256 + 16 * g + l] = v
            acc += v
        sums16[i * 16 + g] = acc


@njit(cache=True)
def quantize_q8_k(x, q, d, sums16):
    """x (n,) f32 -> q (n,) int8, d (n/256,) f32 scales, sums16 (n/16,) int16 sums of q: the
    Q8_K block llama.cpp's K-format dot products take (same rounding as `_q8_k_blocks`)."""
    for i in range(x.shape[0] // 256):
        _q8_k_block(x, i, q, d, sums16)


@njit(parallel=True, cache=True)
def _quantize_q8_k_tokens(x, q, d, sums16, scaled_sums32):
    for i in prange(x.shape[0] // 256):
        _q8_k_block(x, i, q, d, sums16)
        for j in range(8):
            scaled_sums32[i * 8 + j] = d[i] * np.float32(sums16[i * 16 + 2 * j] + sums16[i * 16 + 2 * j + 1])


@dataclass
class Q8KTokens:
    """T tokens of activations quantized to Q8_K for the multi-token K-format kernels, padded
    with zero tokens to `padded` (a multiple of the kernel's token tile). Flat arrays, token-major:
    q int8 (padded * cols), d f32 block scales (padded * cols/256), sums16 int16 sums per 16
    values (padded * cols/16), and scaled_sums32 (padded, cols/32) f32 = d * the sums per 32
    values, the activations' side of the Q4_K mins (a small float product, kernels.py)."""

    q: np.ndarray
    d: np.ndarray
    sums16: np.ndarray
    scaled_sums32: np.ndarray
    tokens: int
    _p16: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def padded(self) -> int:
        return self.scaled_sums32.shape[0]

    def p16(self) -> tuple[np.ndarray, np.ndarray]:
        """(q in the P16 order, the sums per 16 values times the block scale, f32) for
        x86.lowbit's panel tiles, made once per quantization: every matrix that reads this input
        shares them (`_permute_p16`)."""
        if self._p16 is None:
            qp = _aligned64(self.q.size, np.int8)
            xsf = _aligned64(self.sums16.size, np.float32)
            _permute_p16(self.q, self.d, self.sums16, qp, xsf)
            self._p16 = (qp, xsf)
        return self._p16


def _aligned64(n: int, dtype) -> np.ndarray:
    """np.empty(n, dtype) starting on a 64-byte boundary (the panel tiles' zmm loads)."""
    buf = np.empty(n * np.dtype(dtype).itemsize + 64, np.uint8)
    start = (-buf.ctypes.data) % 64
    return buf[start:start + n * np.dtype(dtype).itemsize].view(dtype)


# The P16 order of a 256-value Q8_K block, for 512-bit tiles whose four 64-byte vectors put the
# 16 values of group k (one Q3_K scale; half a 32-value sub-block of the other formats) in i32
# lane k of every vector: `vpdpbusd` then accumulates a whole block into one register, and one
# vector of the block's scales (made once for all tokens) serves it, instead of a multiply by the
# scales per 64 bytes (`vpmulld`, two uops on the one 512-bit integer-multiply port of Intel's
# cores). Byte 64c + 4k + v of the block is value 16k + 4c + v (c, v < 4; k < 16). The terms
# through the sums (IQ4_XS's +128 bias, Q3_K's -4, Q5_K's mins) take xsf = d * sums16, the
# sum of lane k's 16 values, scaled.
@njit(parallel=True, cache=True)
def _permute_p16(q, d, sums16, qp, xsf):
    for blk in prange(q.shape[0] // 256):
        o = blk * 256
        for c in range(4):
            for k in range(16):
                for v in range(4):
                    qp[o + 64 * c + 4 * k + v] = q[o + 16 * k + 4 * c + v]
        for k in range(16):
            xsf[blk * 16 + k] = d[blk] * np.float32(sums16[blk * 16 + k])


@dataclass
class Q80Tokens:
    """T tokens of activations quantized to Q8_0 for the multi-token int8 tiles, padded with
    zero tokens to `padded` (a multiple of the tile): q (padded * cols) in the dtype the tiles
    load (int8, or int16 for int8_dot's x86 rows), d (padded * cols/32) f32 block scales."""

    q: np.ndarray
    d: np.ndarray
    tokens: int
    padded: int


def quantize_q8_0_tokens(x: np.ndarray, tile: int, dtype) -> Q80Tokens:
    """x (T, cols) f32, cols a multiple of 32 -> Q80Tokens padded to a multiple of `tile`;
    blocks never straddle tokens, so all tokens quantize in one call."""
    t, cols = x.shape
    if cols % 32:
        raise ValueError(f"Q8_0 activations need a multiple of 32 values per token, got {cols}")
    tp = -(-t // tile) * tile
    q = np.zeros(tp * cols, dtype)
    d = np.zeros(tp * cols // 32, np.float32)
    quantize_q8_0(np.ascontiguousarray(x, dtype=np.float32).reshape(-1), q[:t * cols], d[:t * cols // 32])
    return Q80Tokens(q, d, t, tp)


def quantize_q8_k_tokens(x: np.ndarray, tile: int) -> Q8KTokens:
    """x (T, cols) f32, cols a multiple of 256 -> Q8KTokens padded to a multiple of `tile`."""
    t, cols = x.shape
    if cols % 256:
        raise ValueError(f"Q8_K activations need a multiple of 256 values per token, got {cols}")
    tp = -(-t // tile) * tile
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    q = np.zeros(tp * cols, np.int8)
    d = np.zeros(tp * cols // 256, np.float32)
    sums16 = np.zeros(tp * cols // 16, np.int16)
    scaled = np.zeros((tp, cols // 32), np.float32)
    _quantize_q8_k_tokens(flat, q, d, sums16, scaled.reshape(-1))
    return Q8KTokens(q, d, sums16, scaled, t)


@njit(inline="always", cache=True)
def _q8_0_scales(block):
    """quantize_row_q8_0's scales of one 32-value block: (d = amax/127 kept as f16, 127/amax)."""
    amax = np.float32(0.0)
    for j in range(block.shape[0]):
        amax = max(amax, abs(block[j]))
    inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
    return f32_to_half_to_f32(amax / np.float32(127.0)), inv


@kernel(cache=True)
def _q8_0_blocks(b, out):
    """quantize_row_q8_0 then dequantize, per 32 values, values rounded half to even (one
    pass; the numpy version cost ~70 us per decode product)."""
    for i in prange(b.shape[0]):
        d, inv = _q8_0_scales(b[i])
        for j in range(b.shape[1]):
            out[i, j] = np.rint(b[i, j] * inv) * d


@njit(cache=True)
def quantize_q8_0(x, q16, d):
    """x (n,) f32 -> q16 (n,) the int8 values (as int16, what the Q8_0 integer kernel loads) and
    d (n/32,) f32 block scales, rounded as `_q8_0_blocks` rounds them."""
    for i in range(x.shape[0] // 32):
        blk = x[i * 32:(i + 1) * 32]
        d[i], inv = _q8_0_scales(blk)
        for j in range(32):
            q16[i * 32 + j] = np.int16(np.rint(blk[j] * inv))


@njit(cache=True)
def quantize_q8_1(x, q, d, s):
    """x (n,) f32 -> q (n,) int8, d (n/32,) f32 and s (n/32,) f32: llama.cpp's quantize_row_q8_1,
    Q8_0's quants and f16 scale plus s = d * sum(q) rounded to f16, with d = amax/127 before its
    own rounding (the Q4_1 / Q5_1 products add min * s per block)."""
    for i in range(x.shape[0] // 32):
        blk = x[i * 32:(i + 1) * 32]
        amax = np.float32(0.0)
        for j in range(32):
            amax = max(amax, abs(blk[j]))
        raw = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        d[i] = f32_to_half_to_f32(raw)
        total = 0
        for j in range(32):
            v = np.int32(np.rint(blk[j] * inv))
            q[i * 32 + j] = v
            total += v
        s[i] = f32_to_half_to_f32(raw * np.float32(total))


def _blocks(x: np.ndarray, size: int, blocks) -> np.ndarray:
    b = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, size)
    out = np.empty_like(b)
    blocks(b.size, b, out)
    return out.reshape(x.shape)


def _q8_k(x: np.ndarray) -> np.ndarray:
    return _blocks(x, 256, _q8_k_blocks)


def _q8_0(x: np.ndarray) -> np.ndarray:
    return _blocks(x, 32, _q8_0_blocks)


def _bf16(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


@cache
def activation_format(weight_type: Q) -> str:
    """The rounding a product with a `weight_type` matrix applies to its activations (the
    format's `vec_dot_type`): products whose formats give the same name can share one rounded
    copy of their input. Cached: the float decode path asks once per matrix and token."""
    return get_format(weight_type).vec_dot_type


def round_activations(x: np.ndarray, weight_type: Q) -> np.ndarray:
    """x (T, in) f32 as the product with a `weight_type` matrix sees it in llama.cpp."""
    fmt = activation_format(weight_type)
    if fmt == "q8_k":
        return _q8_k(x)
    if fmt == "q8_0":
        return _q8_0(x)
    if fmt == "f16":
        return x.astype(np.float16).astype(np.float32)
    if fmt == "bf16":
        return _bf16(x)
    return x
