"""The dispatcher of the matrix products every weight format in :mod:`engine.quant.formats`
needs, over the kernel files that each do one job:

* ``dequantize_rows_into(qtype, raw, out)`` -- prefill: decode a whole matrix into a reused
  float32 buffer, then BLAS does ``X @ W.T`` (float_kernels.py, lowbit_kernels.py: exact,
  bit-identical to ``gguf.quants``).
* ``MatvecPlan`` / ``matvec(qtype, raw, x, out)`` -- decode: ``out = W @ round_activations(x)``
  reading each weight byte once. Where the format's traits row has them (the x86 levels, arm64
  with dot products) the K formats, Q8_0 and the low-bit formats run in integer arithmetic
  against Q8_K / Q8_0 activations, as llama.cpp does; everything else runs the float products.
* ``MatvecPlan.tokens`` -- a prefill's product in the multi-token int8 tiles, where
  `int8_prefill_wins` says they beat dequantize + BLAS.

Which kernel runs each format is its traits row (traits.py: `float_row`, `int8_row`), chosen once
for the level engine/quant/paths.py reads: this file names no format's kernels. The float
kernels are portable LLVM, the same code on arm64 Graviton and x86_64; the integer kernels are
per ISA (engine/quant/x86/, engine/quant/arm/).

``bench_matvec(qtype, rows, cols, reps)`` returns weight-bytes GB/s for the benchmark script.
"""

from __future__ import annotations

import platform
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from engine.jit import SERIAL_BELOW, serial_twin

from .activations import (Q8KTokens, Q80Tokens, quantize_q8_0, quantize_q8_0_tokens, quantize_q8_1, quantize_q8_k,
                          quantize_q8_k_tokens, round_activations)
from .arm.tiles import q4_k_mins_x4
from .arm.x4 import release_pages, repack_x4
from .float_kernels import prepare_scales
from .formats import get_format, quantize, row_bytes
from .int8_dot import TILE, WIDE_TILE
from .int8_kernels import FUSED_MINS_TOKENS, mm_k_q8k, mm_q4_k_q8k_few, q4_k_mins, q4_k_mins_product
from .kernel_rows import Int8Kernels, TileCall
from .traits import float_row, generic_int8_row, int8_row
from .x86 import avx2, avx512  # noqa: F401 (they register their block bodies with int8_dot)

_VIEW = {T.F32: np.float32, T.F16: np.uint16, T.BF16: np.uint16}  # the float formats' element views


def prepare(qtype, raw: np.ndarray, rows: int, cols: int):
    """Load-time preparation for :func:`matvec` (decoded per-block scales), or None when the
    format's kernel reads everything from the raw bytes. Pass the result as ``prepared``."""
    qt, w = _weights(qtype, raw, rows, cols)
    return prepare_scales(qt, w, rows, cols)


# ----------------------------------------------------------------------------- dispatch

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
    float_row(qt).dequant(w, out)


def _int8(qtype) -> Int8Kernels | None:
    """`qtype`'s integer kernels here: its traits row, or the generic IR's on a machine
    traits.INT8_MACHINES adds (tests under emulation)."""
    qt = get_format(qtype).qtype
    return int8_row(qt) or generic_int8_row(qt)


def has_int8_kernels(qtype) -> bool:
    """Whether `qtype` matrix-vector products run the integer kernels here (MatvecPlan.int8):
    the x86 levels and arm64 with dot products (traits.int8_row), or the generic IR on another
    machine its tests list in traits.INT8_MACHINES."""
    return _int8(qtype) is not None


def has_multi_token_kernel(qtype) -> bool:
    """Whether `MatvecPlan.tokens` (several tokens per weight block) runs for `qtype` here: every
    format with integer rows has a tile."""
    return has_int8_kernels(qtype)


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


