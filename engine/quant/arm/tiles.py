"""arm64's matrix kernels over arm/neon.py's intrinsics: the `smmla` tiles (two rows a tile,
the i8mm level) of the K formats and Q8_0, and the x4 layout's rows and tiles (4 rows
interleaved, one `sdot` lane per row). Their formats' traits rows (traits.py) name them on the arm levels.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .neon import q4_k_row_pair_smmla, q5_k_row_pair_smmla, q6_k_row_pair_smmla, q8_0_row_pair_smmla
from .x4 import (X4_SDOT_TILE, q4_k_x4_dot, q4_k_x4_tile, q4_k_x4_tile8, q6_k_x4_dot, q6_k_x4_tile,
                 q6_k_x4_tile8, x4_tile_dst, x4_tile_tail)
from ..int8_dot import TILE, WIDE_TILE
from ..int8_kernels import ROW_CHUNK
from ..njit_base import MV as _MV
from ..njit_base import f16_at as _f16_at

__all__ = ["mm_k_smmla", "mm_k_x4", "mm_q8_0_smmla", "mv_k_x4", "q4_k_mins_x4"]

_F32 = np.float32


@njit(**_MV)
def mm_k_smmla(w, xq, xd, xs16, out, knobs, kind):
    # mm_k_q8k / mm_q5_k_q8k on arm64's i8mm level (arm/neon.py): two rows per `smmla` tile;
    # kind 0 Q4_K, 1 Q6_K, 2 Q5_K; Q4_K/Q5_K: out holds the mins' product on entry
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        res = np.empty(2 * WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * ROW_CHUNK, min(rows, (c + 1) * ROW_CHUNK), 2):
                r2 = min(r + 1, rows - 1)
                if kind == 1:
                    q6_k_row_pair_smmla(w[r], w[r2], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                        xs16, t0 * cols // 16, cols // 16, res, knobs)
                elif kind == 2:
                    q5_k_row_pair_smmla(w[r], w[r2], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                        xs16, t0 * cols // 16, cols // 16, res, knobs)
                else:
                    q4_k_row_pair_smmla(w[r], w[r2], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                        xs16, t0 * cols // 16, cols // 16, res, knobs)
                for t in range(WIDE_TILE):
                    if kind == 1:
                        out[t0 + t, r] = res[t]
                    else:
                        out[t0 + t, r] = res[t] - out[t0 + t, r]
                    if r2 > r:
                        if kind == 1:
                            out[t0 + t, r2] = res[WIDE_TILE + t]
                        else:
                            out[t0 + t, r2] = res[WIDE_TILE + t] - out[t0 + t, r2]


@njit(**_MV)
def mm_q8_0_smmla(w, xq, xd, out):
    # mm_q8_0_q8 on arm64's i8mm level (arm/neon.py): two rows per `smmla` tile (an odd last
    # row is paired with itself and its twin result dropped); ROW_CHUNK is even
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 32
    rows = w.shape[0]
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        res = np.empty(2 * TILE, np.float32)
        for t0 in range(0, tp, TILE):
            for r in range(c * ROW_CHUNK, min(rows, (c + 1) * ROW_CHUNK), 2):
                r2 = min(r + 1, rows - 1)
                q8_0_row_pair_smmla(w[r], w[r2], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, res)
                for t in range(TILE):
                    out[t0 + t, r] = res[t]
                    if r2 > r:
                        out[t0 + t, r2] = res[TILE + t]


# arm64's Q4_K and Q6_K in the x4 layout (arm.x4.repack_x4: 4 rows interleaved, one `sdot` lane
# per row): w4 (ceil(rows / 4), blocks * X4_BLOCK). A group of 4 rows is one intrinsic call; the
# last, partial group goes through a 4-row scratch. q6: Q6_K, else Q4_K.
@njit(**_MV)
def mv_k_x4(w4, xq, xd, xs16, out, rows, q6):
    nb = xd.shape[0]
    full = rows // 4
    for g in prange(w4.shape[0]):
        if g < full:
            if q6:
                q6_k_x4_dot(w4[g], nb, xq, xd, xs16, out, 4 * g)
            else:
                q4_k_x4_dot(w4[g], nb, xq, xd, xs16, out, 4 * g)
        else:
            tmp = np.empty(4, np.float32)
            if q6:
                q6_k_x4_dot(w4[g], nb, xq, xd, xs16, tmp, 0)
            else:
                q4_k_x4_dot(w4[g], nb, xq, xd, xs16, tmp, 0)
            for r in range(rows - 4 * g):
                out[4 * g + r] = tmp[r]


_X4_CHUNK = ROW_CHUNK // 4  # groups per chunk: the tile's activations stay in L1 across them


@njit(**_MV)
def mm_k_x4(w4, xq, xd, out, rows, q6):
    # `sdot` tiles of x4 groups (N1); out (Tp * rows) flat, Q4_K: holds the mins' product on
    # entry, which the tiles subtract
    tp = out.shape[0] // rows
    nb = xd.shape[0] // tp
    cols = nb * 256
    groups = w4.shape[0]
    for c in prange((groups + _X4_CHUNK - 1) // _X4_CHUNK):
        tmp = np.empty(4 * X4_SDOT_TILE, np.float32)
        for t0 in range(0, tp, X4_SDOT_TILE):
            # tp is a multiple of WIDE_TILE (4): the last step may be 4 tokens
            n = min(X4_SDOT_TILE, tp - t0)
            for g in range(c * _X4_CHUNK, min(groups, (c + 1) * _X4_CHUNK)):
                dst, o, stride = x4_tile_dst(out, tmp, rows, t0, g, n)
                if n == X4_SDOT_TILE:
                    if q6:
                        q6_k_x4_tile8(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                    else:
                        q4_k_x4_tile8(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                elif q6:
                    q6_k_x4_tile(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                else:
                    q4_k_x4_tile(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                x4_tile_tail(out, tmp, rows, t0, g, n)


@njit(parallel=True, cache=True)
def q4_k_mins_x4(w4, nb, out):
    """_q4_k_mins of an x4 Q4_K matrix: out[4g + r, 8b + j] = dmin_r * min j of block b (the
    rows of the last group past out's are skipped)."""
    rows = out.shape[0]
    for g in prange(w4.shape[0]):
        for i in range(nb):
            p = i * 592
            for r in range(min(4, rows - 4 * g)):
                dmin = _f16_at(w4[g], p + 8 + 2 * r)
                for j in range(8):
                    out[4 * g + r, 8 * i + j] = dmin * _F32(w4[g][p + 48 + 4 * j + r])
