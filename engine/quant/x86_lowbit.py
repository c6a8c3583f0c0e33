"""Integer rows and tiles for the smaller downloads' formats on x86 (AVX2 and up), in x86 intrinsics.

Q2_K, Q3_K, Q5_K (the Q3_K_M / IQ4_XS mixes' attn_v and ffn_down), IQ4_XS and IQ3_S times Q8_K activations, IQ4_NL times Q8_0 activations (int8 +
f32 scale per 32, `activations.quantize_q8_0` into an int8 array): llama.cpp's AVX2 scheme
(ggml-cpu/arch/x86/quants.c), one 256-bit vector per run of 32 weights, an <8 x float>
accumulator carried across the row and one horizontal sum per row (int8_dot._row_codegen).
The instructions are named (`x86_call`), so no InstCombine rewrite can lose them (int8_dot.py's
generic IR needed run-time knobs for that). Every x86 level from AVX2 up runs these same
256-bit rows: decode streams the weights from DRAM and a 512-bit body would wait on the same
bytes (the Q4_K/Q6_K rows are 256-bit on AVX-512 too). The prefill tiles of IQ4_XS, Q3_K and Q5_K
have 512-bit AVX-512 VNNI forms (`_iq4_xs_block_512`, `_q3_k_block_512`, `_q5_k_block_512`, at the end of this file),
which lowbit_kernels chooses on that level (paths.X86_LOWBIT_VNNI512).

* Q2_K, Q3_K, Q5_K: weights unsigned (Q2_K 0..3, Q3_K 0..7 after adding the high bit as +4,
  Q5_K 0..31), so `vpmaddubsw` (u8 x s8 -> i16 pairs) then `vpmaddwd` by the run's scales.
  Q2_K's and Q5_K's mins and Q3_K's -4 offset go through the activations' int16 sums per 16
  values (Q6_K's -32 offset does the same in int8_dot).
* IQ4_XS, IQ4_NL: the 16 non-linear levels (gguf's kvalues) looked up with `vpshufb` from the
  nibbles; the levels are signed, so `vpsignb` moves the sign onto the activations first
  (|level| <= 127, |x| <= 127: a pair sum is at most 32258, no saturation).
* IQ3_S: 8 grid rows (4 unsigned bytes each, 1..15) gathered per 32 values from the 512-entry
  lattice (passed in as a uint32 array), the 32 sign bits expanded to byte masks with `vpshufb`
  + compare and applied to the activations ((x ^ m) - m).

IQ3_XXS (not in issue 20's list) keeps the float rows. arm64 keeps the float rows for all of
these (no NEON counterpart yet): engine/quant/paths.py says so per format.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from engine.quant.int8_dot import (F32, I8, I16, I32, I64, WIDE_TILE, GroupScales, _accumulate, _both_halves, _prefetch,
                                   _q4_k_scales_mins, _row_codegen, _vec, _widen8, x86_call)
from engine.quant.lowbit import IQ4_LEVELS

V8 = _vec(I8, 32)
W16 = _vec(I16, 16)
D32 = _vec(I32, 8)


def _c64(v: int):
    return ir.Constant(I64, v)


def _bytes(v: int | list[int]):
    return ir.Constant(V8, v if isinstance(v, list) else [v] * 32)


def _maddubs(b, u8, s8):
    """u8 x s8 -> <16 x i16> saturated pair sums (`vpmaddubsw`)."""
    return x86_call(b, "llvm.x86.avx2.pmadd.ub.sw", W16, [u8, s8])


def _madd(b, a16, b16):
    """i16 x i16 -> <8 x i32> pair sums (`vpmaddwd`)."""
    return x86_call(b, "llvm.x86.avx2.pmadd.wd", D32, [a16, b16])


def _sign(b, v, by):
    """v negated where `by` is negative, zeroed where it is zero (`vpsignb`)."""
    return x86_call(b, "llvm.x86.avx2.psign.b", V8, [v, by])


def _pshufb(b, table, idx):
    """table[idx] per byte within each 128-bit lane (`vpshufb`)."""
    return x86_call(b, "llvm.x86.avx2.pshuf.b", V8, [table, idx])


def _splat16(b, scalar_i32, n: int = 16):
    v = b.insert_element(ir.Constant(_vec(I16, n), ir.Undefined), b.trunc(scalar_i32, I16), ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(_vec(I16, n), ir.Undefined), ir.Constant(_vec(I32, n), [0] * n))


def _lane_splat(b, v16, lanes: list[int]):
    """<16 x i16> from lanes of the <16 x i16> v16 (a run's scales laid out against its pairs)."""
    return b.shuffle_vector(v16, v16, ir.Constant(_vec(I32, len(lanes)), lanes))


def _run_scales(b, all16, r: int):
    """Scales of run r (values 32r..32r+31) of a 16-scale K block: scale 2r against the first
    16 values (i16 lanes 0-7 of `vpmaddubsw`'s result), 2r + 1 against the next 16."""
    return _lane_splat(b, all16, [2 * r + (k >= 8) for k in range(16)])


def _levels_table():
    """The IQ4 levels in both 128-bit lanes (`vpshufb` looks up within a lane)."""
    return _bytes([int(v) for v in IQ4_LEVELS] * 2)


def _iq4_lookup(b, q16):
    """16 packed bytes -> their 32 signed levels: low nibbles (values 0-15) then high (16-31)."""
    m4 = ir.Constant(_vec(I8, 16), [15] * 16)
    lo = b.and_(q16, m4)
    hi = b.and_(b.lshr(q16, ir.Constant(_vec(I8, 16), [4] * 16)), m4)
    idx = b.shuffle_vector(lo, hi, ir.Constant(_vec(I32, 32), list(range(32))))
    return _pshufb(b, _levels_table(), idx)


@dataclass
class _Run:
    """32 weights of a block as unsigned bytes for `vpmaddubsw`, the <16 x i16> scales against
    its 16 pair sums, and what the activations need first (IQ4: the levels' signs, IQ3_S: the
    sign bits), applied per token."""

    weights: ir.Value
    scales: ir.Value
    xform: Callable[[ir.IRBuilder, ir.Value], ir.Value] | None = None


@dataclass
class _Block:
    """A weight block unpacked once for all the tile's tokens: its runs (run r against the
    token's activations 32r..32r+31 of the block), the f16 scale d, and an optional term
    through the activations' int16 sums per 16 values: Q3_K's -4 offset (times d) or Q2_K's
    mins (times -dmin)."""

    runs: list[_Run]
    d: ir.Value
    by_sums: ir.Value | None = None
    dmin: ir.Value | None = None


def _token_dot(row, blk: _Block, i, t: int, values_per_block: int, accs) -> None:
    """Token t's share of block i: the runs' integer sums, scaled into its accumulator."""
    b = row.b
    o = b.add(row.offset("xo", "xstride", t), b.mul(i, _c64(values_per_block)))
    isum = ir.Constant(D32, [0] * 8)
    for r, run in enumerate(blk.runs):
        x = row.load("xq", b.add(o, _c64(32 * r)), V8, align=1)
        if run.xform is not None:
            x = run.xform(b, x)
        isum = b.add(isum, _madd(b, _maddubs(b, run.weights, x), run.scales))
    xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
    sums = None
    if blk.by_sums is not None:
        sums = row.load("xs", b.add(row.offset("so", "sstride", t), b.mul(i, _c64(16))), W16, align=2)
    if blk.by_sums is not None and blk.dmin is None:
        isum = b.add(isum, _madd(b, sums, blk.by_sums))
    _accumulate(b, accs[t], isum, b.fmul(blk.d, xd))
    if blk.dmin is not None:
        _accumulate(b, accs[t], _madd(b, sums, blk.by_sums), b.fsub(ir.Constant(F32, 0.0), b.fmul(blk.dmin, xd)))


def _signed_run(b, w, scales) -> _Run:
    """A run of signed int8 weights: |w| for `vpmaddubsw` and w's signs moved onto the
    activations (llama.cpp's mul_add_epi8; |w| <= 127, |x| <= 127, so no pair saturates)."""
    return _Run(_sign(b, w, w), scales, lambda bb, x: _sign(bb, x, w))


def _q2_k_unpack(row, i) -> _Block:
    # 84 bytes: scales 16 (low nibble scale, high nibble min), qs 64, d f16, dmin f16.
    # Value 128h + 32s + l: (qs[32h + l] >> 2s) & 3, scale and min j = value // 16
    b = row.b
    p = b.mul(i, _c64(84))
    _prefetch(row, p, 84)
    d, dmin = row.half(b.add(p, _c64(80)), lane=2), row.half(b.add(p, _c64(82)), lane=3)  # inside the block
    sc = row.load("row", p, _vec(I8, 16), align=1)
    scales = b.zext(b.and_(sc, ir.Constant(_vec(I8, 16), [15] * 16)), W16)
    mins = b.zext(b.lshr(sc, ir.Constant(_vec(I8, 16), [4] * 16)), W16)
    runs = []
    for h in range(2):
        qs = row.load("row", b.add(p, _c64(16 + 32 * h)), V8, align=1)
        for s in range(4):
            q = b.and_(b.lshr(qs, _bytes(2 * s)) if s else qs, _bytes(3))
            runs.append(_Run(q, _run_scales(b, scales, 4 * h + s)))
    return _Block(runs, d, mins, dmin)


def _q3_k_scales(b, u0, u1, u2):
    """The 12 packed 6-bit scale bytes (three little-endian i32) -> <16 x i8> scales - 32
    (llama.cpp's kmask1/kmask2 unpacking: scale j's low nibble in nibble j // 8 of byte j % 8,
    its top 2 bits at bit 2 * (j // 4) of byte 8 + j % 4)."""
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    k1, k2 = c(0x03030303), c(0x0F0F0F0F)
    parts = (
        b.or_(b.and_(u0, k2), b.shl(b.and_(u2, k1), c(4))),
        b.or_(b.and_(u1, k2), b.shl(b.and_(b.lshr(u2, c(2)), k1), c(4))),
        b.or_(b.and_(b.lshr(u0, c(4)), k2), b.shl(b.and_(b.lshr(u2, c(4)), k1), c(4))),
        b.or_(b.and_(b.lshr(u1, c(4)), k2), b.shl(b.and_(b.lshr(u2, c(6)), k1), c(4))),
    )
    v = ir.Constant(_vec(I32, 4), ir.Undefined)
    for k, part in enumerate(parts):
        v = b.insert_element(v, part, c(k))
    return b.sub(b.bitcast(v, _vec(I8, 16)), ir.Constant(_vec(I8, 16), [32] * 16))


def _q3_k_unpack(row, i) -> _Block:
    # 110 bytes: hmask 32, qs 64, scales 12, d f16. Value 128h + 32s + l: ((qs[32h + l] >> 2s) & 3)
    # + 4 * (bit 4h + s of hmask[l]) - 4, scale j = value // 16
    b = row.b
    p = b.mul(i, _c64(110))
    _prefetch(row, p, 110)
    d = row.half(b.add(p, _c64(108)), lane=3)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (96, 100, 104)]
    all16 = b.sext(_q3_k_scales(b, *words), W16)
    hm = row.load("row", p, V8, align=1)
    runs = []
    for h in range(2):
        qs = row.load("row", b.add(p, _c64(32 + 32 * h)), V8, align=1)
        for s in range(4):
            low = b.and_(b.lshr(qs, _bytes(2 * s)) if s else qs, _bytes(3))
            k = 4 * h + s
            high = b.and_(b.lshr(hm, _bytes(k)) if k else hm, _bytes(1))
            q = b.or_(low, b.shl(high, _bytes(2)))  # 0..7: the -4 goes through the sums
            runs.append(_Run(q, _run_scales(b, all16, k)))
    return _Block(runs, d, b.mul(all16, ir.Constant(W16, [-4] * 16)))  # |-4 scale| <= 128


