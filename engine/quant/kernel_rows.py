"""The records a kernel file registers a weight format with (traits.py assembles them per level):
`FloatKernels` (exact decode, float product), `Int8Kernels` (integer decode row and prefill
tile) and `TileCall` (how a tile is called). A leaf: it imports no kernel file.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .paths import Level

__all__ = ["FloatKernels", "Int8Kernels", "TileCall"]


@dataclass(frozen=True)
class FloatKernels:
    """A format's float kernels: `dequant(w, out)` exact (bit-identical to gguf.quants) and
    `matvec(w, [prepared,] x, out, *args)`, with `x` rounded as llama.cpp rounds it."""

    dequant: Callable
    matvec: Callable
    args: tuple = ()        # run-time trip counts (float_kernels.py says why they are not constants)
    prepared: bool = False  # the product takes per-block scales decoded at load (float_kernels.prepare_scales)


class TileCall(StrEnum):
    """How a multi-token kernel is called (kernels.MatvecPlan.tokens / tokens_q8k)."""

    Q8K = "q8k"              # tile(w, q, d, sums16, out, *tile_args): offsets and mins inside
    Q8K_MINS = "q8k-mins"    # the same, after BLAS put the mins' product in `out` (Q4_K, Q5_K)
    PANEL = "panel"          # tile(w, qp, d, xsf, out): activations in the P16 order (Q8KTokens.p16)
    X4 = "x4"                # tile(w4, q, d, out.reshape(-1), rows, *tile_args) over arm/x4.py's layout
    X4_SUMS = "x4-sums"      # tile(w4, q, d, sums16, out.reshape(-1), rows, *tile_args): x86/x4.py's
    Q8_0 = "q8_0"            # tile(w, xq, xd, out) against Q8_0 activations
    Q8_1 = "q8_1"            # tile(w, xq, xd, xs, out) against Q8_1 ones (xs: f16(d * sum q) per block)


@dataclass(frozen=True)
class Int8Kernels:
    """A format's integer kernels on this level. The row is `row(w, xq, xd, xs16, out, *row_args)`
    against Q8_K activations, or `row(w, xq, xd, out)` against Q8_0 ones (`q8_0` their dtype);
    in the x4 layout the plan's row count goes before `row_args`."""

    row: Callable
    tile: Callable
    tile_call: TileCall
    level: Level                 # whose instructions the tile runs (choice.prefill_path names it)
    decode: str                  # the decode row's name in the logs ("avx2-int8", "neon-dotprod-int8x4")
    row_args: tuple = ()
    tile_args: tuple = ()
    q8_0: type | None = None     # Q8_0 activations' dtype (x86's Q8_0 rows take int16); None: Q8_K
    q8_1: bool = False           # Q8_1 activations: Q8_0's (int8) and each block's s, row(w, xq, xd, xs, out)
    mins_block: int = 0          # Q4_K 144 / Q5_K 176: BLAS does the mins' product first (Q8K_MINS, X4)
    x4: bool = False             # weights repacked 4 rows interleaved (arm/x4.repack_x4)
    every_length: bool = False   # the tile beats dequantize + BLAS at every prompt length (kernels.py)
