"""The dispatcher of the matrix products every weight format in :mod:`engine.quant.formats`
needs, over the kernel files that each do one job:

* ``dequantize_rows_into(qtype, raw, out)`` -- prefill: decode a whole matrix into a reused
  float32 buffer, then BLAS does ``X @ W.T`` (float_kernels.py, lowbit_kernels.py: exact,
  bit-identical to ``gguf.quants``).
* ``MatvecPlan`` / ``matvec(qtype, raw, x, out)`` -- decode: ``out = W @ round_activations(x)``
  reading each weight byte once. Where paths.has_int8 says so (the x86 levels, arm64 with dot
  products) the K formats, Q8_0 and the low-bit formats run in integer arithmetic against Q8_K /
  Q8_0 activations, as llama.cpp does; everything else runs the float products.
* ``MatvecPlan.tokens`` -- a prefill's product in the multi-token int8 tiles, where
  `int8_prefill_wins` says they beat dequantize + BLAS.

The float kernels (float_kernels.py) are portable LLVM, the same code on arm64 Graviton and
x86_64. The integer kernels are per ISA: int8_kernels.py over int8_dot.py's generic IR (block
bodies from x86/avx2.py / x86/avx512.py) and x86/lowbit.py on the x86 levels, arm/tiles.py over
arm/neon.py / arm/lowbit.py (`sdot`, `smmla`) on arm64 with dot products, chosen by the level
engine/quant/paths.py reads once.

``bench_matvec(qtype, rows, cols, reps)`` returns weight-bytes GB/s for the benchmark script.
"""

from __future__ import annotations

import platform
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from engine.jit import SERIAL_BELOW, serial_twin

from .activations import Q8KTokens, quantize_q8_0, quantize_q8_k, quantize_q8_k_tokens, round_activations
from . import paths
from .arm.x4 import release_pages, repack_x4
from .x86 import avx2, avx512  # noqa: F401 (they register their block bodies with int8_dot)
from .arm.tiles import mm_k_smmla, mm_k_x4, mm_k_x4_smmla, mm_q8_0_smmla, mv_k_x4, q4_k_mins_x4
from .float_kernels import DEQUANT as _FLOAT_DEQUANT, MATVEC as _FLOAT_MATVEC, MV_ARGS, PREPARED, prepare_scales
from .formats import get_format, quantize, row_bytes
from .int8_dot import KNOBS, TILE, WIDE_TILE
from .int8_kernels import mm_k_q8k, mm_q5_k_q8k, mm_q8_0_q8, mv_k_q8k, mv_q5_k_q8k, mv_q8_0_q8, q4_k_mins
from .lowbit_kernels import DEQUANT as _LOWBIT_DEQUANT, MATVEC as _LOWBIT_MATVEC
from .lowbit_kernels import MATVEC_INT8 as _LOWBIT_MATVEC_INT8, MULTI_TOKEN_INT8 as _LOWBIT_MM
from .lowbit_kernels import PANEL as _LOWBIT_PANEL


def prepare(qtype, raw: np.ndarray, rows: int, cols: int):
    """Load-time preparation for :func:`matvec` (decoded per-block scales), or None when the
    format's kernel reads everything from the raw bytes. Pass the result as ``prepared``."""
    qt, w = _weights(qtype, raw, rows, cols)
    return prepare_scales(qt, w, rows, cols)


# ----------------------------------------------------------------------------- dispatch

# The smaller downloads' formats (Q2_K, Q3_K, IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS): engine/quant/lowbit_kernels.py,
# arm64's `sdot` rows and tiles for them instead (arm/lowbit.py)
if paths.target().level.is_arm:
    from .arm.lowbit import MATVEC_INT8 as _LOWBIT_MATVEC_INT8, MULTI_TOKEN_INT8 as _LOWBIT_MM

_DEQUANT = {**_FLOAT_DEQUANT, **_LOWBIT_DEQUANT}
_MATVEC = {**_FLOAT_MATVEC, **_LOWBIT_MATVEC}
_MATVEC_SERIAL = {qt: serial_twin(k) for qt, k in _MATVEC.items()}
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
_MATVEC_INT8 = {T.Q4_K: mv_k_q8k, T.Q6_K: mv_k_q8k, T.Q8_0: mv_q8_0_q8, T.Q5_K: mv_q5_k_q8k,
                **_LOWBIT_MATVEC_INT8}  # x86/lowbit.py's rows: (w, xq, xd, xs16, out), IQ4_NL (w, xq, xd, out)
