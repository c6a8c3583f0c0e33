"""One traits row per weight format (ggml's `type_traits_cpu`): the kernels that multiply it on
this CPU, chosen once per process from the level paths.target() reads.

    float_row(qt)  -> FloatKernels: exact decode into float32 rows (prefill: then BLAS) and the
                      float product (decode where no integer row runs)
    int8_row(qt)   -> Int8Kernels | None: the integer decode row and multi-token prefill tile on
                      this level, with how each is called, the activations they take, the weight
                      layout and whether the tile beats dequantize + BLAS at every prompt length

kernels.py (MatvecPlan, the prefill crossover) and choice.py (the names the logs print) read
these rows; no other table says which format runs which kernel. A new format registers its float
kernels in float_kernels.FLOAT or lowbit_kernels.FLOAT and, with integer kernels, one line per
level family below (docs/formats.md, "Adding a weight format").

Which file has which format's integer kernels, per level family:

| levels | formats | rows / tiles | file |
|---|---|---|---|
| x86 (avx2 .. avx512vnni) | Q4_K, Q6_K, Q8_0 | int8_dot's rows and tiles, block bodies per level | int8_kernels.py, x86/avx2.py, x86/avx512.py |
| avx2 | Q4_K, Q6_K | x4 layout (4 rows interleaved, arm/x4.py's bytes): AVX2 rows and tiles | x86/x4.py |
| x86 | Q2_K, Q3_K, Q5_K, IQ4_XS, IQ4_NL, IQ3_S, Q4_0, Q5_0, Q4_1, Q5_1 | AVX2 rows and tiles on every x86 level | lowbit_kernels.py over x86/lowbit.py |
| avx512vnni | IQ4_XS, Q3_K, Q5_K (and Q4_K, Q6_K off Zen) | 512-bit `vpdpbusd` panel tiles, every prompt length | lowbit_kernels.PANEL |
| neon-dotprod, neon-i8mm | Q4_K, Q6_K | x4 layout (4 rows interleaved): `sdot` rows, `sdot` / `smmla` tiles | arm/x4.py, arm/tiles.py |
| neon-dotprod, neon-i8mm | Q5_K, Q8_0 | `sdot` rows; tiles `sdot`, `smmla` on i8mm | int8_kernels.py over arm/neon.py, arm/tiles.py |
| neon-dotprod, neon-i8mm | Q2_K, Q3_K, IQ4_XS, IQ4_NL, IQ3_S, Q4_0, Q5_0, Q4_1, Q5_1 | `sdot` rows and tiles | arm/lowbit.py |

IQ3_XXS has float rows only.
"""
from __future__ import annotations

import platform
from dataclasses import replace
from functools import cache

import numpy as np
from gguf import GGMLQuantizationType as T

from . import paths
from .kernel_rows import FloatKernels, Int8Kernels, TileCall
from .paths import Level

__all__ = ["FloatKernels", "Int8Kernels", "TileCall", "float_row", "generic_int8_row", "int8_row"]


# Where the K-format tiles beat dequantize + fp32 BLAS at every prompt length: AVX-512 on AMD
# (Zen 4/5 run 512-bit integer multiplies on two pipes). Measured, 0.8B Q4_K_M, 2 threads:
# Zen 5, 3584x1024 Q4_K at T = 512: tile 264-278 GMAC/s vs dequantize + BLAS 216-231, whole
# 512-token forward 1.24-1.27 s vs 1.66-1.79 s. Emerald Rapids (one 512-bit integer-multiply
# port), whole 512-token forwards, two copies of the model in one process alternating, best of
# 3-4, two runs: the x86/avx512.py VNNI tile 69.2 and 95.4 tok/s vs dequantize + OpenBLAS 101.1 and
# 93.4 (a loss, then a tie); the AVX2 tile (x86/avx2.py) lost per matrix, 42-45 vs 59-70 GMAC/s.
#
# The low-bit formats' 256-bit tiles (x86/lowbit.py) against dequantize + BLAS at 512 tokens,
# whole forwards of the 0.8B IQ4_XS file, 2 threads, Zen 5, separate processes alternating, best
# of 2 each, on the shared host: at load average 15-17 tiles 20.73 and 13.90 tok/s, dequantize +
# BLAS 13.63 and 12.81; at load average 3.4-5 tiles 85.48 and 70.27, dequantize + BLAS 46.67 and
# 47.0. Their dequantization is costlier than Q4_K's (lookups, lattices), which a prompt pays per
# matrix. On AVX-512 VNNI the panel tiles (lowbit_kernels.PANEL) take every length instead,
# Intel's and AMD's; elsewhere on Intel the Q4_K rule (kernels.SHORT_PREFILL tokens at most).
#
# arm64 with dot products: the `sdot` tiles at every length. Not measured (no Graviton here):
# Arm's Neoverse N1 Software Optimization Guide (its ASIMD integer and floating-point instruction
# tables) gives SDOT (16 int8 MACs) and FMLA .4s (4 f32 MACs) the same throughput of 2 per cycle,
# so the tile does 4x the multiplies per instruction of fp32 SGEMM and skips the f32
# dequantization of every matrix; llama.cpp runs the same `sdot` products for every prompt length
# there. `make bench-arm64` is the emulated cost model that compares them.
def _x86_tiles_win_at_every_length(t: paths.Target) -> bool:
    return t.level.is_avx512 and t.cpu_name.startswith("znver")