def _q5_k_unpack(row, i) -> _Block:
    # 176 bytes: d f16, dmin f16, scales 12 (Q4_K's 6-bit scales and mins), qh 32, qs 128.
    # Run r = 2c + k (values 32r..): ((qs[32c + l] >> 4k) & 15) | ((qh[l] >> r) & 1) << 4,
    # scale and min r
    b = row.b
    p = b.mul(i, _c64(176))
    _prefetch(row, p, 176)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (4, 8, 12)]
    packed = b.zext(_q4_k_scales_mins(b, *words), W16)  # lanes 0-7 scales, 8-15 mins
    qh = row.load("row", b.add(p, _c64(16)), V8, align=1)
    runs = []
    for c in range(4):
        qs = row.load("row", b.add(p, _c64(48 + 32 * c)), V8, align=1)
        for k in range(2):
            r = 2 * c + k
            low = b.and_(b.lshr(qs, _bytes(4)) if k else qs, _bytes(15))
            high = b.and_(b.lshr(qh, _bytes(r)) if r else qh, _bytes(1))
            runs.append(_Run(b.or_(low, b.shl(high, _bytes(4))), _lane_splat(b, packed, [r] * 16)))
    mins = _lane_splat(b, packed, [8 + k // 2 for k in range(16)])  # min r against sums 2r, 2r + 1
    return _Block(runs, row.half(p), mins, row.half(b.add(p, _c64(2))))


def _splat_i32(b, v):
    one = b.insert_element(ir.Constant(D32, ir.Undefined), v, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(D32, ir.Undefined), ir.Constant(D32, [0] * 8))


def _iq4_xs_unpack(row, i) -> _Block:
    # 136 bytes: d f16, scales_h u16, scales_l 4 bytes, qs 128 (16 per 32-value sub-block j:
    # low nibbles values 0-15, high 16-31); scale j = (nibble j of scales_l | 2 bits j of scales_h << 4) - 32
    b = row.b
    p = b.mul(i, _c64(136))
    _prefetch(row, p, 136)
    d = row.half(p)
    sh = b.zext(row.load("row", b.add(p, _c64(2)), I16, align=1), I32)
    sl = row.load("row", b.add(p, _c64(4)), I32, align=1)
    shv = b.and_(b.lshr(_splat_i32(b, sh), ir.Constant(D32, [2 * j for j in range(8)])), ir.Constant(D32, [3] * 8))
    slv = b.and_(b.lshr(_splat_i32(b, sl), ir.Constant(D32, [4 * j for j in range(8)])), ir.Constant(D32, [15] * 8))
    ls = b.sub(b.or_(slv, b.shl(shv, ir.Constant(D32, [4] * 8))), ir.Constant(D32, [32] * 8))
    ls16 = b.trunc(ls, _vec(I16, 8))
    runs = []
    for j in range(8):
        w = _iq4_lookup(b, row.load("row", b.add(p, _c64(8 + 16 * j)), _vec(I8, 16), align=1))
        runs.append(_signed_run(b, w, b.shuffle_vector(ls16, ls16, ir.Constant(_vec(I32, 16), [j] * 16))))
    return _Block(runs, d)


def _iq4_nl_unpack(row, i) -> _Block:
    # 18 bytes per 32 values: d f16, 16 bytes of nibbles; Q8_0 activations (int8, f32 per 32)
    b = row.b
    p = b.mul(i, _c64(18))
    _prefetch(row, p, 18)
    w = _iq4_lookup(b, row.load("row", b.add(p, _c64(2)), _vec(I8, 16), align=1))
    return _Block([_signed_run(b, w, ir.Constant(W16, [1] * 16))], row.half(p))


# bit v % 8 of sign byte v // 8, for the 32 values of an IQ3_S sub-block (vpshufb within a lane:
# the upper lane's indices 2, 3 are bytes 18, 19 of the broadcast, the same sign bytes)
_SIGN_BYTE = [0] * 8 + [1] * 8 + [2] * 8 + [3] * 8
_SIGN_BIT = [1 << (k % 8) for k in range(32)]


def _negate_where(neg):
    return lambda b, x: b.sub(b.xor(x, neg), neg)


def _iq3_s_unpack(row, i) -> _Block:
    # 110 bytes: d f16, qs 64 (grid index low bits per 4 values), qh 8 (index bit 8), signs 32,
    # scales 4 (a nibble per 32 values: 1 + 2 * nibble)
    b = row.b
    p = b.mul(i, _c64(110))
    _prefetch(row, p, 110)
    scales = row.load("row", b.add(p, _c64(106)), I32, align=1)
    runs = []
    for k in range(8):
        qh = b.zext(row.load("row", b.add(p, _c64(66 + k)), I8), I32)
        grid = ir.Constant(D32, ir.Undefined)
        for g in range(8):
            lo = b.zext(row.load("row", b.add(p, _c64(2 + 8 * k + g)), I8), I32)
            hi = b.shl(b.and_(b.lshr(qh, ir.Constant(I32, g)) if g else qh, ir.Constant(I32, 1)), ir.Constant(I32, 8))
            entry = row.load("grid", b.zext(b.or_(lo, hi), I64), I32, align=4)
            grid = b.insert_element(grid, entry, ir.Constant(I32, g))
        signs = b.bitcast(_splat_i32(b, row.load("row", b.add(p, _c64(74 + 4 * k)), I32, align=1)), V8)
        bits = b.and_(_pshufb(b, signs, _bytes(_SIGN_BYTE)), _bytes(_SIGN_BIT))
        neg = b.sext(b.icmp_unsigned("==", bits, _bytes(_SIGN_BIT)), V8)
        nib = b.and_(b.lshr(scales, ir.Constant(I32, 4 * k)) if k else scales, ir.Constant(I32, 15))
        sc = b.add(b.shl(nib, ir.Constant(I32, 1)), ir.Constant(I32, 1))
        runs.append(_Run(b.bitcast(grid, V8), _splat16(b, sc), _negate_where(neg)))
    return _Block(runs, row.half(p))


def _block(unpack, values_per_block: int = 256):
    """int8_dot._row_codegen's block body: unpack block i once, then each token's products
    (runs outer, tokens inner in x86_avx2.py's tiles; here the runs of a block are few enough
    registers for the tile's 4 tokens to pass them)."""
    def block(row, a, i, accs):
        blk = unpack(row, i)
        for t in range(row.ntok):
            _token_dot(row, blk, i, t, values_per_block, accs)
    return block


def _x86_only(name: str) -> None:
    from engine.quant import paths

    if paths.target().level not in paths.X86_INT8_LEVELS:
        raise TypeError(f"the {name} integer rows are x86 intrinsics (AVX2 and up); kernels.has_int8_kernels "
                        "keeps every other target on the float rows")


_Q8K_ROW = ("row", "nb", "xq", "xd", "xs")
_IQ3_S_ROW = ("row", "nb", "xq", "xd", "grid")
_Q8_0_ROW = ("row", "nb", "xq", "xd")


@intrinsic
def q2_k_row_dot(typingctx, row, nb, xq, xd, xs):
    """The Q2_K row (nb blocks) times one token's Q8_K activations (xq int8, xd block scales, xs
    int16 sums per 16 values), as float32."""
    _x86_only("Q2_K")
    return types.float32(row, nb, xq, xd, xs), _row_codegen(_Q8K_ROW, 1, _block(_q2_k_unpack))


@intrinsic
def q3_k_row_dot(typingctx, row, nb, xq, xd, xs):
    """`q2_k_row_dot` for a Q3_K row."""
    _x86_only("Q3_K")
    return types.float32(row, nb, xq, xd, xs), _row_codegen(_Q8K_ROW, 1, _block(_q3_k_unpack))


@intrinsic
def q5_k_row_dot(typingctx, row, nb, xq, xd, xs):
    """`q2_k_row_dot` for a Q5_K row (x86; arm64 has arm_neon.py's)."""
    _x86_only("Q5_K")
    return types.float32(row, nb, xq, xd, xs), _row_codegen(_Q8K_ROW, 1, _block(_q5_k_unpack))


@intrinsic
def iq4_xs_row_dot(typingctx, row, nb, xq, xd):
    """The IQ4_XS row times one token's Q8_K activations (no sums needed: no offsets), as float32."""
    _x86_only("IQ4_XS")
    return types.float32(row, nb, xq, xd), _row_codegen(_Q8_0_ROW, 1, _block(_iq4_xs_unpack))


@intrinsic
def iq3_s_row_dot(typingctx, row, nb, xq, xd, grid):
    """The IQ3_S row times one token's Q8_K activations; grid: the 512 lattice rows as uint32."""
    _x86_only("IQ3_S")
    return types.float32(row, nb, xq, xd, grid), _row_codegen(_IQ3_S_ROW, 1, _block(_iq3_s_unpack))


@intrinsic
def iq4_nl_row_dot(typingctx, row, nb, xq, xd):
    """The IQ4_NL row (nb blocks of 32) times one token's Q8_0 activations (xq int8, xd f32 per
    32 values), as float32."""
    _x86_only("IQ4_NL")
    return types.float32(row, nb, xq, xd), _row_codegen(_Q8_0_ROW, 1, _block(_iq4_nl_unpack, 32))


# Several tokens per weight block (a prefill's products): the block is unpacked once for TILE
# tokens; token t's activations at xq[xo + t*xstride:], block scales at xd[do + t*dstride:],
# sums at xs[so + t*sstride:], results to res[t]. One signature for the four Q8_K formats
# (grid: IQ3_S's lattice, unused by the others; xs: unused by IQ4_XS and IQ3_S).
TILE = WIDE_TILE  # the K formats' tile: one Q8KTokens quantization serves all of a layer's products
_Q8K_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "xs", "so", "sstride", "res", "grid")
_Q8_0_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "res")
_Q8K_UNPACK = {"Q2_K": _q2_k_unpack, "Q3_K": _q3_k_unpack, "IQ4_XS": _iq4_xs_unpack, "IQ3_S": _iq3_s_unpack,
               "Q5_K": _q5_k_unpack}