_KNOBBED = {T.Q4_K, T.Q6_K, T.Q5_K} - set(_LOWBIT_MATVEC_INT8)  # int8_dot's rows take (..., out, KNOBS, q6)
_Q8_0_INT8 = {T.Q8_0, T.IQ4_NL}  # integer rows against Q8_0 activations
_MATVEC_INT8_SERIAL = {qt: serial_twin(k) for qt, k in _MATVEC_INT8.items()}
_MULTI_TOKEN = {T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, *_LOWBIT_MM}  # formats with a multi-token kernel (_mm_*)
_MV_K_X4_SERIAL = serial_twin(mv_k_x4)
_PORTABLE_INT8 = {T.Q4_K, T.Q6_K, T.Q8_0}  # int8_dot.py's generic IR (Q5_K: arm/neon.py only)


# Where int8_dot.py's generic IR runs besides the levels paths.has_int8 names (the x86 levels;
# arm64 with dot products runs arm/neon.py's own kernels): tests add a machine here to run the
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
# 3-4, two runs: the x86.avx512 VNNI tile 69.2 and 95.4 tok/s vs dequantize + OpenBLAS 101.1 and
# 93.4 (a loss, then a tie); the AVX2 tile (x86.avx2) lost per matrix, 42-45 vs 59-70 GMAC/s.
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


# The low-bit formats' 256-bit tiles (x86/lowbit.py) against dequantize + BLAS at 512 tokens,
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
                # IQ4_NL's rows (x86/lowbit.py) take the int8 values; Q8_0's x86 row int16
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
                # the file's pages of the matrix are given back, arm/x4.py release_pages)
                raw_rows = self.w
                self.w = repack_x4(qt, raw_rows)
                release_pages(raw_rows)
                del raw_rows
                self.kernel = _MV_K_X4_SERIAL if small else mv_k_x4
                self.args = (rows, qt == T.Q6_K)
        else:
            self.kernel = (_MATVEC_SERIAL if small else _MATVEC)[qt]
            self.prepared = prepare(qt, self.w, rows, cols) if qt in PREPARED else None
            self.args = MV_ARGS.get(qt, ())

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
            (mm_q8_0_smmla if paths.tile_level(T.Q8_0) == paths.Level.NEON_I8MM else mm_q8_0_q8)(self.w, xq16, xd, out)
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
        if self.qtype in _LOWBIT_PANEL:  # x86/lowbit.py's panel tiles (AVX-512 VNNI)
            qp, xsf = a.p16()
            _LOWBIT_PANEL[self.qtype](self.w, qp, a.d, xsf, out)
            return out[:a.tokens]
        if self.qtype in _LOWBIT_MM:  # x86/lowbit.py's tiles: offsets and mins inside
            _LOWBIT_MM[self.qtype](self.w, a.q, a.d, a.sums16, out)
            return out[:a.tokens]
        q6 = self.qtype == T.Q6_K
        if not q6:
            # sum over blocks b and runs j of (dmin_b m_bj) (d_b^x sums_bj^x): 1/32 of the
            # product's multiply-adds, done by BLAS into `out`, which the kernel subtracts from
            mins = np.empty((self.rows, self.cols // 32), np.float32)
            q4_k_mins(self.w, self.cols // 256, mins, 176 if self.qtype == T.Q5_K else 144)
            np.matmul(a.scaled_sums32, mins.T, out=out)
        if paths.tile_level(self.qtype) == paths.Level.NEON_I8MM:
            kind = {T.Q4_K: 0, T.Q6_K: 1, T.Q5_K: 2}[self.qtype]
            mm_k_smmla(self.w, a.q, a.d, a.sums16, out, KNOBS, kind)
        elif self.qtype == T.Q5_K:
            mm_q5_k_q8k(self.w, a.q, a.d, a.sums16, out, KNOBS)
        else:
            mm_k_q8k(self.w, a.q, a.d, a.sums16, out, KNOBS, q6)
        return out[:a.tokens]

    def _tokens_x4(self, a: Q8KTokens, out: np.ndarray) -> np.ndarray:
        q6 = self.qtype == T.Q6_K
        if not q6:  # the mins' product, as in tokens_q8k
            mins = np.empty((self.rows, self.cols // 32), np.float32)
            q4_k_mins_x4(self.w, self.cols // 256, mins)
            np.matmul(a.scaled_sums32, mins.T, out=out)
        tile = mm_k_x4_smmla if paths.tile_level(self.qtype) == paths.Level.NEON_I8MM else mm_k_x4
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
