"""x86's Q4_K and Q6_K rows and tiles over the x4 layout (arm/x4.py: four weight rows interleaved, the
same bytes on every ISA; `repack_x4` makes it once when kernels.MatvecPlan is built).

In the x4 layout a 16-byte vector holds 4 consecutive bytes of each of 4 rows. Two vectors 64
bytes apart (segments 2c and 2c + 1, the same k) make one 256-bit vector whose 128-bit lane 0
holds bytes 4k..4k+3 of the rows' 32-byte chunk c and lane 1 bytes 16 + 4k..: its nibbles
times the token's 32 values of the run with `vpshufd` broadcasting values 4k.. to lane 0 and
16 + 4k.. to lane 1 (one load of the run's activations serves all four k). So per run of 32
values a `vpmaddubsw` gives 4 rows' pair sums at once, four of them add in int16 (|.| <= 4 x 2
x 15 x 128 = 15360), and one `vpmaddwd` by the rows' scales (the layout's bytes per run and
row) leaves each i32 lane one row's sum: no horizontal sums per row, the result of a block is
4 rows' <8 x float> (lanes r and 4 + r: row r), and the weight unpacking (masks, shifts,
scales, f16 conversions) is paid once per 4 rows and 8 tokens. ik_llama.cpp's `_r4` repacked
formats taught the idea (its code is not used); the bytes are arm64's x4 ones, so one repack
and one exact decoder (arm/x4.dequantize_x4) serve both ISAs.

The mins of Q4_K (dmin m_j against the token's sums per run): decode adds them here, with a
`vpmaddwd` of the mins by the sums; tiles get their product from BLAS first
(kernels.MatvecPlan.tokens_q8k, arm/tiles.q4_k_mins_x4) and subtract it.

Q6_K: a run is two groups of 16 (one per 128-bit lane, each its own scale), the quants 0..63
unsigned for `vpmaddubsw` (two products fit in int16, not four: two `vpmaddwd` per run), and
the -32 goes against the token's sums per 16 (Q8_K's bsums, the tile's `xs`) inside the kernel:
per token and block four `vpshufd` + `vpmaddwd` of the sums by the scales, as ik_llama.cpp's
q6_k_r4 does, instead of arm64's subtraction from the quants (`sdot` is signed x signed).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.arm.x4 import X4_BLOCK, x4_tile_dst, x4_tile_tail
from engine.quant.int8_dot import (F32, I8, I16, I32, I64, PREFETCH_X4_DECODE, Row, WIDE_TILE, array_ptr, fma, prefetch,
                                   prefetch_bytes, vec, x86_call)
from engine.quant.int8_kernels import ROW_CHUNK
from engine.quant.njit_base import MV

__all__ = ["X86_TILE", "mm_k_x4_avx2", "mm_q8_0_x4_avx2", "mv_k_x4_avx2", "mv_q8_0_x4_avx2"]

V8 = vec(I8, 32)
W16 = vec(I16, 16)
D32 = vec(I32, 8)
F8 = vec(F32, 8)
F4 = vec(F32, 4)

# Tokens per pass of the tile: 8 against 4 measured 14.1 vs 17.4 ms (133.6 vs 108.1 GMAC/s) at
# 3584x1024, 512 tokens, 2 threads, Zen 3 (a probe on random bytes); the weight unpacking is
# shared by twice the tokens. The prompt's last 4 (activations are padded to WIDE_TILE) take
# a 4-token pass. Q6_K passes 4 tokens (Q6_K_TILE): its 8-token block needed 1739
# instructions, 377 of them stack spills and reloads (two `vpmaddwd` per run, the unpacked
# 6-bit quants), against Q4_K's 1200 / 154, and ran slower than 4 tokens: 54-59 vs 72-100
# GMAC/s at 6144x1024, 55-87 vs 81-91 at 1024x3584 (T = 512, 2 threads, Zen 3, alternating).
X86_TILE = 8
Q6_K_TILE = WIDE_TILE

_ROW = ("row", "nb", "xq", "xd", "xs", "out", "o")
_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "out", "oo", "ostride")


def _i64(v: int):
    return ir.Constant(I64, v)


def _shuffle(b, v, idx: list[int]):
    return b.shuffle_vector(v, v, ir.Constant(vec(I32, len(idx)), idx))


def _maddubs(b, u8, s8):
    return x86_call(b, "llvm.x86.avx2.pmadd.ub.sw", W16, [u8, s8])


def _madd(b, a16, b16):
    return x86_call(b, "llvm.x86.avx2.pmadd.wd", D32, [a16, b16])


def _f16x4(row: Row, index):
    """The 4 rows' f16 at byte `index` as <4 x float> (`vcvtph2ps`)."""
    b = row.b
    halves = b.bitcast(row.load("row", index, vec(I16, 4), align=1), ir.VectorType(ir.HalfType(), 4))
    return b.fpext(halves, F4)