def _q8k_tile(name: str, args):
    _x86_only(name)
    return types.void(*args), _row_codegen(_Q8K_TILE, TILE, _block(_Q8K_UNPACK[name]))


@intrinsic
def q2_k_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
    """res[t] = the Q2_K row times token t's Q8_K activations for t < TILE."""
    return _q8k_tile("Q2_K", (row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid))


@intrinsic
def q3_k_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
    """`q2_k_row_dot_tile` for a Q3_K row."""
    return _q8k_tile("Q3_K", (row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid))


@intrinsic
def q5_k_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
    """`q2_k_row_dot_tile` for a Q5_K row."""
    return _q8k_tile("Q5_K", (row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid))


@intrinsic
def iq4_xs_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
    """`q2_k_row_dot_tile` for an IQ4_XS row."""
    return _q8k_tile("IQ4_XS", (row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid))


@intrinsic
def iq3_s_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
    """`q2_k_row_dot_tile` for an IQ3_S row."""
    return _q8k_tile("IQ3_S", (row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid))


@intrinsic
def iq4_nl_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, res):
    """res[t] = the IQ4_NL row times token t's Q8_0 activations (int8) for t < TILE."""
    _x86_only("IQ4_NL")
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, res)
    return sig, _row_codegen(_Q8_0_TILE, TILE, _block(_iq4_nl_unpack, 32))


