"""The integer matrix kernels of the K formats and Q8_0 on the x86 levels (and wherever
int8_dot.py's generic IR runs): each row, or each row against a tile of tokens, is one of
int8_dot's row functions, whose block bodies the ISA files register.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .int8_dot import (TILE, WIDE_TILE, q4_k_row_dot, q4_k_row_dot_tile, q5_k_row_dot, q5_k_row_dot_tile,
                       q6_k_row_dot, q6_k_row_dot_tile, q8_0_row_dot, q8_0_row_dot_tile)
from .njit_base import MV as _MV
from .njit_base import f16_at as _f16_at
from .njit_base import scale_min_k4

__all__ = ["FUSED_MINS_TOKENS", "ROW_CHUNK", "mm_k_q8k", "mm_q4_k_q8k_few", "mm_q5_k_q8k", "mm_q8_0_q8", "mv_k_q8k", "mv_q5_k_q8k", "mv_q8_0_q8",
           "q4_k_mins", "q4_k_mins_product"]

_F32 = np.float32


# K formats times Q8_K activations and Q8_0 times Q8_0 activations in integer arithmetic, as
# llama.cpp does it (int8_dot.py has the why): each row in LLVM IR with a float accumulator
# vector carried across its blocks. The f16 block scales are decoded in the loop: nothing
# prepared beside the mmap. Measured with `python -m bench.kernels` (GB/s of weight bytes, 2
# threads wall, 1024x3584): Q4_K 4.6 (float kernel) -> 14-15 (one reduction per block) -> 20-23
# (one per row); Q6_K 3.5 -> 12-16 -> 19-21; Q8_0 8.8 -> 16-19.

@njit(**_MV)
def mv_k_q8k(w, xq, xd, xs16, out, knobs, q6):
    # one kernel for both K formats: the format test is per row, not per block
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        if q6:
            out[r] = q6_k_row_dot(w[r], nb, xq, xd, xs16, knobs)
        else:
            out[r] = q4_k_row_dot(w[r], nb, xq, xd, xs16, knobs)


@njit(**_MV)
def mv_q5_k_q8k(w, xq, xd, xs16, out, knobs, q6):
    # arm64 only (arm/neon.py): mv_k_q8k's arguments, so MatvecPlan calls both alike
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q5_k_row_dot(w[r], nb, xq, xd, xs16, knobs)


@njit(**_MV)
def mv_q8_0_q8(w, xq16, xd, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q8_0_row_dot(w[r], nb, xq16, xd)


# Several tokens at once (a prefill, or a chat turn's suffix): each weight block is unpacked once
# per WIDE_TILE tokens (Q8_0: TILE). xq (Tp*cols) int8, xd (Tp*nb) f32, xs16 (Tp*cols/16) int16
# with Tp a multiple of the tile (padding tokens are zeros); out (Tp, rows). Rows go in chunks of
# ROW_CHUNK: the tile's activations stay in L1 across the chunk's rows, and the small result
# buffer is allocated per chunk, not per row.
ROW_CHUNK = 16


@njit(**_MV)
def mm_k_q8k(w, xq, xd, xs16, out, knobs, q6):
    # Q4_K: out holds the mins' product on entry (MatvecPlan.tokens_q8k) and the kernel subtracts
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * ROW_CHUNK, min(rows, (c + 1) * ROW_CHUNK)):
                if q6:
                    q6_k_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                      xs16, t0 * cols // 16, cols // 16, res, knobs)
                    for t in range(WIDE_TILE):
                        out[t0 + t, r] = res[t]
                else:
                    q4_k_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                      xs16, t0 * cols // 16, cols // 16, res, knobs)
                    for t in range(WIDE_TILE):
                        out[t0 + t, r] = res[t] - out[t0 + t, r]


@njit(**_MV)
def mm_q4_k_q8k_few(w, xq, xd, xs16, sums32, out, knobs, block_bytes=144):
    """mm_k_q8k for Q4_K and at most FUSED_MINS_TOKENS tokens, the mins' product of each row
    (q4_k_mins_product's sum) made beside its tiles in the same launch: a decode step of the
    resident server's batch multiplies ~160 small matrices, and a second parallel launch for each
    cost as much as the sums."""
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    k = nb * 8
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        mins = np.empty(k, np.float32)
        for r in range(c * ROW_CHUNK, min(rows, (c + 1) * ROW_CHUNK)):
            for i in range(nb):
                p = i * block_bytes
                dmin = _f16_at(w[r], p + 2)
                for j in range(8):
                    mins[8 * i + j] = dmin * scale_min_k4(w[r], p + 4, j)[1]
            for t0 in range(0, tp, WIDE_TILE):
                q4_k_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                  xs16, t0 * cols // 16, cols // 16, res, knobs)
                for t in range(WIDE_TILE):
                    m = np.float32(0.0)
                    for q in range(k):
                        m += mins[q] * sums32[t0 + t, q]
                    out[t0 + t, r] = res[t] - m


@njit(**_MV)
def mm_q5_k_q8k(w, xq, xd, xs16, out, knobs):
    # mm_k_q8k for Q5_K (arm64 only, arm/neon.py): out holds the mins' product on entry
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 256
    rows = w.shape[0]
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * ROW_CHUNK, min(rows, (c + 1) * ROW_CHUNK)):
                q5_k_row_dot_tile(w[r], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                  xs16, t0 * cols // 16, cols // 16, res, knobs)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t] - out[t0 + t, r]


@njit(parallel=True, cache=True)
def q4_k_mins(w, nb, out, block_bytes=144):
    """out[r, 8b + j] = dmin * min j of block b of row r (get_scale_min_k4's mins; Q5_K's blocks,
    176 bytes, have the same header)."""
    for r in prange(w.shape[0]):
        for i in range(nb):
            p = i * block_bytes
            dmin = _f16_at(w[r], p + 2)
            for j in range(8):
                out[r, 8 * i + j] = dmin * scale_min_k4(w[r], p + 4, j)[1]


# Up to this many (padded) tokens the mins' product is made without q4_k_mins + BLAS: in the
# tile's own launch for x86's Q4_K (mm_q4_k_q8k_few), by q4_k_mins_product for arm64's Q5_K. A few
# tokens (the resident server's decode steps) need neither the mins matrix (rows x cols/32 f32
# per call: 32 MB for a 248k-row head) nor BLAS's threads. Where OpenBLAS came up
# before the engine set its thread timeout (numpy imported first), its workers, woken for a
# 16-row product, spun beside numba's and every kernel of a 16-sequence step ran ~4x slower (the
# 0.8B: 27.5 tok/s, 111.6 with this kernel); with the engine's settings in force both run at
# ~113-115 tok/s (measured).
FUSED_MINS_TOKENS = 16


@njit(**_MV)
def q4_k_mins_product(w, nb, sums32, out, block_bytes=144):
    """out[t, r] = sum over blocks b and runs j of (dmin_b * min_bj) * sums32[t, 8b + j]: what
    q4_k_mins and the matmul by the activations' scaled sums give, for a few tokens, without the
    whole mins matrix or BLAS (a chunk of rows' mins at a time, in L1)."""
    tp = sums32.shape[0]
    rows = w.shape[0]
    k = nb * 8
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        mins = np.empty((ROW_CHUNK, k), np.float32)
        r0 = c * ROW_CHUNK
        r1 = min(rows, r0 + ROW_CHUNK)
        for r in range(r0, r1):
            for i in range(nb):
                p = i * block_bytes
                dmin = _f16_at(w[r], p + 2)
                for j in range(8):
                    mins[r - r0, 8 * i + j] = dmin * scale_min_k4(w[r], p + 4, j)[1]
        for r in range(r0, r1):
            for t in range(tp):
                acc = np.float32(0.0)
                for q in range(k):
                    acc += mins[r - r0, q] * sums32[t, q]
                out[t, r] = acc


@njit(**_MV)
def mm_q8_0_q8(w, xq16, xd, out):
    # the Q8_0 twin of mm_k_q8k (Q8_0 activations: int16 values, f32 scale per 32)
    tp = out.shape[0]
    nb = xd.shape[0] // tp
    cols = nb * 32
    rows = w.shape[0]
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        res = np.empty(TILE, np.float32)
        for t0 in range(0, tp, TILE):
            for r in range(c * ROW_CHUNK, min(rows, (c + 1) * ROW_CHUNK)):
                q8_0_row_dot_tile(w[r], nb, xq16, t0 * cols, cols, xd, t0 * nb, nb, res)
                for t in range(TILE):
                    out[t0 + t, r] = res[t]
