"""Integer rows and tiles for the smaller downloads' formats on x86 (AVX2 and up), in x86 intrinsics.

Q2_K, Q3_K, Q5_K (the Q3_K_M / IQ4_XS mixes' attn_v and ffn_down), IQ4_XS and IQ3_S times Q8_K activations, IQ4_NL and
the legacy Q4_0 and Q5_0 times Q8_0 activations, Q4_1 and Q5_1 times Q8_1 (Q8_0's plus s = f16(d·Σq) per block) (int8 +
f32 scale per 32, `activations.quantize_q8_0` into an int8 array): llama.cpp's AVX2 scheme
(ggml-cpu/arch/x86/quants.c), one 256-bit vector per run of 32 weights, an <8 x float>
accumulator carried across the row and one horizontal sum per row (int8_dot.row_codegen).
The instructions are named (`x86_call`), so no InstCombine rewrite can lose them (int8_dot.py's
generic IR needed run-time knobs for that). Every x86 level from AVX2 up runs these same
256-bit rows: decode streams the weights from DRAM and a 512-bit body would wait on the same
bytes (the Q4_K/Q6_K rows are 256-bit on AVX-512 too). IQ4_XS, Q3_K and Q5_K have a second
prefill scheme on AVX-512 VNNI, at the end of this file: the panel tiles (weights unpacked once per
product into the P16 order, 2 rows x 4 tokens of 512-bit `vpdpbusd`), which lowbit_kernels runs
at every prompt length on that level (traits.py).

* Q2_K, Q3_K, Q5_K: weights unsigned (Q2_K 0..3, Q3_K 0..7 after adding the high bit as +4,
  Q5_K 0..31), so `vpmaddubsw` (u8 x s8 -> i16 pairs) then `vpmaddwd` by the run's scales.
  Q2_K's and Q5_K's mins and Q3_K's -4 offset go through the activations' int16 sums per 16
  values (Q6_K's -32 offset does the same in int8_dot).
* IQ4_XS, IQ4_NL: the 16 non-linear levels (gguf's kvalues) looked up with `vpshufb` from the
  nibbles; the levels are signed, so `vpsignb` moves the sign onto the activations first
  (|level| <= 127, |x| <= 127: a pair sum is at most 32258, no saturation).
* Q4_0, Q5_0: nibbles (Q5_0: and a fifth bit from qh, expanded as IQ3_S's signs are) less 8 /
  16, signed, then as IQ4_NL (llama.cpp's ggml_vec_dot_q4_0_q8_0 / q5_0_q8_0).
* Q4_1, Q5_1: unsigned nibbles (Q5_1: and the fifth bit) straight into `vpmaddubsw`; the min
  times the activation block's s is added per block, as llama.cpp's q4_1_q8_1 does.
* IQ3_S: 8 grid rows (4 unsigned bytes each, 1..15) gathered per 32 values from the 512-entry
  lattice (passed in as a uint32 array), the 32 sign bits expanded to byte masks with `vpshufb`
  + compare and applied to the activations ((x ^ m) - m).

IQ3_XXS (not in issue 20's list) keeps the float rows. arm64 has its own `sdot` rows and tiles
for these (arm/lowbit.py); engine/quant/paths.py names the path per format.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir
from numba.core import cgutils
from numba import types
from numba.extending import intrinsic

from engine.quant.int8_dot import (F32, I8, I16, I32, I64, WIDE_TILE, accumulate, array_ptr,
                                   fma, prefetch, q3_k_scales, q4_k_scales_mins, Row, row_codegen, splat_f32, store,
                                   sum_lanes_f32, vec, x86_call)
from engine.quant.lowbit import IQ4_LEVELS

V8 = vec(I8, 32)
W16 = vec(I16, 16)
D32 = vec(I32, 8)


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
    v = b.insert_element(ir.Constant(vec(I16, n), ir.Undefined), b.trunc(scalar_i32, I16), ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vec(I16, n), ir.Undefined), ir.Constant(vec(I32, n), [0] * n))


def _lane_splat(b, v16, lanes: list[int]):
    """<16 x i16> from lanes of the <16 x i16> v16 (a run's scales laid out against its pairs)."""
    return b.shuffle_vector(v16, v16, ir.Constant(vec(I32, len(lanes)), lanes))


def _run_scales(b, all16, r: int):
    """Scales of run r (values 32r..32r+31) of a 16-scale K block: scale 2r against the first
    16 values (i16 lanes 0-7 of `vpmaddubsw`'s result), 2r + 1 against the next 16."""
    return _lane_splat(b, all16, [2 * r + (k >= 8) for k in range(16)])


def _levels_table():
    """The IQ4 levels in both 128-bit lanes (`vpshufb` looks up within a lane)."""
    return _bytes([int(v) for v in IQ4_LEVELS] * 2)


def _iq4_lookup(b, q16):
    """16 packed bytes -> their 32 signed levels: low nibbles (values 0-15) then high (16-31)."""
    return _pshufb(b, _levels_table(), _nibbles32(b, q16))


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
    m: ir.Value | None = None       # Q4_1 / Q5_1's min, times the Q8_1 block's s (f32 at xs)


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
    accumulate(b, accs[t], isum, b.fmul(blk.d, xd))
    if blk.dmin is not None:
        accumulate(b, accs[t], _madd(b, sums, blk.by_sums), b.fsub(ir.Constant(F32, 0.0), b.fmul(blk.dmin, xd)))
    if blk.m is not None:
        # m * s, s = f16(d * sum q) per Q8_1 block (llama.cpp's y.s), into lane 0 of the accumulator
        s = row.load("xs", b.add(row.offset("so", "sstride", t), i), F32)
        term = b.insert_element(ir.Constant(vec(F32, 8), [0.0] * 8), b.fmul(blk.m, s), ir.Constant(I32, 0))
        b.store(b.fadd(b.load(accs[t]), term), accs[t])


def _signed_run(b, w, scales) -> _Run:
    """A run of signed int8 weights: |w| for `vpmaddubsw` and w's signs moved onto the
    activations (llama.cpp's mul_add_epi8; |w| <= 127, |x| <= 127, so no pair saturates)."""
    return _Run(_sign(b, w, w), scales, lambda bb, x: _sign(bb, x, w))


def _q2_k_unpack(row, i) -> _Block:
    # 84 bytes: scales 16 (low nibble scale, high nibble min), qs 64, d f16, dmin f16.
    # Value 128h + 32s + l: (qs[32h + l] >> 2s) & 3, scale and min j = value // 16
    b = row.b
    p = b.mul(i, _c64(84))
    prefetch(row, p, 84)
    d, dmin = row.half(b.add(p, _c64(80)), lane=2), row.half(b.add(p, _c64(82)), lane=3)  # inside the block
    sc = row.load("row", p, vec(I8, 16), align=1)
    scales = b.zext(b.and_(sc, ir.Constant(vec(I8, 16), [15] * 16)), W16)
    mins = b.zext(b.lshr(sc, ir.Constant(vec(I8, 16), [4] * 16)), W16)
    runs = []
    for h in range(2):
        qs = row.load("row", b.add(p, _c64(16 + 32 * h)), V8, align=1)
        for s in range(4):
            q = b.and_(b.lshr(qs, _bytes(2 * s)) if s else qs, _bytes(3))
            runs.append(_Run(q, _run_scales(b, scales, 4 * h + s)))
    return _Block(runs, d, mins, dmin)


def _q3_k_unpack(row, i) -> _Block:
    # 110 bytes: hmask 32, qs 64, scales 12, d f16. Value 128h + 32s + l: ((qs[32h + l] >> 2s) & 3)
    # + 4 * (bit 4h + s of hmask[l]) - 4, scale j = value // 16
    b = row.b
    p = b.mul(i, _c64(110))
    prefetch(row, p, 110)
    d = row.half(b.add(p, _c64(108)), lane=3)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (96, 100, 104)]
    all16 = b.sext(q3_k_scales(b, *words), W16)
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
    prefetch(row, p, 176)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (4, 8, 12)]
    packed = b.zext(q4_k_scales_mins(b, *words), W16)  # lanes 0-7 scales, 8-15 mins
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
    prefetch(row, p, 136)
    d = row.half(p)
    sh = b.zext(row.load("row", b.add(p, _c64(2)), I16, align=1), I32)
    sl = row.load("row", b.add(p, _c64(4)), I32, align=1)
    shv = b.and_(b.lshr(_splat_i32(b, sh), ir.Constant(D32, [2 * j for j in range(8)])), ir.Constant(D32, [3] * 8))
    slv = b.and_(b.lshr(_splat_i32(b, sl), ir.Constant(D32, [4 * j for j in range(8)])), ir.Constant(D32, [15] * 8))
    ls = b.sub(b.or_(slv, b.shl(shv, ir.Constant(D32, [4] * 8))), ir.Constant(D32, [32] * 8))
    ls16 = b.trunc(ls, vec(I16, 8))
    runs = []
    for j in range(8):
        w = _iq4_lookup(b, row.load("row", b.add(p, _c64(8 + 16 * j)), vec(I8, 16), align=1))
        runs.append(_signed_run(b, w, b.shuffle_vector(ls16, ls16, ir.Constant(vec(I32, 16), [j] * 16))))
    return _Block(runs, d)