# AVX-512 VNNI (Zen 4/5, Ice Lake and later): IQ4_XS's tile in 512-bit vectors, `vpdpbusd` as
# x86_avx512.py's Q4_K tile. vpdpbusd multiplies unsigned weights by signed activations and
# there is no 512-bit `vpsignb` to move the levels' signs across, so the levels are looked up
# biased by +128 (1..241, unsigned) and the bias comes back through the Q8_K sums:
# sum (l + 128) x = sum l x + 128 sum x, with sum x = bsums[2j] + bsums[2j + 1] per sub-block j.
# A 4-value lane reaches 4 * 241 * 127 = 122428, past int16, so the sub-block scales multiply
# the i32 lanes (`vpmulld`) instead of x86_avx512.py's vpackssdw + vpdpwssd.
_IQ4_LEVELS_U8 = [int(v) + 128 for v in IQ4_LEVELS] * 4
# 64 nibble indices from a 32-byte run of two sub-blocks in value order: the 128-bit lanes are
# (sub-block 2c low nibbles, its high nibbles, 2c + 1 low, 2c + 1 high); the high nibbles shift
# down per 16-bit lane (vpsrlvw), the & 15 drops what crosses from the neighbouring byte
_IQ4_SPREAD = list(range(16)) * 2 + list(range(16, 32)) * 2
_IQ4_SHIFT = ([0] * 8 + [4] * 8) * 2