def _k_rows(level: Level, every_length: bool) -> dict[T, Int8Kernels]:
    """Q4_K, Q6_K and Q8_0 in int8_dot's generic IR (the x86 levels' block bodies)."""
    from .int8_dot import KNOBS
    from .int8_kernels import mm_k_q8k, mm_q8_0_q8, mv_k_q8k, mv_q8_0_q8

    name = f"{level}-int8"
    return {
        T.Q4_K: Int8Kernels(mv_k_q8k, mm_k_q8k, TileCall.Q8K_MINS, level, name, (KNOBS, False), (KNOBS, False),
                            mins_block=144, every_length=every_length),
        T.Q6_K: Int8Kernels(mv_k_q8k, mm_k_q8k, TileCall.Q8K, level, name, (KNOBS, True), (KNOBS, True),
                            every_length=every_length),
        T.Q8_0: Int8Kernels(mv_q8_0_q8, mm_q8_0_q8, TileCall.Q8_0, level, name, q8_0=level.q8_0_dtype),
    }


def _lowbit_row(qt: T, row, tile, level: Level, name: str, every_length: bool) -> Int8Kernels:
    """A low-bit format's row and tile (x86/lowbit.py's or arm/lowbit.py's), called with the
    activations the format takes on both: Q8_0 (IQ4_NL, Q4_0, Q5_0), Q8_1 (Q4_1, Q5_1) or Q8_K."""
    from . import lowbit_kernels as LB

    q8_1 = qt in LB.Q8_1_ACTIVATIONS
    q8_0 = np.int8 if qt in LB.Q8_0_ACTIVATIONS or q8_1 else None
    call = TileCall.Q8_1 if q8_1 else TileCall.Q8_0 if q8_0 else TileCall.Q8K
    return Int8Kernels(row, tile, call, level, name, q8_0=q8_0, q8_1=q8_1, every_length=every_length)


def _x86_rows(t: paths.Target) -> dict[T, Int8Kernels]:
    from . import lowbit_kernels as LB

    wide = _x86_tiles_win_at_every_length(t)
    rows = _k_rows(t.level, wide)
    # the low-bit formats' rows and tiles: AVX2 instructions on every x86 level (decode is bound
    # by the weight stream, not the multiplies), named avx2-int8
    for qt, row in LB.MATVEC_INT8.items():
        rows[qt] = _lowbit_row(qt, row, LB.MULTI_TOKEN_INT8[qt], Level.AVX2, "avx2-int8", wide)
    if t.level == Level.AVX2:
        rows.update(_k_x4_avx2())
    if t.level == Level.AVX512VNNI:
        panels = set(LB.PANEL) - ({T.Q4_K, T.Q6_K} if wide else set())  # Zen keeps x86/avx512.py's K tiles
        for qt in panels:
            rows[qt] = replace(rows[qt], tile=LB.PANEL[qt], tile_call=TileCall.PANEL, tile_args=(), mins_block=0,
                               level=Level.AVX512VNNI, every_length=True)
    return rows