def _iq4_nl_unpack(row, i) -> _Block:
    # 18 bytes per 32 values: d f16, 16 bytes of nibbles; Q8_0 activations (int8, f32 per 32)
    b = row.b
    p = b.mul(i, _c64(18))
    prefetch(row, p, 18)
    w = _iq4_lookup(b, row.load("row", b.add(p, _c64(2)), vec(I8, 16), align=1))
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
    prefetch(row, p, 110)
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


def _nibbles32(b, q16):
    """16 packed bytes -> their 32 nibbles as bytes: low nibbles (values 0-15) then high (16-31),
    the order of every 32-value legacy block (llama.cpp's bytes_from_nibbles_32)."""
    m4 = ir.Constant(vec(I8, 16), [15] * 16)
    lo = b.and_(q16, m4)
    hi = b.and_(b.lshr(q16, ir.Constant(vec(I8, 16), [4] * 16)), m4)
    return b.shuffle_vector(lo, hi, ir.Constant(vec(I32, 32), list(range(32))))


_ONES16 = [1] * 16


def _fifth_bits(row, at, unset: int = 0, set_: int = 16):
    """The 32-bit qh word at byte `at` of the row as 32 bytes: `set_` where value j's bit (bit j)
    is set, `unset` where not. `vpshufb` of the broadcast word picks byte j // 8, a compare with
    1 << j % 8 tests the bit, one `vpand` / `vpandn` of the mask picks the byte."""
    b = row.b
    qh = b.bitcast(_splat_i32(b, row.load("row", at, I32, align=1)), V8)
    bits = b.and_(_pshufb(b, qh, _bytes(_SIGN_BYTE)), _bytes(_SIGN_BIT))
    mask = b.sext(b.icmp_unsigned("==", bits, _bytes(_SIGN_BIT)), V8)
    return b.and_(mask, _bytes(set_)) if set_ else b.and_(b.xor(mask, _bytes(-1)), _bytes(unset))