def _splat(b, value, n: int):
    one = b.insert_element(ir.Constant(vec(F32, n), ir.Undefined), value, ir.Constant(I32, 0))
    return _shuffle(b, one, [0] * n)


class _X4Block:
    """What every x4 block reader starts with: block i's byte offset `p` (prefetched: decode
    PREFETCH_X4_DECODE bytes ahead, tiles as the rows) in the group's row of bytes, and 16-byte
    loads at offsets in it."""

    KIND = ""

    def __init__(self, row: Row, i):
        b = row.b
        size = X4_BLOCK[self.KIND]
        self.p = b.mul(i, _i64(size))
        prefetch(row, self.p, size, max(PREFETCH_X4_DECODE, prefetch_bytes()) if row.ntok == 1 else None)
        self.b, self.row = b, row

    def _load16(self, off: int):
        return self.row.load("row", self.b.add(self.p, _i64(off)), vec(I8, 16), align=1)


class _Q4KBlock(_X4Block):
    """x4 block i of Q4_K: `vectors(j)` the 4 vectors of run j (k = 0..3), `scale(j)` the rows'
    scales of run j against a `vpmaddubsw` result, d8 the rows' d in both 128-bit lanes, dmin4
    and the mins (decode)."""

    RUNS, VALUES, KIND = 8, 256, "q4_k"

    def __init__(self, row: Row, i):
        super().__init__(row, i)
        b, p = self.b, self.p
        self._sc16 = b.zext(row.load("row", b.add(p, _i64(16)), V8, align=1), vec(I16, 32))
        d4 = _f16x4(row, p)
        self.d8 = _shuffle(b, d4, [0, 1, 2, 3] * 2)
        self.dmin4 = _f16x4(row, b.add(p, _i64(8)))

    def offset(self, j: int) -> int:
        return 32 * j

    def vectors(self, j: int) -> list:
        """Run j's 4 vectors, loaded and unpacked where used (made up front, or shared by the
        two runs of a chunk, they stayed live across the tokens' products and spilled: 75 vs
        105-135 GMAC/s at 3584x1024, 512 tokens, 2 threads, Zen 3)."""
        b = self.b
        c, high = divmod(j, 2)
        mask = ir.Constant(V8, [15] * 32)
        out = []
        for k in range(4):
            v = b.shuffle_vector(self._load16(80 + 64 * 2 * c + 16 * k),
                                 self._load16(80 + 64 * (2 * c + 1) + 16 * k),
                                 ir.Constant(vec(I32, 32), list(range(32))))
            out.append(b.and_(b.bitcast(b.lshr(b.bitcast(v, W16), ir.Constant(W16, [4] * 16)), V8), mask)
                       if high else b.and_(v, mask))
        return out

    def scale(self, j: int):
        """<16 x i16>: lanes 2r, 2r + 1 of each 128-bit half hold row r's scale of run j."""
        return _shuffle(self.b, self._sc16, [4 * j + (lane % 8) // 2 for lane in range(16)])

    def dot(self, q: list, y, sv):
        """The 4 `vpmaddubsw` summed in int16 (|.| <= 4 x 2 x 15 x 128), one `vpmaddwd`."""
        b = self.b
        m = _products(b, q, y)
        return _madd(b, b.add(b.add(m[0], m[1]), b.add(m[2], m[3])), sv)

    def mins_dot(self, sums16):
        """<4 x i32>: row r's sum over runs j of min_jr x the token's sum of run j, from the
        token's <16 x i16> sums per 16 values (|sum per 32| <= 4096, mins <= 63)."""
        b = self.b
        mn16 = b.zext(self.row.load("row", b.add(self.p, _i64(48)), V8, align=1), vec(I16, 32))
        by32 = b.add(_shuffle(b, sums16, list(range(0, 16, 2))), _shuffle(b, sums16, list(range(1, 16, 2))))
        # lanes (u, r, e) = run 2u + e, row r: `vpmaddwd` adds e = 0, 1; then u = 0..3 are summed
        m = _shuffle(b, mn16, [4 * (2 * u + e) + r for u in range(4) for r in range(4) for e in range(2)])
        s = _shuffle(b, by32, [2 * u + e for u in range(4) for r in range(4) for e in range(2)])
        lo = _madd(b, _shuffle(b, m, list(range(16))), _shuffle(b, s, list(range(16))))
        hi = _madd(b, _shuffle(b, m, list(range(16, 32))), _shuffle(b, s, list(range(16, 32))))
        both = b.add(lo, hi)  # lanes (u mod 2, r)
        return b.add(_shuffle(b, both, [0, 1, 2, 3]), _shuffle(b, both, [4, 5, 6, 7]))


class _Q6KBlock(_X4Block):
    """x4 block i of Q6_K: run j = (h, t) covers groups g0 = 8h + 2t (128-bit lane 0) and g0 + 1
    (lane 1), 32 activations at 16 g0; `vectors(j)` its 4 vectors of 6-bit quants 0..63 (the
    -32 goes against the token's sums per 16: `offsets_dot`), `scale(j)` the rows' scales of
    g0 and g0 + 1 against a `vpmaddubsw` result."""

    RUNS, VALUES, KIND = 8, 256, "q6_k"

    def __init__(self, row: Row, i):
        super().__init__(row, i)
        b, p = self.b, self.p
        sc = [b.sext(row.load("row", b.add(p, _i64(32 * h)), V8, align=1), vec(I16, 32)) for h in range(2)]
        self._sc16 = b.shuffle_vector(sc[0], sc[1], ir.Constant(vec(I32, 64), list(range(64))))  # lane 4g + r
        self.d8 = _shuffle(b, _f16x4(row, b.add(p, _i64(832))), [0, 1, 2, 3] * 2)
        # the -32's scales, per pair q of groups: lanes (half, r, e) = scale of group 8 half + 2q + e,
        # row r, against the token's sums of those groups (`vpshufd` q of its <16 x i16> sums)
        self._offsets = [_shuffle(b, self._sc16, [4 * (8 * half + 2 * q + e) + r
                                                  for half in range(2) for r in range(4) for e in range(2)])
                         for q in range(4)]

    def offset(self, j: int) -> int:
        h, t = divmod(j, 4)
        return 128 * h + 32 * t

    def vectors(self, j: int) -> list:
        b = self.b
        h, t = divmod(j, 4)
        ql_seg, qh_seg = 4 * h + 2 * (t & 1), 8 + 2 * h
        join = ir.Constant(vec(I32, 32), list(range(32)))
        out = []
        for k in range(4):
            ql = b.shuffle_vector(self._load16(64 + 64 * ql_seg + 16 * k), self._load16(64 + 64 * (ql_seg + 1) + 16 * k), join)
            qh = b.shuffle_vector(self._load16(64 + 64 * qh_seg + 16 * k), self._load16(64 + 64 * (qh_seg + 1) + 16 * k), join)
            low = b.and_(ql if t < 2 else _shift16(b, ql, -4), _splat8(15))
            # bits 2t, 2t + 1 of qh to bits 4, 5 (16-bit shifts; the mask drops the neighbour's bits)
            high = {0: _shift16(b, qh, 4), 1: _shift16(b, qh, 2), 2: qh, 3: _shift16(b, qh, -2)}[t]
            out.append(b.or_(low, b.and_(high, _splat8(0x30))))
        return out

    def scale(self, j: int):
        h, t = divmod(j, 4)
        g0 = 8 * h + 2 * t
        return _shuffle(self.b, self._sc16, [4 * (g0 + lane // 8) + (lane % 8) // 2 for lane in range(16)])

    def dot(self, q: list, y, sv):
        """Pairs of `vpmaddubsw` (each |.| <= 2 x 63 x 128: two fit in int16, four do not)."""
        b = self.b
        m = _products(b, q, y)
        return b.add(_madd(b, b.add(m[0], m[1]), sv), _madd(b, b.add(m[2], m[3]), sv))

    def offsets_dot(self, sums16):
        """<8 x i32> lanes (half, r): row r's sum over the half's 8 groups of scale x the token's
        sum of the group (ik_llama.cpp's bsums order: one `vpshufd` per pair of groups)."""
        b = self.b
        s32 = b.bitcast(sums16, D32)
        acc = None
        for q in range(4):
            v = _madd(b, self._offsets[q], b.bitcast(_shuffle(b, s32, [q] * 4 + [4 + q] * 4), W16))
            acc = v if acc is None else b.add(acc, v)
        return acc


class _Q80Block(_X4Block):
    """x4 block i of Q8_0: one run of 32 values per 4 rows, its 4 vectors of int8 quants. AVX2
    multiplies unsigned by signed bytes, so the quants' magnitudes (`vpabsb`, once per block and
    8 tokens) go against the activations with the quants' signs (`vpsignb`: Q8_0 activations
    are -127..127, so the sign flip never overflows); each `vpmaddubsw` pair (|.| <= 2 x 128 x
    127) widens alone (`vpmaddwd` by ones), as llama.cpp's Q8_0 dot does."""

    RUNS, VALUES, KIND = 1, 32, "q8_0"

    def __init__(self, row: Row, i):
        super().__init__(row, i)
        b, p = self.b, self.p
        join = ir.Constant(vec(I32, 32), list(range(32)))
        self._q = [b.shuffle_vector(self._load16(8 + 16 * k), self._load16(8 + 64 + 16 * k), join) for k in range(4)]
        self.d8 = _shuffle(b, _f16x4(row, p), [0, 1, 2, 3] * 2)

    def offset(self, j: int) -> int:
        return 0

    def vectors(self, j: int) -> list:
        return [(_abs8(self.b, q), q) for q in self._q]

    def scale(self, j: int):
        return None

    def dot(self, q: list, y, sv):
        b = self.b
        y32 = b.bitcast(y, D32)
        ones = ir.Constant(W16, [1] * 16)
        acc = None
        for k, (mag, sign) in enumerate(q):
            yk = b.bitcast(_shuffle(b, y32, [k] * 4 + [4 + k] * 4), V8)
            v = _madd(b, _maddubs(b, mag, x86_call(b, "llvm.x86.avx2.psign.b", V8, [yk, sign])), ones)
            acc = v if acc is None else b.add(acc, v)
        return acc


def _abs8(b, v):
    """|v| per byte (`vpabsb`; -128 stays 0x80, which `vpmaddubsw` reads as 128)."""
    neg = b.icmp_signed("<", v, ir.Constant(V8, [0] * 32))
    return b.select(neg, b.sub(ir.Constant(V8, [0] * 32), v), v)


def _splat8(v: int):
    return ir.Constant(V8, [v] * 32)


def _shift16(b, v, by: int):
    """v's bytes shifted in 16-bit lanes (left for by > 0): the caller masks the crossed bits."""
    w = b.bitcast(v, W16)
    w = b.shl(w, ir.Constant(W16, [by] * 16)) if by > 0 else b.lshr(w, ir.Constant(W16, [-by] * 16))
    return b.bitcast(w, V8)


def _products(b, q: list, y) -> list:
    """`vpmaddubsw` of q[k] by the activations' values 4k.. (lane 0) and 16 + 4k.. (lane 1)."""
    y32 = b.bitcast(y, D32)
    return [_maddubs(b, q[k], b.bitcast(_shuffle(b, y32, [k] * 4 + [4 + k] * 4), V8)) for k in range(4)]


def _store4(row: Row, index, value, subtract: bool):
    b = row.b
    ptr = array_ptr(row.context, b, row.aty["out"], row.arg["out"], index, F4)
    if subtract:
        value = b.fsub(value, b.load(ptr, align=4))
    b.store(value, ptr, align=4)


_ROW_Q8_0 = ("row", "nb", "xq", "xd", "out", "o")
_TILE_SUMS = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "xs", "so", "sstride", "out", "oo",
              "ostride")


def _codegen(kind: str, ntok: int):
    """4 rows (one x4 group) times ntok tokens: out[o + r] (decode) or out[oo + t * ostride + r]
    (tiles). Q4_K: decode adds the mins; its tiles subtract what `out` holds (the mins' product
    from BLAS). Q6_K: the -32 against the token's sums per 16 (xs), inside, on both."""
    q6 = kind == "q6_k"
    names: tuple[str, ...]
    if ntok == 1:
        names = _ROW_Q8_0 if kind == "q8_0" else _ROW
    else:
        names = _TILE_SUMS if q6 else _TILE
    block = {"q4_k": _Q4KBlock, "q6_k": _Q6KBlock, "q8_0": _Q80Block}[kind]

    def codegen(context, builder, signature, args):
        b = builder
        row = Row(context, b, signature, args, names, ntok)
        accs = [cgutils.alloca_once_value(b, ir.Constant(F8, [0.0] * 8)) for _ in range(ntok)]
        macc = cgutils.alloca_once_value(b, ir.Constant(F4, [0.0] * 4)) if ntok == 1 and kind == "q4_k" else None
        zero = ir.Constant(D32, [0] * 8)
        with cgutils.for_range(b, row.arg["nb"]) as loop:
            i = b.sext(loop.index, I64) if loop.index.type.width < 64 else loop.index
            blk = block(row, i)
            xo = [b.add(row.offset("xo", "xstride", t), b.mul(i, _i64(block.VALUES))) for t in range(ntok)]
            isums = [zero] * ntok
            for j in range(block.RUNS):
                sv = blk.scale(j)
                q = blk.vectors(j)
                for t in range(ntok):
                    y = row.load("xq", b.add(xo[t], _i64(blk.offset(j))), V8, align=1)
                    isums[t] = b.add(isums[t], blk.dot(q, y, sv))
            for t in range(ntok):
                if q6:
                    so = b.add(row.offset("so", "sstride", t), b.mul(i, _i64(16)))
                    corr = blk.offsets_dot(row.load("xs", so, W16, align=2))
                    isums[t] = b.sub(isums[t], b.shl(corr, ir.Constant(D32, [5] * 8)))
                xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
                b.store(fma(b, b.sitofp(isums[t], F8), b.fmul(blk.d8, _splat(b, xd, 8)), b.load(accs[t])), accs[t])
            if macc is not None:
                sums16 = row.load("xs", b.mul(i, _i64(16)), W16, align=2)
                xd = row.load("xd", i, F32)
                b.store(fma(b, b.sitofp(blk.mins_dot(sums16), F4), b.fmul(blk.dmin4, _splat(b, xd, 4)),
                            b.load(macc)), macc)
        for t in range(ntok):
            a = b.load(accs[t])
            res = b.fadd(_shuffle(b, a, [0, 1, 2, 3]), _shuffle(b, a, [4, 5, 6, 7]))
            if ntok == 1:
                _store4(row, row.arg["o"], b.fsub(res, b.load(macc)) if macc is not None else res, False)
            else:
                _store4(row, b.add(row.arg["oo"], b.mul(row.arg["ostride"], _i64(t))), res, kind == "q4_k")
        return context.get_dummy_value()
    return codegen


def _row_intrinsic(kind: str):
    if kind == "q8_0":
        def typer(typingctx, row, nb, xq, xd, out, o):
            return types.void(row, nb, xq, xd, out, o), _codegen(kind, 1)
    else:
        def typer(typingctx, row, nb, xq, xd, xs, out, o):  # type: ignore[misc]
            return types.void(row, nb, xq, xd, xs, out, o), _codegen(kind, 1)
    typer.__name__ = f"{kind}_x4_avx2_dot"
    return intrinsic(typer)


def _tile_intrinsic(kind: str, ntok: int):
    if kind == "q6_k":
        def typer(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, out, oo, ostride):
            sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, out, oo, ostride)
            return sig, _codegen(kind, ntok)
    else:
        def typer(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, out, oo, ostride):  # type: ignore[misc]
            return types.void(row, nb, xq, xo, xstride, xd, do, dstride, out, oo, ostride), _codegen(kind, ntok)
    typer.__name__ = f"{kind}_x4_avx2_tile{ntok}"
    return intrinsic(typer)


# out[o + r] = rows 4g + r of an x4 group times one token's Q8_K activations (decode)
q4_k_x4_avx2_dot = _row_intrinsic("q4_k")
q6_k_x4_avx2_dot = _row_intrinsic("q6_k")
# out[oo + t * ostride + r] for t < 8 (X86_TILE) or 4 (WIDE_TILE: the prompt's tail; every pass
# of Q6_K); Q4_K: minus what is there (the mins' product)
q4_k_x4_avx2_tile8 = _tile_intrinsic("q4_k", X86_TILE)
q4_k_x4_avx2_tile4 = _tile_intrinsic("q4_k", WIDE_TILE)
q6_k_x4_avx2_tile4 = _tile_intrinsic("q6_k", WIDE_TILE)
q8_0_x4_avx2_dot = _row_intrinsic("q8_0")
q8_0_x4_avx2_tile8 = _tile_intrinsic("q8_0", X86_TILE)
q8_0_x4_avx2_tile4 = _tile_intrinsic("q8_0", WIDE_TILE)


@njit(**MV)
def mv_k_x4_avx2(w4, xq, xd, xs16, out, rows, q6):
    # decode: a group of 4 rows per intrinsic call; the last, partial group through a scratch
    nb = xd.shape[0]
    full = rows // 4
    for g in prange(w4.shape[0]):
        if g < full:
            if q6:
                q6_k_x4_avx2_dot(w4[g], nb, xq, xd, xs16, out, 4 * g)
            else:
                q4_k_x4_avx2_dot(w4[g], nb, xq, xd, xs16, out, 4 * g)
        else:
            tmp = np.empty(4, np.float32)
            if q6:
                q6_k_x4_avx2_dot(w4[g], nb, xq, xd, xs16, tmp, 0)
            else:
                q4_k_x4_avx2_dot(w4[g], nb, xq, xd, xs16, tmp, 0)
            for r in range(rows - 4 * g):
                out[4 * g + r] = tmp[r]


_CHUNK = ROW_CHUNK // 4  # groups per chunk: the tile's activations stay in L1 across them


@njit(**MV)
def mm_k_x4_avx2(w4, xq, xd, xs16, out, rows, q6):
    # prefill: out (Tp * rows, flat); Q4_K: it holds the mins' product on entry, which the tiles
    # subtract (xs16 unused); Q6_K: the tiles overwrite it. Tp is a multiple of WIDE_TILE:
    # Q4_K passes of 8 tokens, a last one of 4 where Tp is not a multiple of 8; Q6_K passes of 4.
    # The last, partial group of rows goes through a 4-row scratch.
    tp = out.shape[0] // rows
    nb = xd.shape[0] // tp
    cols = nb * 256
    groups = w4.shape[0]
    width = Q6_K_TILE if q6 else X86_TILE
    for c in prange((groups + _CHUNK - 1) // _CHUNK):
        tmp = np.empty(4 * X86_TILE, np.float32)
        for t0 in range(0, tp, width):
            n = min(width, tp - t0)
            for g in range(c * _CHUNK, min(groups, (c + 1) * _CHUNK)):
                dst, o, stride = x4_tile_dst(out, tmp, rows, t0, g, n)
                if q6:
                    q6_k_x4_avx2_tile4(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb,
                                       xs16, t0 * nb * 16, nb * 16, dst, o, stride)
                elif n == X86_TILE:
                    q4_k_x4_avx2_tile8(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                else:
                    q4_k_x4_avx2_tile4(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                x4_tile_tail(out, tmp, rows, t0, g, n)


# Q8_0 (TileCall.X4 and the Q8_0 row call, int8 activations): the same loops as the K formats'
@njit(**MV)
def mv_q8_0_x4_avx2(w4, xq, xd, out, rows):
    nb = xd.shape[0]
    full = rows // 4
    for g in prange(w4.shape[0]):
        if g < full:
            q8_0_x4_avx2_dot(w4[g], nb, xq, xd, out, 4 * g)
        else:
            tmp = np.empty(4, np.float32)
            q8_0_x4_avx2_dot(w4[g], nb, xq, xd, tmp, 0)
            for r in range(rows - 4 * g):
                out[4 * g + r] = tmp[r]


@njit(**MV)
def mm_q8_0_x4_avx2(w4, xq, xd, out, rows):
    tp = out.shape[0] // rows
    nb = xd.shape[0] // tp
    cols = nb * 32
    groups = w4.shape[0]
    for c in prange((groups + _CHUNK - 1) // _CHUNK):
        tmp = np.empty(4 * X86_TILE, np.float32)
        for t0 in range(0, tp, X86_TILE):
            n = min(X86_TILE, tp - t0)
            for g in range(c * _CHUNK, min(groups, (c + 1) * _CHUNK)):
                dst, o, stride = x4_tile_dst(out, tmp, rows, t0, g, n)
                if n == X86_TILE:
                    q8_0_x4_avx2_tile8(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                else:
                    q8_0_x4_avx2_tile4(w4[g], nb, xq, t0 * cols, cols, xd, t0 * nb, nb, dst, o, stride)
                x4_tile_tail(out, tmp, rows, t0, g, n)