# Q4_K and Q6_K on the AVX2 level: rows and tiles over the x4 layout (x86/x4.py: 4 rows interleaved, one
# `vpmaddwd` lane per row), at every prompt length. Measured on Zen 3 (AVX2 only), 2 threads,
# 0.8B Q4_K_M, both rows in one process alternating, 6 rounds, Q4_K alone on x4: 512-token
# forward best 166.1 vs 136.6 tok/s (median of per-round ratios 1.20), decode 30.5 vs 33.2
# ms/token (Q6_K too: docs/cpus.md); the Q4_K tile alone at
# 3584x1024, 512 tokens, 105-150 GMAC/s against dequantize + OpenBLAS 64-81 (the host is noisy).
# The other x86 levels keep int8_dot's rows until measured there (AVX-VNNI's `vpdpbusd`,
# AVX-512's 512-bit tiles).
def _k_x4_avx2() -> dict[T, Int8Kernels]:
    from .x86.x4 import mm_k_x4_avx2, mm_q8_0_x4_avx2, mv_k_x4_avx2, mv_q8_0_x4_avx2

    rows = {qt: Int8Kernels(mv_k_x4_avx2, mm_k_x4_avx2, TileCall.X4_SUMS, Level.AVX2, "avx2-int8x4", (q6,), (q6,),
                            mins_block=0 if q6 else 144, x4=True, every_length=True)
            for qt, q6 in ((T.Q4_K, False), (T.Q6_K, True))}
    rows[T.Q8_0] = Int8Kernels(mv_q8_0_x4_avx2, mm_q8_0_x4_avx2, TileCall.X4, Level.AVX2, "avx2-int8x4",
                               q8_0=np.int8, x4=True, every_length=True)
    return rows


def _arm_rows(level: Level) -> dict[T, Int8Kernels]:
    from .arm import lowbit as AL
    from .arm.tiles import mm_k_smmla, mm_k_x4, mm_q8_0_smmla, mv_k_x4
    from .int8_dot import KNOBS
    from .int8_kernels import mm_q5_k_q8k, mm_q8_0_q8, mv_q5_k_q8k, mv_q8_0_q8

    i8mm = level == Level.NEON_I8MM
    # `smmla` tiles on i8mm for the formats arm/neon.py has row pairs for; `sdot` ones elsewhere
    tiles = Level.NEON_I8MM if i8mm else Level.NEON_DOTPROD
    rows = {}
    # Q4_K and Q6_K: the x4 `sdot` tiles on both levels (arm/x4.py: they beat its `smmla` ones)
    for qt, q6 in ((T.Q4_K, False), (T.Q6_K, True)):
        rows[qt] = Int8Kernels(mv_k_x4, mm_k_x4, TileCall.X4, Level.NEON_DOTPROD,
                               "neon-dotprod-int8x4", (q6,), (q6,), mins_block=0 if q6 else 144, x4=True,
                               every_length=True)
    rows[T.Q5_K] = Int8Kernels(mv_q5_k_q8k, mm_k_smmla if i8mm else mm_q5_k_q8k, TileCall.Q8K_MINS, tiles,
                               "neon-dotprod-int8", (KNOBS, False), (KNOBS, 2) if i8mm else (KNOBS,),
                               mins_block=176, every_length=True)
    rows[T.Q8_0] = Int8Kernels(mv_q8_0_q8, mm_q8_0_smmla if i8mm else mm_q8_0_q8, TileCall.Q8_0, tiles,
                               "neon-dotprod-int8", q8_0=level.q8_0_dtype, every_length=True)
    # the low-bit formats: `sdot` rows and tiles on both levels (no `smmla` tile for them yet)
    for qt, row in AL.MATVEC_INT8.items():
        rows[qt] = _lowbit_row(qt, row, AL.MULTI_TOKEN_INT8[qt], Level.NEON_DOTPROD, "neon-dotprod-int8", True)
    return rows


@cache
def _int8_rows() -> dict[T, Int8Kernels]:
    t = paths.target()
    if t.level.is_arm:
        return _arm_rows(t.level)
    if t.level.is_x86_int8:
        return _x86_rows(t)
    return {}


@cache
def _float_rows() -> dict[T, FloatKernels]:
    from . import float_kernels, lowbit_kernels

    return {**float_kernels.FLOAT, **lowbit_kernels.FLOAT}  # one row per format in each file


def float_row(qtype) -> FloatKernels:
    """`qtype`'s float kernels (every supported format has them)."""
    return _float_rows()[T(qtype)]


def int8_row(qtype) -> Int8Kernels | None:
    """`qtype`'s integer kernels on this CPU's level, or None (float rows, dequantize + BLAS)."""
    return _int8_rows().get(T(qtype))


# Where int8_dot.py's generic IR runs besides the int8 levels (the x86 ones; arm64 with dot
# products runs arm/'s own kernels): tests add a machine here to run the portable IR elsewhere
# (under emulation), on the portable level.
INT8_MACHINES = {"x86_64", "AMD64"}


def generic_int8_row(qtype) -> Int8Kernels | None:
    """The generic IR's rows of Q4_K, Q6_K and Q8_0 on a machine INT8_MACHINES lists whose level
    has no integer kernels of its own (a test hook: the logs still name the float path)."""
    m = platform.machine()
    if m not in INT8_MACHINES or m in paths.X86 or paths.target().level.is_arm:
        return None
    return _k_rows(paths.target().level, False).get(T(qtype))