def _q4_0_unpack(row, i) -> _Block:
    # 18 bytes per 32 values: d f16, 16 bytes of nibbles; value = nibble - 8 (Q8_0 activations)
    b = row.b
    p = b.mul(i, _c64(18))
    prefetch(row, p, 18)
    w = b.sub(_nibbles32(b, row.load("row", b.add(p, _c64(2)), vec(I8, 16), align=1)), _bytes(8))
    return _Block([_signed_run(b, w, ir.Constant(W16, _ONES16))], row.half(p))


def _q5_0_unpack(row, i) -> _Block:
    # 22 bytes per 32 values: d f16, qh 4 bytes (bit j: value j's fifth bit), 16 bytes of nibbles;
    # value = (nibble | bit << 4) - 16, the bits made bytes as IQ3_S's signs are (_fifth_bits)
    b = row.b
    p = b.mul(i, _c64(22))
    prefetch(row, p, 22)
    # nibble | 0xF0 where the bit is clear is nibble - 16 as int8, nibble where set: no subtract
    # (llama.cpp's bytes_from_bits_32 + andnot)
    high = _fifth_bits(row, b.add(p, _c64(2)), unset=-16, set_=0)
    q = _nibbles32(b, row.load("row", b.add(p, _c64(6)), vec(I8, 16), align=1))
    w = b.or_(q, high)
    return _Block([_signed_run(b, w, ir.Constant(W16, _ONES16))], row.half(p))


def _q4_1_unpack(row, i) -> _Block:
    # 20 bytes per 32 values: d f16, m f16, 16 bytes of nibbles; value = d * nibble + m. The
    # nibbles are unsigned: `vpmaddubsw` takes them as they are; m goes through the block's s.
    b = row.b
    p = b.mul(i, _c64(20))
    prefetch(row, p, 20)
    w = _nibbles32(b, row.load("row", b.add(p, _c64(4)), vec(I8, 16), align=1))
    return _Block([_Run(w, ir.Constant(W16, _ONES16))], row.half(p), m=row.half(b.add(p, _c64(2))))


def _q5_1_unpack(row, i) -> _Block:
    # 24 bytes per 32 values: d f16, m f16, qh 4 bytes, 16 bytes of nibbles; value = d * (nibble |
    # bit << 4) + m, the bits expanded as Q5_0's
    b = row.b
    p = b.mul(i, _c64(24))
    prefetch(row, p, 24)
    high = _fifth_bits(row, b.add(p, _c64(4)))
    w = b.or_(_nibbles32(b, row.load("row", b.add(p, _c64(8)), vec(I8, 16), align=1)), high)
    return _Block([_Run(w, ir.Constant(W16, _ONES16))], row.half(p), m=row.half(b.add(p, _c64(2))))


def _block(unpack, values_per_block: int = 256):
    """int8_dot.row_codegen's block body: unpack block i once, then each token's products
    (runs outer, tokens inner in x86/avx2.py's tiles; here the runs of a block are few enough
    registers for the tile's 4 tokens to pass them)."""
    def block(row, a, i, accs):
        blk = unpack(row, i)
        for t in range(row.ntok):
            _token_dot(row, blk, i, t, values_per_block, accs)
    return block