def has_int8_prefill(qtype) -> bool:
    """Whether a batched prefill of any length multiplies `qtype` in the multi-token int8 kernel
    rather than dequantize + fp32 BLAS (its traits row's `every_length`: traits.py has the
    measurements)."""
    k = _int8(qtype)
    return k is not None and k.every_length


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
        k = self.k = _int8(qt)
        self.int8 = k is not None
        self.x4 = k is not None and k.x4
        self.prepared = None
        if k is not None:
            self.kernel = serial_twin(k.row) if small else k.row
            if k.q8_0 is not None:
                self.xq: np.ndarray = np.empty(cols, k.q8_0)
                self.xd = np.empty(cols // 32, np.float32)
                self.xs1 = np.empty(cols // 32 if k.q8_1 else 0, np.float32)
            else:
                self.xq = np.empty(cols, np.int8)
                self.xd = np.empty(cols // 256, np.float32)
                self.xs16 = np.empty(cols // 16, np.int16)
            self.args: tuple = k.row_args
            if k.x4:
                # arm64: the x4 layout replaces the row-major bytes (this plan holds only w4;
                # the file's pages of the matrix are given back, arm/x4.py release_pages)
                raw_rows = self.w
                self.w = repack_x4(qt, raw_rows)
                release_pages(raw_rows)
                del raw_rows
                self.args = (rows, *k.row_args)
        else:
            f = float_row(qt)
            self.kernel = serial_twin(f.matvec) if small else f.matvec
            self.prepared = prepare_scales(qt, self.w, rows, cols) if f.prepared else None
            self.args = f.args

    def tokens(self, x: np.ndarray) -> np.ndarray:
        """``x @ W.T`` for T tokens (x (T, cols) f32) with the multi-token int8 kernel: each weight
        block is unpacked once per TILE (K formats: WIDE_TILE) tokens. Only where
        `has_multi_token_kernel`."""
        k = self.k
        if k is None:
            raise ValueError(f"{self.qtype.name}: no multi-token integer kernel on {platform.machine()}")
        if k.q8_0 is None:
            return self.tokens_q8k(quantize_q8_k_tokens(x, WIDE_TILE))
        if not k.q8_1:
            return self.tokens_q8_0(quantize_q8_0_tokens(x, TILE, k.q8_0))
        t = x.shape[0]
        tp = -(-t // TILE) * TILE
        cols = self.cols
        flat = np.ascontiguousarray(x).reshape(-1)
        out = np.empty((tp, self.rows), np.float32)
        # padding tokens stay zero (their results are dropped); blocks never straddle tokens
        # (cols is a multiple of the block), so all tokens quantize in one call
        xq = np.zeros(tp * cols, k.q8_0)
        xd = np.zeros(tp * cols // 32, np.float32)
        xs = np.zeros(tp * cols // 32, np.float32)
        quantize_q8_1(flat, xq[:t * cols], xd[:t * cols // 32], xs[:t * cols // 32])
        k.tile(self.w, xq, xd, xs, out)
        return out[:t]

    def q8_0_dtype(self):
        """The Q8_0 activations' dtype this plan's tiles take (for `tokens_q8_0`), or None."""
        k = self.k
        return k.q8_0 if k is not None and not k.q8_1 else None

    def tokens_q8_0(self, a: Q80Tokens) -> np.ndarray:
        """`tokens` for a format with Q8_0 activations, already quantized (quantize_q8_0_tokens
        with TILE and `q8_0_dtype()`): the projections that read one input share them."""
        k = self.k
        if k is None or k.q8_0 is None or k.q8_1:
            raise ValueError(f"{self.qtype.name}: no multi-token integer kernel against Q8_0 activations here")
        if a.q.dtype != k.q8_0 or a.padded % TILE or a.q.size != a.padded * self.cols:
            raise ValueError(f"activations of {a.q.size // max(a.padded, 1)} {a.q.dtype} values per token "
                             f"padded to {a.padded} tokens; this matrix takes {self.cols} {np.dtype(k.q8_0)} "
                             f"per token, padded to a multiple of {TILE}")
        out = np.empty((a.padded, self.rows), np.float32)
        if k.tile_call == TileCall.X4:
            k.tile(self.w, a.q, a.d, out.reshape(-1), self.rows, *k.tile_args)
        else:
            k.tile(self.w, a.q, a.d, out)
        return out[:a.tokens]

    def tokens_q8k(self, a: Q8KTokens) -> np.ndarray:
        """`tokens` for a Q8_K format from activations already quantized (quantize_q8_k_tokens
        with WIDE_TILE): the projections that read one input share its quantization."""
        if a.padded % WIDE_TILE or a.q.size != a.padded * self.cols:
            raise ValueError(f"activations of {a.q.size // max(a.padded, 1)} values per token padded to "
                             f"{a.padded} tokens; this matrix takes {self.cols} per token, padded to a "
                             f"multiple of {WIDE_TILE}")
        k = self.k
        if k is None or k.q8_0 is not None:
            raise ValueError(f"{self.qtype.name}: no multi-token integer kernel against Q8_K activations here")
        out = np.empty((a.padded, self.rows), np.float32)
        if k.tile_call == TileCall.PANEL:
            qp, xsf = a.p16()
            k.tile(self.w, qp, a.d, xsf, out)
            return out[:a.tokens]
        if k.tile is mm_k_q8k and k.mins_block and a.padded <= FUSED_MINS_TOKENS:
            # x86's Q4_K, a few tokens: the mins' product in the tile's own launch
            mm_q4_k_q8k_few(self.w, a.q, a.d, a.sums16, a.scaled_sums32, out, k.tile_args[0], k.mins_block)
            return out[:a.tokens]
        if k.mins_block and not k.x4 and a.padded <= FUSED_MINS_TOKENS:
            q4_k_mins_product(self.w, self.cols // 256, a.scaled_sums32, out, k.mins_block)
        elif k.mins_block:
            # sum over blocks b and runs j of (dmin_b m_bj) (d_b^x sums_bj^x): 1/32 of the
            # product's multiply-adds, done by BLAS into `out`, which the tile subtracts from
            mins = np.empty((self.rows, self.cols // 32), np.float32)
            if k.x4:
                q4_k_mins_x4(self.w, self.cols // 256, mins)
            else:
                q4_k_mins(self.w, self.cols // 256, mins, k.mins_block)
            np.matmul(a.scaled_sums32, mins.T, out=out)
        if k.tile_call == TileCall.X4:
            k.tile(self.w, a.q, a.d, out.reshape(-1), self.rows, *k.tile_args)
        elif k.tile_call == TileCall.X4_SUMS:
            k.tile(self.w, a.q, a.d, a.sums16, out.reshape(-1), self.rows, *k.tile_args)
        else:
            k.tile(self.w, a.q, a.d, a.sums16, out, *k.tile_args)
        return out[:a.tokens]

    def __call__(self, x: np.ndarray, out: np.ndarray) -> None:
        k = self.k
        if k is not None and k.q8_1:
            quantize_q8_1(x, self.xq, self.xd, self.xs1)
            self.kernel(self.w, self.xq, self.xd, self.xs1, out)
            return
        if k is not None and k.q8_0 is not None:
            quantize_q8_0(x, self.xq, self.xd)
            self.kernel(self.w, self.xq, self.xd, out, *self.args)
            return
        if k is not None:
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