def _iq4_xs_block_512(row, a, i, accs):
    b = row.b
    v64, v16, w32 = _vec(I8, 64), _vec(I32, 16), _vec(I16, 32)
    p = b.mul(i, _c64(136))
    _prefetch(row, p, 136)
    d = row.half(p)
    sh = b.zext(row.load("row", b.add(p, _c64(2)), I16, align=1), I32)
    sl = row.load("row", b.add(p, _c64(4)), I32, align=1)
    shv = b.and_(b.lshr(_splat_i32(b, sh), ir.Constant(D32, [2 * j for j in range(8)])), ir.Constant(D32, [3] * 8))
    slv = b.and_(b.lshr(_splat_i32(b, sl), ir.Constant(D32, [4 * j for j in range(8)])), ir.Constant(D32, [15] * 8))
    ls = b.sub(b.or_(slv, b.shl(shv, ir.Constant(D32, [4] * 8))), ir.Constant(D32, [32] * 8))  # -32..31
    # the bias term per sub-block against the sums: -128 * scale j in i16 lanes 2j, 2j + 1 (|.| <= 4096)
    bias = b.mul(b.trunc(b.shuffle_vector(ls, ls, ir.Constant(v16, [k // 2 for k in range(16)])), W16),
                 ir.Constant(W16, [-128] * 16))
    table = ir.Constant(v64, _IQ4_LEVELS_U8)
    weights, scales = [], []
    for c in range(4):
        q = row.load("row", b.add(p, _c64(8 + 32 * c)), V8, align=1)
        spread = b.shuffle_vector(q, q, ir.Constant(_vec(I32, 64), _IQ4_SPREAD))
        idx = b.and_(b.bitcast(b.lshr(b.bitcast(spread, w32), ir.Constant(w32, _IQ4_SHIFT)), v64),
                     ir.Constant(v64, [15] * 64))
        weights.append(b.bitcast(x86_call(b, "llvm.x86.avx512.pshuf.b.512", v64, [table, idx]), v16))
        scales.append(b.shuffle_vector(ls, ls, ir.Constant(v16, [2 * c] * 8 + [2 * c + 1] * 8)))
    zero = ir.Constant(v16, [0] * 16)
    for t in range(row.ntok):
        o = b.add(row.offset("xo", "xstride", t), b.mul(i, _c64(256)))
        isum = None
        for c in range(4):
            x = b.bitcast(row.load("xq", b.add(o, _c64(64 * c)), v64, align=1), v16)
            part = b.mul(x86_call(b, "llvm.x86.avx512.vpdpbusd.512", v16, [zero, weights[c], x]), scales[c])
            isum = part if isum is None else b.add(isum, part)
        sums = row.load("xs", b.add(row.offset("so", "sstride", t), b.mul(i, _c64(16))), W16, align=2)
        isum = b.add(isum, _widen8(b, _madd(b, sums, bias)))
        xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
        _accumulate(b, accs[t], isum, b.fmul(d, xd))


@intrinsic
def iq4_xs_row_dot_tile_512(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
    """`iq4_xs_row_dot_tile` in 512-bit AVX-512 VNNI instructions (`vpdpbusd`, `vpshufb` zmm); on
    every other x86 level it is `iq4_xs_row_dot_tile` (lowbit_kernels' drivers type every kind)."""
    from engine.quant import paths

    args = (row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid)
    if paths.target().level != "avx512vnni":
        return _q8k_tile("IQ4_XS", args)
    _x86_only("IQ4_XS")
    return types.void(*args), _row_codegen(_Q8K_TILE, TILE, _iq4_xs_block_512, lanes=16)


def _q3_k_block_512(row, a, i, accs):
    """Q3_K's tile on AVX-512 VNNI: x86_avx512.py's Q6_K scheme (a scale per 16 values). The
    quants are 0..7 (the -4 through the sums, as the AVX2 tile), so a 4-value `vpdpbusd` lane is
    at most 4 * 7 * 128 and two results narrow into one vector (`vpackssdw`) for one
    `vpdpwssd` by the scales. Vector c holds values 64c..64c+63: runs 2c, 2c + 1 of the block,
    i.e. the 2-bit fields s = 2 (c % 2) and s + 1 of qs half c // 2 and hmask bits 2c, 2c + 1."""
    b = row.b
    v64, v16 = _vec(I8, 64), _vec(I32, 16)
    p = b.mul(i, _c64(110))
    _prefetch(row, p, 110)
    d = row.half(b.add(p, _c64(108)), lane=3)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (96, 100, 104)]
    all16 = b.sext(_q3_k_scales(b, *words), W16)
    groups = GroupScales(all16, lambda g: g)
    hm = row.load("row", p, V8, align=1)
    qv = []
    for c in range(4):
        qs = row.load("row", b.add(p, _c64(32 + 32 * (c // 2))), V8, align=1)
        s = 2 * (c % 2)
        low = b.and_(_both_halves(b, qs, (2 * s, 2 * s + 2)), ir.Constant(v64, [3] * 64))
        high = b.and_(_both_halves(b, hm, (2 * c, 2 * c + 1)), ir.Constant(v64, [1] * 64))
        qv.append(b.bitcast(b.or_(low, b.shl(high, ir.Constant(v64, [2] * 64))), v16))
    pairs = [(0, 1), (2, 3)]
    pscales = [groups.packed_pairs(b, [4 * ca + L for L in range(4)], [4 * cb + L for L in range(4)])
               for ca, cb in pairs]
    offset = b.mul(all16, ir.Constant(W16, [-4] * 16))
    zero = ir.Constant(v16, [0] * 16)
    for t in range(row.ntok):
        o = b.add(row.offset("xo", "xstride", t), b.mul(i, _c64(256)))
        dots = [x86_call(b, "llvm.x86.avx512.vpdpbusd.512", v16,
                         [zero, qv[c], b.bitcast(row.load("xq", b.add(o, _c64(64 * c)), v64, align=1), v16)])
                for c in range(4)]
        isum = zero
        for (ca, cb), sv in zip(pairs, pscales):
            narrow = x86_call(b, "llvm.x86.avx512.packssdw.512", _vec(I16, 32), [dots[ca], dots[cb]])
            isum = x86_call(b, "llvm.x86.avx512.vpdpwssd.512", v16, [isum, b.bitcast(narrow, v16), sv])
        sums = row.load("xs", b.add(row.offset("so", "sstride", t), b.mul(i, _c64(16))), W16, align=2)
        isum = b.add(isum, _widen8(b, _madd(b, sums, offset)))
        xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
        _accumulate(b, accs[t], isum, b.fmul(d, xd))


@intrinsic
def q3_k_row_dot_tile_512(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
    """`q3_k_row_dot_tile` in 512-bit AVX-512 VNNI instructions; `q3_k_row_dot_tile` elsewhere."""
    from engine.quant import paths

    args = (row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid)
    if paths.target().level != "avx512vnni":
        return _q8k_tile("Q3_K", args)
    _x86_only("Q3_K")
    return types.void(*args), _row_codegen(_Q8K_TILE, TILE, _q3_k_block_512, lanes=16)


def _q5_k_block_512(row, a, i, accs):
    """Q5_K's tile on AVX-512 VNNI: x86_avx512.py's Q4_K scheme plus the fifth bit (quants 0..31:
    a 4-value `vpdpbusd` lane is at most 4 * 31 * 128, so two narrow into one `vpdpwssd` by the
    scales); the mins through the Q8_K sums, as the AVX2 tile. Vector c holds values
    64c..64c+63: runs 2c, 2c + 1, the nibbles of qs[32c..] and qh bits 2c, 2c + 1."""
    b = row.b
    v64, v16 = _vec(I8, 64), _vec(I32, 16)
    p = b.mul(i, _c64(176))
    _prefetch(row, p, 176)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (4, 8, 12)]
    packed = b.zext(_q4_k_scales_mins(b, *words), W16)  # lanes 0-7 scales, 8-15 mins
    groups = GroupScales(packed, lambda g: g // 2)
    mins = _lane_splat(b, packed, [8 + k // 2 for k in range(16)])
    qh = row.load("row", b.add(p, _c64(16)), V8, align=1)
    qv = []
    for c in range(4):
        qs = row.load("row", b.add(p, _c64(48 + 32 * c)), V8, align=1)
        low = b.and_(_both_halves(b, qs, (0, 4)), ir.Constant(v64, [15] * 64))
        high = b.and_(_both_halves(b, qh, (2 * c, 2 * c + 1)), ir.Constant(v64, [1] * 64))
        qv.append(b.bitcast(b.or_(low, b.shl(high, ir.Constant(v64, [4] * 64))), v16))
    d, dmin = row.half(p), row.half(b.add(p, _c64(2)))
    pairs = [(0, 1), (2, 3)]
    pscales = [groups.packed_pairs(b, [4 * ca + L for L in range(4)], [4 * cb + L for L in range(4)])
               for ca, cb in pairs]
    zero = ir.Constant(v16, [0] * 16)
    for t in range(row.ntok):
        o = b.add(row.offset("xo", "xstride", t), b.mul(i, _c64(256)))
        dots = [x86_call(b, "llvm.x86.avx512.vpdpbusd.512", v16,
                         [zero, qv[c], b.bitcast(row.load("xq", b.add(o, _c64(64 * c)), v64, align=1), v16)])
                for c in range(4)]
        isum = zero
        for (ca, cb), sv in zip(pairs, pscales):
            narrow = x86_call(b, "llvm.x86.avx512.packssdw.512", _vec(I16, 32), [dots[ca], dots[cb]])
            isum = x86_call(b, "llvm.x86.avx512.vpdpwssd.512", v16, [isum, b.bitcast(narrow, v16), sv])
        xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
        _accumulate(b, accs[t], isum, b.fmul(d, xd))
        sums = row.load("xs", b.add(row.offset("so", "sstride", t), b.mul(i, _c64(16))), W16, align=2)
        _accumulate(b, accs[t], _widen8(b, _madd(b, sums, mins)), b.fsub(ir.Constant(F32, 0.0), b.fmul(dmin, xd)))


@intrinsic
def q5_k_row_dot_tile_512(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid):
    """`q5_k_row_dot_tile` in 512-bit AVX-512 VNNI instructions; `q5_k_row_dot_tile` elsewhere."""
    from engine.quant import paths

    args = (row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, grid)
    if paths.target().level != "avx512vnni":
        return _q8k_tile("Q5_K", args)
    _x86_only("Q5_K")
    return types.void(*args), _row_codegen(_Q8K_TILE, TILE, _q5_k_block_512, lanes=16)