def _x86_only(name: str) -> None:
    from engine.quant import paths

    if not paths.target().level.is_x86_int8:
        raise TypeError(f"the {name} integer rows are x86 intrinsics (AVX2 and up); kernels.has_int8_kernels "
                        "keeps every other target on the float rows")


_Q8K_ROW = ("row", "nb", "xq", "xd", "xs")
_IQ3_S_ROW = ("row", "nb", "xq", "xd", "grid")
_Q8_0_ROW = ("row", "nb", "xq", "xd")
_Q8_1_ROW = ("row", "nb", "xq", "xd", "xs")


@intrinsic
def q2_k_row_dot(typingctx, row, nb, xq, xd, xs):
    """The Q2_K row (nb blocks) times one token's Q8_K activations (xq int8, xd block scales, xs
    int16 sums per 16 values), as float32."""
    _x86_only("Q2_K")
    return types.float32(row, nb, xq, xd, xs), row_codegen(_Q8K_ROW, 1, _block(_q2_k_unpack))


@intrinsic
def q3_k_row_dot(typingctx, row, nb, xq, xd, xs):
    """`q2_k_row_dot` for a Q3_K row."""
    _x86_only("Q3_K")
    return types.float32(row, nb, xq, xd, xs), row_codegen(_Q8K_ROW, 1, _block(_q3_k_unpack))


@intrinsic
def q5_k_row_dot(typingctx, row, nb, xq, xd, xs):
    """`q2_k_row_dot` for a Q5_K row (x86; arm64 has arm/neon.py's)."""
    _x86_only("Q5_K")
    return types.float32(row, nb, xq, xd, xs), row_codegen(_Q8K_ROW, 1, _block(_q5_k_unpack))


@intrinsic
def iq4_xs_row_dot(typingctx, row, nb, xq, xd):
    """The IQ4_XS row times one token's Q8_K activations (no sums needed: no offsets), as float32."""
    _x86_only("IQ4_XS")
    return types.float32(row, nb, xq, xd), row_codegen(_Q8_0_ROW, 1, _block(_iq4_xs_unpack))


@intrinsic
def iq3_s_row_dot(typingctx, row, nb, xq, xd, grid):
    """The IQ3_S row times one token's Q8_K activations; grid: the 512 lattice rows as uint32."""
    _x86_only("IQ3_S")
    return types.float32(row, nb, xq, xd, grid), row_codegen(_IQ3_S_ROW, 1, _block(_iq3_s_unpack))


@intrinsic
def iq4_nl_row_dot(typingctx, row, nb, xq, xd):
    """The IQ4_NL row (nb blocks of 32) times one token's Q8_0 activations (xq int8, xd f32 per
    32 values), as float32."""
    _x86_only("IQ4_NL")
    return types.float32(row, nb, xq, xd), row_codegen(_Q8_0_ROW, 1, _block(_iq4_nl_unpack, 32))


@intrinsic
def q4_0_row_dot(typingctx, row, nb, xq, xd):
    """The Q4_0 row (nb blocks of 32) times one token's Q8_0 activations, as float32."""
    _x86_only("Q4_0")
    return types.float32(row, nb, xq, xd), row_codegen(_Q8_0_ROW, 1, _block(_q4_0_unpack, 32))


@intrinsic
def q5_0_row_dot(typingctx, row, nb, xq, xd):
    """The Q5_0 row (nb blocks of 32) times one token's Q8_0 activations, as float32."""
    _x86_only("Q5_0")
    return types.float32(row, nb, xq, xd), row_codegen(_Q8_0_ROW, 1, _block(_q5_0_unpack, 32))


@intrinsic
def q4_1_row_dot(typingctx, row, nb, xq, xd, xs):
    """The Q4_1 row (nb blocks of 32) times one token's Q8_1 activations (xq int8, xd f32 and xs
    f32 = f16(d * sum q) per 32 values), as float32."""
    _x86_only("Q4_1")
    return types.float32(row, nb, xq, xd, xs), row_codegen(_Q8_1_ROW, 1, _block(_q4_1_unpack, 32))


@intrinsic
def q5_1_row_dot(typingctx, row, nb, xq, xd, xs):
    """`q4_1_row_dot` for a Q5_1 row."""
    _x86_only("Q5_1")
    return types.float32(row, nb, xq, xd, xs), row_codegen(_Q8_1_ROW, 1, _block(_q5_1_unpack, 32))


