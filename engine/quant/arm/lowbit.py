"""arm64 integer rows and tiles for the smaller downloads' formats (Graviton2 and later): Q2_K,
Q3_K, IQ4_XS and IQ3_S times Q8_K activations, IQ4_NL and the legacy Q4_0 and Q5_0 times Q8_0
activations, Q4_1 and Q5_1 times Q8_1 (Q8_0's and s = f16(d·Σq) per block), with `sdot`.

The same scheme as arm/neon.py's Q4_K/Q6_K rows (one `sdot`, `llvm.aarch64.neon.sdot.v4i32.v16i8`,
per 16 weights into a <4 x i32>, the sub-block scale applied as a vector multiply-add into one
i32 vector per block, converted and scaled into a float accumulator once per block, one
horizontal sum per row: int8_dot.row_codegen), and llama.cpp's NEON arithmetic
(ggml-cpu/arch/arm/quants.c) for each format:

* Q2_K: quants 0..3 and 4-bit scales, so the weights are multiplied by their scale once per
  block (|q·s| <= 45 fits int8) and the block's 16 `sdot` chain into one accumulator per token
  with no multiply by a scale at all; the mins go through the activations' int16 sums per 16
  values (llama.cpp's `bsums`), times -dmin.
* Q3_K: quants signed, -4..3 (llama.cpp's `q3 - (~hbit << 2)`), so no offset term; the 6-bit
  signed scales per 16 values multiply the `sdot` results (|q·s| reaches 128, past int8, so they
  cannot be folded into the weights as Q2_K's are).
* IQ4_XS, IQ4_NL: the 16 non-linear levels (gguf's kvalues, via lowbit.IQ4_LEVELS) looked up
  with `tbl` (`llvm.aarch64.neon.tbl1.v16i8`) from the nibbles; levels and activations are both
  signed, which `sdot` takes as they are (x86 has to move the signs across for `pmaddubsw`).
* Q4_0, Q5_0: nibbles less 8 / 16 (Q5_0's fifth bit from qh expanded to bytes as IQ3_S's signs
  are), signed, as IQ4_NL's levels are (llama.cpp's ggml_vec_dot_q4_0_q8_0 / q5_0_q8_0).
* Q4_1, Q5_1: the unsigned 0..15 / 0..31 go into `sdot` as they are (they fit int8); the min
  times the activation block's s is added per block (llama.cpp's ggml_vec_dot_q4_1_q8_1).
* IQ3_S: 8 lattice rows (4 bytes each, 1..15) gathered per 32 values from the 512-entry grid
  (gguf's, as lowbit_kernels' uint32 view), the 32 sign bits expanded to byte masks and applied
  to the weights ((g ^ m) - m), scale 1 + 2·nibble per 32 values.

Bounds: a 4-value `sdot` lane is at most 4·128·128 = 65536 for any int8 pair; times a scale of
at most 32 and summed over a block's 16 vectors that is below 2^26. Nothing saturates.

Everything is fixed 128-bit NEON with named intrinsics (`sdot`, `tbl`) and generic vector IR,
so none of it goes through the SVE partial reduction LLVM 22.1 miscompiles above 128-bit vectors
(docs/arm64.md). The tiles are `sdot` on every Graviton, i8mm ones included (no `smmla` tile for
these formats yet: their traits rows name `neon-dotprod` for them on V1/V2).

Where they run: on the `neon-dotprod` / `neon-i8mm` levels, MATVEC_INT8 and MULTI_TOKEN_INT8 from
here are these formats' traits rows (traits.py) instead of lowbit_kernels' (x86).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from engine.quant.arm.neon import V4, V16, c8, fold, lane_splat, neon_call, sdot
from engine.quant.int8_dot import (F32, I8, I16, I32, I64, WIDE_TILE, accumulate, pair_sums, prefetch, q3_k_scales,
                                   row_codegen, vec)
from engine.quant.njit_base import MV as _MV
from engine.quant.lowbit import IQ4_LEVELS
from engine.quant.lowbit_kernels import G3S_U32


TBL = "llvm.aarch64.neon.tbl1.v16i8"
W16 = vec(I16, 16)


def _c64(v: int):
    return ir.Constant(I64, v)


def _tbl(b, table, idx):
    """table[idx] per byte (`tbl v.16b, {table}, idx`; an index past 15 gives 0, none here)."""
    return neon_call(b, TBL, V16, [table, idx])


@dataclass
class _Group:
    """Weight vectors that share one scale: (weights <16 x i8>, the byte offset of their 16
    activations in the block), and the <4 x i32> splat of the scale (None: already in the weights)."""

    vecs: list[tuple[ir.Value, int]]
    scale: ir.Value | None


@dataclass
class _Block:
    """A weight block unpacked once for all the tile's tokens: its scale groups, the f16 scale d,
    and Q2_K's mins (<16 x i16> against the activations' 16 sums) with dmin."""

    groups: list[_Group]
    d: ir.Value
    mins: ir.Value | None = None
    dmin: ir.Value | None = None
    m: ir.Value | None = None  # Q4_1 / Q5_1's min, times the Q8_1 activation block's s (f32 at xs)


def _q2_k_unpack(row, i) -> _Block:
    # 84 bytes: scales 16 (low nibble scale, high nibble min), qs 64, d f16, dmin f16.
    # Value 128h + 32s + l: (qs[32h + l] >> 2s) & 3, scale and min j = value // 16
    b = row.b
    p = b.mul(i, _c64(84))
    prefetch(row, p, 84)
    sc = row.load("row", p, V16, align=1)
    scales = b.and_(sc, c8(15))
    groups = []
    for h in range(2):
        for hh in range(2):
            qs = row.load("row", b.add(p, _c64(16 + 32 * h + 16 * hh)), V16, align=1)
            for s in range(4):
                k = 8 * h + 2 * s + hh  # the 16-value group: values 16k..16k+15
                q = b.and_(b.lshr(qs, c8(2 * s)) if s else qs, c8(3))
                splat = b.shuffle_vector(scales, scales, ir.Constant(vec(I32, 16), [k] * 16))
                groups.append((k, b.mul(q, splat)))  # 0..45: the scale folded into the weights
    groups.sort(key=lambda kv: kv[0])
    mins = b.zext(b.lshr(sc, c8(4)), W16)
    d, dmin = row.half(b.add(p, _c64(80)), lane=2), row.half(b.add(p, _c64(82)), lane=3)
    # four chains of four `sdot` (one chain of 16 would wait on each sdot's latency in decode)
    return _Block([_Group([(w, 16 * k) for k, w in groups[4 * c:4 * c + 4]], None) for c in range(4)], d, mins, dmin)


def _q3_k_unpack(row, i) -> _Block:
    # 110 bytes: hmask 32, qs 64, scales 12, d f16. Value 128h + 32s + l: ((qs[32h + l] >> 2s) & 3)
    # + 4 * (bit 4h + s of hmask[l]) - 4, scale j = value // 16 (signed, -32..31)
    b = row.b
    p = b.mul(i, _c64(110))
    prefetch(row, p, 110)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (96, 100, 104)]
    s32 = b.sext(q3_k_scales(b, *words), vec(I32, 16))
    hm = [row.load("row", b.add(p, _c64(16 * hh)), V16, align=1) for hh in range(2)]
    groups: list[_Group | None] = [None] * 16
    for h in range(2):
        for hh in range(2):
            qs = row.load("row", b.add(p, _c64(32 + 32 * h + 16 * hh)), V16, align=1)
            for s in range(4):
                k = 8 * h + 2 * s + hh
                low = b.and_(b.lshr(qs, c8(2 * s)) if s else qs, c8(3))
                bit = 4 * h + s
                high = b.and_(b.lshr(hm[hh], c8(bit)) if bit else hm[hh], c8(1))
                q = b.sub(b.or_(low, b.shl(high, c8(2))), c8(4))  # -4..3
                groups[k] = _Group([(q, 16 * k)], lane_splat(b, s32, k))
    return _Block([g for g in groups if g is not None], row.half(b.add(p, _c64(108)), lane=3))


def _levels():
    return ir.Constant(V16, [int(v) for v in IQ4_LEVELS])


def _iq4_pair(b, q16):
    """16 packed bytes -> (levels of the low nibbles, levels of the high nibbles), <16 x i8> each."""
    table = _levels()
    return _tbl(b, table, b.and_(q16, c8(15))), _tbl(b, table, b.lshr(q16, c8(4)))


def _iq4_xs_unpack(row, i) -> _Block:
    # 136 bytes: d f16, scales_h u16, scales_l 4 bytes, qs 128 (16 per 32-value sub-block j: low
    # nibbles values 0-15, high 16-31); scale j = (nibble j of scales_l | 2 bits j of scales_h << 4) - 32
    b = row.b
    p = b.mul(i, _c64(136))
    prefetch(row, p, 136)
    v8 = vec(I32, 8)
    splat8 = lambda v: b.shuffle_vector(b.insert_element(ir.Constant(v8, ir.Undefined), v, ir.Constant(I32, 0)),  # noqa: E731
                                        ir.Constant(v8, ir.Undefined), ir.Constant(v8, [0] * 8))
    sh = splat8(b.zext(row.load("row", b.add(p, _c64(2)), I16, align=1), I32))
    sl = splat8(row.load("row", b.add(p, _c64(4)), I32, align=1))
    shv = b.and_(b.lshr(sh, ir.Constant(v8, [2 * j for j in range(8)])), ir.Constant(v8, [3] * 8))
    slv = b.and_(b.lshr(sl, ir.Constant(v8, [4 * j for j in range(8)])), ir.Constant(v8, [15] * 8))
    ls = b.sub(b.or_(slv, b.shl(shv, ir.Constant(v8, [4] * 8))), ir.Constant(v8, [32] * 8))  # -32..31
    groups = []
    for j in range(8):
        lo, hi = _iq4_pair(b, row.load("row", b.add(p, _c64(8 + 16 * j)), V16, align=1))
        groups.append(_Group([(lo, 32 * j), (hi, 32 * j + 16)], lane_splat(b, ls, j)))
    return _Block(groups, row.half(p))


def _iq4_nl_unpack(row, i) -> _Block:
    # 18 bytes per 32 values: d f16, 16 bytes of nibbles (values 0-15 low, 16-31 high)
    b = row.b
    p = b.mul(i, _c64(18))
    prefetch(row, p, 18)
    lo, hi = _iq4_pair(b, row.load("row", b.add(p, _c64(2)), V16, align=1))
    return _Block([_Group([(lo, 0), (hi, 16)], None)], row.half(p))


# sign byte and bit of each of the 16 values of an IQ3_S half sub-block (4 sign bytes per 32 values)
_SIGN_BIT = [1 << (k % 8) for k in range(16)]


def _nibble_pair(row, at):
    """The 16 bytes of nibbles at byte `at` of the row -> (values 0-15, values 16-31), <16 x i8> each."""
    b = row.b
    q16 = row.load("row", at, V16, align=1)
    return b.and_(q16, c8(15)), b.lshr(q16, c8(4))


def _fifth_bits(row, at):
    """The 32-bit qh word at byte `at` of the row -> (16 where bit j is set, for values 0-15 and 16-31):
    byte j // 8 of the word spread over the 16 lanes, tested against 1 << j % 8 (IQ3_S's signs)."""
    b = row.b
    qh = b.bitcast(row.load("row", at, I32, align=1), vec(I8, 4))
    out = []
    for half in range(2):
        sb = b.shuffle_vector(qh, qh, ir.Constant(vec(I32, 16), [2 * half + v // 8 for v in range(16)]))
        hit = b.icmp_unsigned("==", b.and_(sb, ir.Constant(V16, _SIGN_BIT)), ir.Constant(V16, _SIGN_BIT))
        out.append(b.and_(b.sext(hit, V16), c8(16)))
    return out


def _q4_0_unpack(row, i) -> _Block:
    # 18 bytes per 32 values: d f16, 16 bytes of nibbles; value = nibble - 8 (Q8_0 activations)
    b = row.b
    p = b.mul(i, _c64(18))
    prefetch(row, p, 18)
    lo, hi = _nibble_pair(row, b.add(p, _c64(2)))
    return _Block([_Group([(b.sub(lo, c8(8)), 0), (b.sub(hi, c8(8)), 16)], None)], row.half(p))


def _q5_0_unpack(row, i) -> _Block:
    # 22 bytes per 32 values: d f16, qh 4 bytes (bit j: value j's fifth bit), 16 bytes of nibbles;
    # value = (nibble | bit << 4) - 16
    b = row.b
    p = b.mul(i, _c64(22))
    prefetch(row, p, 22)
    lo, hi = _nibble_pair(row, b.add(p, _c64(6)))
    h_lo, h_hi = _fifth_bits(row, b.add(p, _c64(2)))
    w = [b.sub(b.or_(q, h), c8(16)) for q, h in ((lo, h_lo), (hi, h_hi))]
    return _Block([_Group([(w[0], 0), (w[1], 16)], None)], row.half(p))


def _q4_1_unpack(row, i) -> _Block:
    # 20 bytes per 32 values: d f16, m f16, 16 bytes of nibbles; value = d * nibble + m. The
    # nibbles (0..15) go into `sdot` as they are; m goes through the Q8_1 block's s
    b = row.b
    p = b.mul(i, _c64(20))
    prefetch(row, p, 20)
    lo, hi = _nibble_pair(row, b.add(p, _c64(4)))
    return _Block([_Group([(lo, 0), (hi, 16)], None)], row.half(p), m=row.half(b.add(p, _c64(2)), lane=1))


def _q5_1_unpack(row, i) -> _Block:
    # 24 bytes per 32 values: d f16, m f16, qh 4 bytes, 16 bytes of nibbles; value = d * (nibble |
    # bit << 4) + m (0..31 before d and m: `sdot` takes them as they are)
    b = row.b
    p = b.mul(i, _c64(24))
    prefetch(row, p, 24)
    lo, hi = _nibble_pair(row, b.add(p, _c64(8)))
    h_lo, h_hi = _fifth_bits(row, b.add(p, _c64(4)))
    return _Block([_Group([(b.or_(lo, h_lo), 0), (b.or_(hi, h_hi), 16)], None)], row.half(p),
                  m=row.half(b.add(p, _c64(2)), lane=1))


def _iq3_s_unpack(row, i) -> _Block:
    # 110 bytes: d f16, qs 64 (grid index low bits per 4 values), qh 8 (index bit 8 per group of
    # 4, one byte per 32 values), signs 32 (bit v % 8 of byte v // 8), scales 4 (a nibble per 32
    # values: 1 + 2 * nibble)
    b = row.b
    p = b.mul(i, _c64(110))
    prefetch(row, p, 110)
    scales = row.load("row", b.add(p, _c64(106)), I32, align=1)
    groups = []
    for k in range(8):
        qh = b.zext(row.load("row", b.add(p, _c64(66 + k)), I8), I32)
        grid = ir.Constant(vec(I32, 8), ir.Undefined)
        for g in range(8):
            lo = b.zext(row.load("row", b.add(p, _c64(2 + 8 * k + g)), I8), I32)
            hi = b.shl(b.and_(b.lshr(qh, ir.Constant(I32, g)) if g else qh, ir.Constant(I32, 1)), ir.Constant(I32, 8))
            grid = b.insert_element(grid, row.load("grid", b.zext(b.or_(lo, hi), I64), I32, align=4), ir.Constant(I32, g))
        grid = b.bitcast(grid, vec(I8, 32))
        signs = b.bitcast(row.load("row", b.add(p, _c64(74 + 4 * k)), I32, align=1), vec(I8, 4))
        vecs = []
        for half in range(2):
            g16 = b.shuffle_vector(grid, grid, ir.Constant(vec(I32, 16), list(range(16 * half, 16 * half + 16))))
            sb = b.shuffle_vector(signs, signs, ir.Constant(vec(I32, 16), [2 * half + v // 8 for v in range(16)]))
            bits = b.and_(sb, ir.Constant(V16, _SIGN_BIT))
            neg = b.sext(b.icmp_unsigned("==", bits, ir.Constant(V16, _SIGN_BIT)), V16)
            vecs.append((b.sub(b.xor(g16, neg), neg), 32 * k + 16 * half))  # -15..15
        nib = b.and_(b.lshr(scales, ir.Constant(I32, 4 * k)) if k else scales, ir.Constant(I32, 15))
        sc = b.add(b.shl(nib, ir.Constant(I32, 1)), ir.Constant(I32, 1))
        splat = b.insert_element(ir.Constant(V4, ir.Undefined), sc, ir.Constant(I32, 0))
        groups.append(_Group(vecs, b.shuffle_vector(splat, ir.Constant(V4, ir.Undefined), ir.Constant(V4, [0] * 4))))
    return _Block(groups, row.half(p))


def _block(unpack, values_per_block: int = 256):
    """int8_dot.row_codegen's block body: unpack block i once, then per scale group and token the
    `sdot`s (groups outer, tokens inner: a group's weight vectors and scale stay in registers
    while the tile's tokens pass them), one float multiply-add per token and block."""
    def block(row, a, i, accs):
        b = row.b
        blk = unpack(row, i)
        zero = ir.Constant(V4, [0] * 4)
        # one token (decode): two i32 chains, even and odd groups, so consecutive multiply-adds
        # do not wait on each other; a tile's tokens are independent chains already
        chains = 2 if row.ntok == 1 else 1
        isums = [[zero] * chains for _ in range(row.ntok)]
        base = [b.add(row.offset("xo", "xstride", t), b.mul(i, _c64(values_per_block))) for t in range(row.ntok)]
        for g, grp in enumerate(blk.groups):
            for t in range(row.ntok):
                s = zero
                for w, off in grp.vecs:
                    s = sdot(b, s, w, row.load("xq", b.add(base[t], _c64(off)), V16, align=1))
                acc = isums[t][g % chains]
                isums[t][g % chains] = b.add(acc, s if grp.scale is None else b.mul(s, grp.scale))
        for t in range(row.ntok):
            isum = isums[t][0] if chains == 1 else b.add(isums[t][0], isums[t][1])
            xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
            accumulate(b, accs[t], isum, b.fmul(blk.d, xd))
            if blk.mins is not None:
                sums = row.load("xs", b.add(row.offset("so", "sstride", t), b.mul(i, _c64(16))), W16, align=2)
                accumulate(b, accs[t], fold(b, pair_sums(b, sums, blk.mins)),
                            b.fsub(ir.Constant(F32, 0.0), b.fmul(blk.dmin, xd)))
            if blk.m is not None:
                # m * s, s = f16(d * sum q) per Q8_1 block (llama.cpp's y.s), into lane 0 of the accumulator
                s = row.load("xs", b.add(row.offset("so", "sstride", t), i), F32)
                term = b.insert_element(ir.Constant(vec(F32, 4), [0.0] * 4), b.fmul(blk.m, s), ir.Constant(I32, 0))
                b.store(b.fadd(b.load(accs[t]), term), accs[t])
    return block


def _arm_only(name: str) -> None:
    from engine.quant import paths

    if not paths.target().level.is_arm:
        raise TypeError(f"the {name} integer rows are arm64 `sdot` code (neon-dotprod, neon-i8mm); "
                        "kernels.has_int8_kernels keeps every other target off them")


_UNPACK = {"Q2_K": _q2_k_unpack, "Q3_K": _q3_k_unpack, "IQ4_XS": _iq4_xs_unpack, "IQ3_S": _iq3_s_unpack}
# one signature for the four Q8_K formats (xs: Q2_K's mins only; grid: IQ3_S's lattice only)
_Q8K_ROW = ("row", "nb", "xq", "xd", "xs", "grid")
_Q8K_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "xs", "so", "sstride", "res", "grid")
_Q8_0_ROW = ("row", "nb", "xq", "xd")
_Q8_0_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "res")


def _q8k_row(name: str):
    def typer(typingctx, row, nb, xq, xd, xs, grid):
        _arm_only(name)
        return types.float32(row, nb, xq, xd, xs, grid), row_codegen(_Q8K_ROW, 1, _block(_UNPACK[name]), lanes=4)
    typer.__name__ = f"{name.lower()}_row_dot"
    return intrinsic(typer)


def _q8k_tile(name: str):
    def typer(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
        _arm_only(name)
        sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid)
        return sig, row_codegen(_Q8K_TILE, WIDE_TILE, _block(_UNPACK[name]), lanes=4)
    typer.__name__ = f"{name.lower()}_row_dot_tile"
    return intrinsic(typer)


# The row (nb blocks) times one token's Q8_K activations (xq int8, xd block scales, xs int16 sums
# per 16 values), as float32; the tiles: res[t] = the row times token t's activations for
# t < WIDE_TILE (token t's values at xq[xo + t*xstride:], scales at xd[do + t*dstride:], sums at
# xs[so + t*sstride:]). grid: IQ3_S's 512 lattice rows as uint32.
q2_k_row_dot, q2_k_row_dot_tile = _q8k_row("Q2_K"), _q8k_tile("Q2_K")
q3_k_row_dot, q3_k_row_dot_tile = _q8k_row("Q3_K"), _q8k_tile("Q3_K")
iq4_xs_row_dot, iq4_xs_row_dot_tile = _q8k_row("IQ4_XS"), _q8k_tile("IQ4_XS")
iq3_s_row_dot, iq3_s_row_dot_tile = _q8k_row("IQ3_S"), _q8k_tile("IQ3_S")


_Q8_1_ROW = ("row", "nb", "xq", "xd", "xs")
_Q8_1_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "xs", "so", "sstride", "res")
# the 32-value formats' unpackers: Q8_0 activations (IQ4_NL, Q4_0, Q5_0), Q8_1 ones (Q4_1, Q5_1)
_UNPACK_32 = {"IQ4_NL": _iq4_nl_unpack, "Q4_0": _q4_0_unpack, "Q5_0": _q5_0_unpack, "Q4_1": _q4_1_unpack,
              "Q5_1": _q5_1_unpack}


def _q8_0_row(name: str):
    def typer(typingctx, row, nb, xq, xd):
        _arm_only(name)
        return types.float32(row, nb, xq, xd), row_codegen(_Q8_0_ROW, 1, _block(_UNPACK_32[name], 32), lanes=4)
    typer.__name__ = f"{name.lower()}_row_dot"
    return intrinsic(typer)


def _q8_0_tile(name: str):
    def typer(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, res):
        _arm_only(name)
        sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, res)
        return sig, row_codegen(_Q8_0_TILE, WIDE_TILE, _block(_UNPACK_32[name], 32), lanes=4)
    typer.__name__ = f"{name.lower()}_row_dot_tile"
    return intrinsic(typer)


def _q8_1_row(name: str):
    def typer(typingctx, row, nb, xq, xd, xs):
        _arm_only(name)
        return types.float32(row, nb, xq, xd, xs), row_codegen(_Q8_1_ROW, 1, _block(_UNPACK_32[name], 32), lanes=4)
    typer.__name__ = f"{name.lower()}_row_dot"
    return intrinsic(typer)


def _q8_1_tile(name: str):
    def typer(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res):
        _arm_only(name)
        sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res)
        return sig, row_codegen(_Q8_1_TILE, WIDE_TILE, _block(_UNPACK_32[name], 32), lanes=4)
    typer.__name__ = f"{name.lower()}_row_dot_tile"
    return intrinsic(typer)


# The row (nb blocks of 32) times one token's Q8_0 activations (xq int8, xd f32 per 32 values), as
# float32; Q8_1's add xs (f32 = f16(d * sum q) per 32 values). The tiles: res[t] for t < WIDE_TILE.
iq4_nl_row_dot, iq4_nl_row_dot_tile = _q8_0_row("IQ4_NL"), _q8_0_tile("IQ4_NL")
q4_0_row_dot, q4_0_row_dot_tile = _q8_0_row("Q4_0"), _q8_0_tile("Q4_0")
q5_0_row_dot, q5_0_row_dot_tile = _q8_0_row("Q5_0"), _q8_0_tile("Q5_0")
q4_1_row_dot, q4_1_row_dot_tile = _q8_1_row("Q4_1"), _q8_1_tile("Q4_1")
q5_1_row_dot, q5_1_row_dot_tile = _q8_1_row("Q5_1"), _q8_1_tile("Q5_1")


# ----------------------------------------------------------------------------- drivers
# lowbit_kernels' signatures (MatvecPlan calls both alike): decode (w, xq, xd, xs16, out), IQ4_NL
# (w, xq, xd, out); several tokens the same with Tp*cols activations (Tp a multiple of WIDE_TILE,
# padding tokens zeros) and out (Tp, rows). One kernel per format, so a plan compiles only its
# own (under qemu each compile is tens of seconds). Rows in chunks of 16 (int8_kernels.mm_k_q8k).

@njit(**_MV)
def _mv_q2_k(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q2_k_row_dot(w[r], nb, xq, xd, xs16, G3S_U32)


@njit(**_MV)
def _mv_q3_k(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q3_k_row_dot(w[r], nb, xq, xd, xs16, G3S_U32)


@njit(**_MV)
def _mv_iq4_xs(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = iq4_xs_row_dot(w[r], nb, xq, xd, xs16, G3S_U32)


@njit(**_MV)
def _mv_iq3_s(w, xq, xd, xs16, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = iq3_s_row_dot(w[r], nb, xq, xd, xs16, G3S_U32)


@njit(**_MV)
def _mv_iq4_nl(w, xq, xd, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = iq4_nl_row_dot(w[r], nb, xq, xd)


@njit(**_MV)
def _mv_q4_0(w, xq, xd, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q4_0_row_dot(w[r], nb, xq, xd)


@njit(**_MV)
def _mv_q5_0(w, xq, xd, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q5_0_row_dot(w[r], nb, xq, xd)


@njit(**_MV)
def _mv_q4_1(w, xq, xd, xs, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q4_1_row_dot(w[r], nb, xq, xd, xs)


@njit(**_MV)
def _mv_q5_1(w, xq, xd, xs, out):
    nb = xd.shape[0]
    for r in prange(w.shape[0]):
        out[r] = q5_1_row_dot(w[r], nb, xq, xd, xs)


_ROW_CHUNK = 16


@njit(**_MV)
def _mm_q2_k(w, xq, xd, xs16, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                q2_k_row_dot_tile(w[r], nb, xq, t0 * nb * 256, nb * 256, xd, t0 * nb, nb, xs16, t0 * nb * 16, nb * 16,
                                  res, G3S_U32)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_q3_k(w, xq, xd, xs16, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                q3_k_row_dot_tile(w[r], nb, xq, t0 * nb * 256, nb * 256, xd, t0 * nb, nb, xs16, t0 * nb * 16, nb * 16,
                                  res, G3S_U32)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_iq4_xs(w, xq, xd, xs16, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                iq4_xs_row_dot_tile(w[r], nb, xq, t0 * nb * 256, nb * 256, xd, t0 * nb, nb, xs16, t0 * nb * 16, nb * 16,
                                    res, G3S_U32)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_iq3_s(w, xq, xd, xs16, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                iq3_s_row_dot_tile(w[r], nb, xq, t0 * nb * 256, nb * 256, xd, t0 * nb, nb, xs16, t0 * nb * 16, nb * 16,
                                   res, G3S_U32)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_iq4_nl(w, xq, xd, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                iq4_nl_row_dot_tile(w[r], nb, xq, t0 * nb * 32, nb * 32, xd, t0 * nb, nb, res)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_q4_0(w, xq, xd, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                q4_0_row_dot_tile(w[r], nb, xq, t0 * nb * 32, nb * 32, xd, t0 * nb, nb, res)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_q5_0(w, xq, xd, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                q5_0_row_dot_tile(w[r], nb, xq, t0 * nb * 32, nb * 32, xd, t0 * nb, nb, res)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_q4_1(w, xq, xd, xs, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                q4_1_row_dot_tile(w[r], nb, xq, t0 * nb * 32, nb * 32, xd, t0 * nb, nb, xs, t0 * nb, nb, res)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


@njit(**_MV)
def _mm_q5_1(w, xq, xd, xs, out):
    tp, rows = out.shape
    nb = xd.shape[0] // tp
    for c in prange((rows + _ROW_CHUNK - 1) // _ROW_CHUNK):
        res = np.empty(WIDE_TILE, np.float32)
        for t0 in range(0, tp, WIDE_TILE):
            for r in range(c * _ROW_CHUNK, min(rows, (c + 1) * _ROW_CHUNK)):
                q5_1_row_dot_tile(w[r], nb, xq, t0 * nb * 32, nb * 32, xd, t0 * nb, nb, xs, t0 * nb, nb, res)
                for t in range(WIDE_TILE):
                    out[t0 + t, r] = res[t]


MATVEC_INT8: dict[T, Any] = {T.Q2_K: _mv_q2_k, T.Q3_K: _mv_q3_k, T.IQ4_XS: _mv_iq4_xs, T.IQ3_S: _mv_iq3_s, T.IQ4_NL: _mv_iq4_nl,
                             T.Q4_0: _mv_q4_0, T.Q5_0: _mv_q5_0, T.Q4_1: _mv_q4_1, T.Q5_1: _mv_q5_1}
MULTI_TOKEN_INT8: dict[T, Any] = {T.Q2_K: _mm_q2_k, T.Q3_K: _mm_q3_k, T.IQ4_XS: _mm_iq4_xs, T.IQ3_S: _mm_iq3_s,
                                  T.IQ4_NL: _mm_iq4_nl, T.Q4_0: _mm_q4_0, T.Q5_0: _mm_q5_0, T.Q4_1: _mm_q4_1,
                                  T.Q5_1: _mm_q5_1}