# Several tokens per weight block (a prefill's products): the block is unpacked once for TILE
# tokens; token t's activations at xq[xo + t*xstride:], block scales at xd[do + t*dstride:],
# sums at xs[so + t*sstride:], results to res[t]. One signature for the four Q8_K formats
# (grid: IQ3_S's lattice, unused by the others; xs: unused by IQ4_XS and IQ3_S).
TILE = WIDE_TILE  # the K formats' tile: one Q8KTokens quantization serves all of a layer's products
_Q8K_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "xs", "so", "sstride", "res", "grid")
_Q8_0_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "res")
_Q8_1_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "xs", "so", "sstride", "res")
_Q8K_UNPACK = {"Q2_K": _q2_k_unpack, "Q3_K": _q3_k_unpack, "IQ4_XS": _iq4_xs_unpack, "IQ3_S": _iq3_s_unpack,
               "Q5_K": _q5_k_unpack}


def _q8k_tile(name: str, args):
    _x86_only(name)
    return types.void(*args), row_codegen(_Q8K_TILE, TILE, _block(_Q8K_UNPACK[name]))


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
    return sig, row_codegen(_Q8_0_TILE, TILE, _block(_iq4_nl_unpack, 32))


@intrinsic
def q4_0_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, res):
    """`iq4_nl_row_dot_tile` for a Q4_0 row."""
    _x86_only("Q4_0")
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, res)
    return sig, row_codegen(_Q8_0_TILE, TILE, _block(_q4_0_unpack, 32))


@intrinsic
def q5_0_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, res):
    """`iq4_nl_row_dot_tile` for a Q5_0 row."""
    _x86_only("Q5_0")
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, res)
    return sig, row_codegen(_Q8_0_TILE, TILE, _block(_q5_0_unpack, 32))


@intrinsic
def q4_1_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res):
    """res[t] = the Q4_1 row times token t's Q8_1 activations for t < TILE."""
    _x86_only("Q4_1")
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res)
    return sig, row_codegen(_Q8_1_TILE, TILE, _block(_q4_1_unpack, 32))


@intrinsic
def q5_1_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res):
    """`q4_1_row_dot_tile` for a Q5_1 row."""
    _x86_only("Q5_1")
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res)
    return sig, row_codegen(_Q8_1_TILE, TILE, _block(_q5_1_unpack, 32))


# AVX-512 VNNI's `vpdpbusd` multiplies unsigned weights by signed activations, so IQ4_XS's
# levels are looked up biased by +128 (1..241) and the bias comes back through the activations'
# sums: sum (l + 128) x = sum l x + 128 sum x.
_IQ4_LEVELS_U8 = [int(v) + 128 for v in IQ4_LEVELS] * 4


# Panel tiles (AVX-512 VNNI): the activations in activations.Q8KTokens.p16()'s order, where i32
# lane k of every 64-byte vector meets the 16 values of group k, and the weights unpacked into
# the same order (a two-source dword permute per vector, `vpermt2d`). A block is then four
# `vpdpbusd` chained into one <16 x i32> per row and token and three float multiply-adds: to
# d_x, by the block's scale vector (d * the scale of lane k's group) and the sums term (xsf =
# d_x * sums16 times IQ4_XS's -128 * scale, Q3_K's -4 * scale or Q5_K's -dmin * min). The
# earlier tiles multiplied the scales per 64 bytes and token (`vpmulld`, or `vpackssdw` +
# `vpdpwssd`) and unpacked every block once per 4 tokens.
_V16 = vec(I32, 16)


def _dwords(b, lo, hi, idx: list[int]):
    """<16 x i32> of dwords idx of the 32 in (lo, hi): `vpermt2d`."""
    return b.shuffle_vector(lo, hi, ir.Constant(vec(I32, 16), idx))


def _per_lane(b, op, v, amounts: list[int]):
    return getattr(b, op)(v, ir.Constant(_V16, amounts))


def _bit_to(b, v, bits: list[int], to: int):
    """Bit bits[k] of every byte of dword k moved to bit `to` (a per-dword rotate, `vprold`);
    the other bits are left for the caller's mask."""
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.fshl.v16i32")
    return b.call(fn, [v, v, ir.Constant(_V16, [(to - j) % 32 for j in bits])])


def _bytes512(v: int):
    return ir.Constant(_V16, [int.from_bytes(bytes([v] * 4), "little")] * 16)


def _lanes_of(b, v, idx: list[int], signed: bool = False):
    """<16 x float> of lanes idx of the integer vector v."""
    picked = b.shuffle_vector(v, v, ir.Constant(_V16, idx))
    return b.sitofp(picked, vec(F32, 16)) if signed else b.uitofp(picked, vec(F32, 16))


def _iq4_xs_unpack_p16(row, i):
    # lane k: sub-block k // 2, the low nibbles (values 0-15) for even k, the high ones for odd
    b = row.b
    p = b.mul(i, _c64(136))
    prefetch(row, p, 136)
    d = splat_f32(b, row.half(p), 16)
    sh = b.zext(row.load("row", b.add(p, _c64(2)), I16, align=1), I32)
    sl = row.load("row", b.add(p, _c64(4)), I32, align=1)
    shv = b.and_(b.lshr(_splat_i32(b, sh), ir.Constant(D32, [2 * j for j in range(8)])), ir.Constant(D32, [3] * 8))
    slv = b.and_(b.lshr(_splat_i32(b, sl), ir.Constant(D32, [4 * j for j in range(8)])), ir.Constant(D32, [15] * 8))
    ls = b.sub(b.or_(slv, b.shl(shv, ir.Constant(D32, [4] * 8))), ir.Constant(D32, [32] * 8))  # -32..31
    dsc = b.fmul(_lanes_of(b, ls, [k // 2 for k in range(16)], signed=True), d)
    q = [b.bitcast(row.load("row", b.add(p, _c64(8 + 64 * h)), vec(I8, 64), align=1), _V16) for h in range(2)]
    table = ir.Constant(vec(I8, 64), _IQ4_LEVELS_U8)
    weights = []
    for c in range(4):
        raw = _dwords(b, q[0], q[1], [4 * (k // 2) + c for k in range(16)])
        nib = b.and_(_per_lane(b, "lshr", raw, [4 * (k % 2) for k in range(16)]), _bytes512(15))
        looked = x86_call(b, "llvm.x86.avx512.pshuf.b.512", vec(I8, 64), [table, b.bitcast(nib, vec(I8, 64))])
        weights.append(b.bitcast(looked, _V16))
    return weights, dsc, b.fmul(dsc, splat_f32(b, ir.Constant(F32, -128.0), 16))


def _q45_k_unpack_p16(row, i, bpb: int, qs_at: int, qh_at: int | None):
    # Q4_K / Q5_K, lane k: sub-block j = k // 2, values 16 (k % 2) + 4c + v: the nibble j % 2 of
    # qs dword 8 (j // 2) + 4 (k % 2) + c, Q5_K's fifth bit j of qh dword 4 (k % 2) + c
    b = row.b
    p = b.mul(i, _c64(bpb))
    prefetch(row, p, bpb)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (4, 8, 12)]
    packed = b.zext(q4_k_scales_mins(b, *words), _V16)  # lanes 0-7 scales, 8-15 mins
    d, dmin = splat_f32(b, row.half(p), 16), splat_f32(b, row.half(b.add(p, _c64(2))), 16)
    dsc = b.fmul(_lanes_of(b, packed, [k // 2 for k in range(16)]), d)
    off = b.fmul(_lanes_of(b, packed, [8 + k // 2 for k in range(16)]), b.fsub(ir.Constant(vec(F32, 16), [0.0] * 16), dmin))
    qs = [b.bitcast(row.load("row", b.add(p, _c64(qs_at + 64 * h)), vec(I8, 64), align=1), _V16) for h in range(2)]
    qh = None if qh_at is None else b.bitcast(row.load("row", b.add(p, _c64(qh_at)), vec(I8, 32), align=1), D32)
    weights = []
    for c in range(4):
        raw = _dwords(b, qs[0], qs[1], [8 * (k // 4) + 4 * (k % 2) + c for k in range(16)])
        low = b.and_(_per_lane(b, "lshr", raw, [4 * ((k // 2) % 2) for k in range(16)]), _bytes512(15))
        if qh is None:
            weights.append(low)
            continue
        hbits = b.shuffle_vector(qh, qh, ir.Constant(_V16, [4 * (k % 2) + c for k in range(16)]))
        high = b.and_(_bit_to(b, hbits, [k // 2 for k in range(16)], 4), _bytes512(16))
        weights.append(b.or_(low, high))
    return weights, dsc, off


def _q4_k_unpack_p16(row, i):
    return _q45_k_unpack_p16(row, i, 144, 16, None)


def _q5_k_unpack_p16(row, i):
    return _q45_k_unpack_p16(row, i, 176, 48, 16)


def _q6_k_unpack_p16(row, i):
    # lane k = group k: half h = k // 8, values m = 16 (k % 8) + 4c + v of the half: the nibble
    # (k % 8) // 4 of ql dword 16h + 4 (k % 4) + c, and 2 bits 2 ((k % 8) // 2) of qh dword
    # 8h + 4 (k % 2) + c (gguf.quants' Q6_K order)
    b = row.b
    p = b.mul(i, _c64(210))
    prefetch(row, p, 210)
    d = splat_f32(b, row.half(b.add(p, _c64(208)), lane=3), 16)
    scales = b.sext(row.load("row", b.add(p, _c64(192)), vec(I8, 16), align=1), _V16)
    dsc = b.fmul(b.sitofp(scales, vec(F32, 16)), d)
    ql = [b.bitcast(row.load("row", b.add(p, _c64(64 * h)), vec(I8, 64), align=1), _V16) for h in range(2)]
    qh = b.bitcast(row.load("row", b.add(p, _c64(128)), vec(I8, 64), align=1), _V16)
    weights = []
    for c in range(4):
        raw = _dwords(b, ql[0], ql[1], [16 * (k // 8) + 4 * (k % 4) + c for k in range(16)])
        low = b.and_(_per_lane(b, "lshr", raw, [4 * ((k % 8) // 4) for k in range(16)]), _bytes512(15))
        hbits = b.shuffle_vector(qh, qh, ir.Constant(_V16, [8 * (k // 8) + 4 * (k % 2) + c for k in range(16)]))
        high = b.and_(_bit_to(b, hbits, [2 * ((k % 8) // 2) for k in range(16)], 4), _bytes512(0x30))
        weights.append(b.or_(low, high))  # 0..63: the -32 goes through the sums
    return weights, dsc, b.fmul(dsc, splat_f32(b, ir.Constant(F32, -32.0), 16))


def _q3_k_unpack_p16(row, i):
    # lane k = group k: half h = k // 8, field s = (k % 8) // 2, values 16 (k % 2) + 4c + v of the
    # run: 2 bits s of qs dword 8h + 4 (k % 2) + c, the high bit 4h + s of hmask dword 4 (k % 2) + c
    b = row.b
    p = b.mul(i, _c64(110))
    prefetch(row, p, 110)
    d = splat_f32(b, row.half(b.add(p, _c64(108)), lane=3), 16)
    words = [row.load("row", b.add(p, _c64(k)), I32, align=1) for k in (96, 100, 104)]
    scales = b.sext(q3_k_scales(b, *words), _V16)  # -32..31
    dsc = b.fmul(b.sitofp(scales, vec(F32, 16)), d)
    qs = b.bitcast(row.load("row", b.add(p, _c64(32)), vec(I8, 64), align=1), _V16)
    hm = b.bitcast(row.load("row", p, vec(I8, 32), align=1), D32)
    weights = []
    for c in range(4):
        raw = b.shuffle_vector(qs, qs, ir.Constant(_V16, [8 * (k // 8) + 4 * (k % 2) + c for k in range(16)]))
        low = b.and_(_per_lane(b, "lshr", raw, [2 * ((k % 8) // 2) for k in range(16)]), _bytes512(3))
        hbits = b.shuffle_vector(hm, hm, ir.Constant(_V16, [4 * (k % 2) + c for k in range(16)]))
        high = b.and_(_bit_to(b, hbits, [4 * (k // 8) + (k % 8) // 2 for k in range(16)], 2), _bytes512(4))
        weights.append(b.or_(low, high))  # 0..7: the -4 goes through the sums
    return weights, dsc, b.fmul(dsc, splat_f32(b, ir.Constant(F32, -4.0), 16))


_P16_UNPACK = {"IQ4_XS": _iq4_xs_unpack_p16, "Q5_K": _q5_k_unpack_p16, "Q3_K": _q3_k_unpack_p16,
               "Q4_K": _q4_k_unpack_p16, "Q6_K": _q6_k_unpack_p16}

# The unpack (`{fmt}_unpack_panel`: 256 unsigned bytes in the P16 order, then 16 scales and 16
# offsets as f32) runs once per weight block and matrix product into a panel of rows that stays
# in L2 while every token tile passes (lowbit_kernels._panel_rows). One tile serves every format:
# 2 rows x 4 tokens, each activation vector feeding two `vpdpbusd`. Measured in L1, one thread,
# Emerald Rapids, one process alternating, best of 7: 2 x 4 at 128-140 GMAC/s, 1 x 4 122, 2 x 2
# 129, 1 x 2 108; reading the sums as floats offset by 1.5 * 2^23 instead of `vcvtdq2ps` (an
# exact multiply-add by d_x would need a second one) measured the same, so the sums convert.
_PANEL_UNPACK_ARGS = ("row", "nb", "wq", "ws")
PANEL_BYTES, PANEL_SCALES = 256, 32  # per block: unpacked weights (u8), then dsc and off (f32)
PANEL_ROWS, PANEL_TOKENS = 2, 4
_PANEL_TILE = ("wq", "wo", "wstride", "ws", "wso", "wsstride", "nb", "xq", "xo", "xstride", "xd", "do", "dstride",
               "xs", "so", "sstride", "res")


def _panel_unpack_intrinsic(name: str):
    def unpack(typingctx, row, nb, wq, ws):
        _x86_only(name)

        def codegen(context, builder, signature, args):
            r = Row(context, builder, signature, args, _PANEL_UNPACK_ARGS, 1)
            with cgutils.for_range(builder, r.arg["nb"]) as loop:
                i = builder.sext(loop.index, I64) if loop.index.type.width < 64 else loop.index
                weights, dsc, off = _P16_UNPACK[name](r, i)
                for c in range(4):
                    ptr = array_ptr(context, builder, r.aty["wq"], r.arg["wq"],
                                     builder.add(builder.mul(i, _c64(PANEL_BYTES)), _c64(64 * c)), _V16)
                    builder.store(weights[c], ptr, align=1)
                for k, v in enumerate((dsc, off)):
                    ptr = array_ptr(context, builder, r.aty["ws"], r.arg["ws"],
                                     builder.add(builder.mul(i, _c64(PANEL_SCALES)), _c64(16 * k)), v.type)
                    builder.store(v, ptr, align=4)
            return context.get_dummy_value()
        return types.void(row, nb, wq, ws), codegen
    unpack.__name__ = f"{name.lower()}_unpack_panel"
    unpack.__doc__ = (f"The nb {name} blocks of row, unpacked for `panel_tile`: wq[256 i:] the values as u8 in "
                      "the P16 order, ws[32 i:] 16 scales then 16 offsets (f32). AVX-512 VNNI only.")
    return intrinsic(unpack)


iq4_xs_unpack_panel, q5_k_unpack_panel, q3_k_unpack_panel, q4_k_unpack_panel, q6_k_unpack_panel = (
    _panel_unpack_intrinsic(n) for n in ("IQ4_XS", "Q5_K", "Q3_K", "Q4_K", "Q6_K"))


def _panel_codegen(context, builder, signature, args):
    b = builder
    row = Row(context, b, signature, args, _PANEL_TILE, PANEL_TOKENS)
    f16 = vec(F32, 16)
    zero = ir.Constant(_V16, [0] * 16)
    accs = [[cgutils.alloca_once_value(b, ir.Constant(f16, [0.0] * 16)) for _ in range(PANEL_ROWS)]
            for _ in range(PANEL_TOKENS)]
    with cgutils.for_range(b, row.arg["nb"]) as loop:
        i = b.sext(loop.index, I64) if loop.index.type.width < 64 else loop.index

        def weights_of(r):
            o = b.add(row.offset("wo", "wstride", r), b.mul(i, _c64(PANEL_BYTES)))
            so = b.add(row.offset("wso", "wsstride", r), b.mul(i, _c64(PANEL_SCALES)))
            return ([row.load("wq", b.add(o, _c64(64 * c)), _V16, align=1) for c in range(4)],
                    row.load("ws", so, f16, align=4), row.load("ws", b.add(so, _c64(16)), f16, align=4))

        def token_of(t):
            o = b.add(row.offset("xo", "xstride", t), b.mul(i, _c64(256)))
            xs = [b.bitcast(row.load("xq", b.add(o, _c64(64 * c)), vec(I8, 64), align=1), _V16) for c in range(4)]
            di = b.add(row.offset("do", "dstride", t), i)
            xd = splat_f32(b, row.load("xd", di, F32), 16)
            xsf = row.load("xs", b.add(row.offset("so", "sstride", t), b.mul(i, _c64(16))), f16, align=4)
            return xs, xd, xsf

        def product(r, t, w, x):
            (weights, dsc, off), (xs, xd, xsf) = w, x
            s = zero
            for c in range(4):
                s = x86_call(b, "llvm.x86.avx512.vpdpbusd.512", _V16, [s, weights[c], xs[c]])
            scaled = b.fmul(b.sitofp(s, f16), xd)  # exact sums (|sum| < 2^24) times d_x
            acc = fma(b, scaled, dsc, b.load(accs[t][r]))
            b.store(fma(b, xsf, off, acc), accs[t][r])

        # a row's weights, then each token's activations (LLVM keeps them as vpdpbusd's memory
        # operands): fewer live registers than the four tokens' activations held for both rows
        for r in range(PANEL_ROWS):
            w = weights_of(r)
            for t in range(PANEL_TOKENS):
                product(r, t, w, token_of(t))
    for t in range(PANEL_TOKENS):
        for r in range(PANEL_ROWS):
            store(context, b, row.aty["res"], row.arg["res"], PANEL_ROWS * t + r, sum_lanes_f32(b, b.load(accs[t][r])))
    return context.get_dummy_value()


@intrinsic
def panel_tile(typingctx, wq, wo, wstride, ws, wso, wsstride, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride,
               res):
    """res[2 t + r] = row r (wq[wo + r wstride:], ws[wso + r wsstride:], as `*_unpack_panel` wrote
    them) times token t (xq[xo + t xstride:] in the P16 order, xd and xs as Q8KTokens.p16
    gives them) over nb blocks, for r < 2, t < 4. AVX-512 VNNI only."""
    from engine.quant import paths

    if paths.target().level != paths.Level.AVX512VNNI:
        raise TypeError("the panel tiles are AVX-512 VNNI code; lowbit_kernels.PANEL is empty on other targets")
    sig = (wq, wo, wstride, ws, wso, wsstride, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res)
    return types.void(*sig), _panel_codegen



