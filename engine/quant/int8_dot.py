"""Integer dot products of quantized rows with quantized activations, written as LLVM vector IR.

llama.cpp multiplies a Q4_K/Q6_K row by activations quantized to Q8_K (int8 + one f32 scale per
256 values), and a Q8_0 row by Q8_0 activations, in integer arithmetic: u8 x s8 pairs summed to
i16 (x86 `pmaddubsw`), i16 x scale pairs summed to i32 (`pmaddwd`), converted and multiplied by
the block's float scales into a float accumulator vector carried across the row, with one
horizontal sum per row. numba cannot say this: it types integer arithmetic as int64, so its
loops run 4 lanes per AVX2 register. The intrinsics below run a whole row (or a row times TILE
tokens) as generic IR that LLVM's backends lower to those instructions. The row bodies here
name no target intrinsic; the tiles take their block bodies from the ISA file of the level, which
registers them here at its import (x86/avx2.py, x86/avx512.py, arm/neon.py: `register_bodies`),
and arm64 with dot products runs arm/neon.py's rows instead of these. This file imports no ISA
file.

What keeps LLVM on the fast instructions (measured on znver3, `python -m bench.kernels`, Q4_K
1024x3584, GB/s of weight bytes, 2 threads: float-path kernel 4.6; per-block integer dot with a
horizontal reduction per block 14-15; whole rows with the float accumulator 20-23):

* The x86 backend recognises `pmaddubsw` only with its saturation clamp in the IR. When LLVM can
  prove the weight lanes small (after `& 15` or `>> 4` by constants) InstCombine deletes the
  clamp as redundant and the match is lost (the sum is then done with widening shuffles, 3.0-3.4
  GB/s). So the masks and shifts come in at run time (`KNOBS`), values LLVM cannot see, and the
  `pmaddubsw` result is xor'ed with a run-time zero so sext(trunc(clamp)) is not folded either.
* Pair sums are written as i32 products of sign-extended lanes, even lanes plus odd lanes, after
  the multiply: x86 lowers that to `pmaddwd` (shuffling the operands before the multiply was
  de-interleaved with ~4 shuffles per 32 values instead).
* Per-block bookkeeping stays inside the IR (Q4_K's 6-bit scale/min unpacking, the Q6_K -32
  offset through the activation sums, the f16 block scales through `fpext`): as scalar numba
  code it took 2/3 of the Q6_K time.
* Shift amounts are splats of run-time scalars: a computed shift vector is emulated lane by
  lane on x86 (vpsllw/vpblendvb chains).
* Q8_0 activations come in as int16, so only the weights are widened in the loop.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)

# byte 0: nibble mask 15, byte 1: shift 4, byte 2: two-bit mask 3, byte 3: zero.
KNOBS = 15 | (4 << 8) | (3 << 16)


def vec(t: ir.IntType, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _splat(builder, value, t: ir.IntType, n: int):
    v = builder.trunc(value, t) if value.type.width > t.width else builder.zext(value, t) \
        if value.type.width < t.width else value
    one = builder.insert_element(ir.Constant(vec(t, n), ir.Undefined), v, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vec(t, n), ir.Undefined),
                                  ir.Constant(vec(I32, n), [0] * n))


def x86_call(builder, name: str, ret, args):
    """Call the LLVM target intrinsic `name` (the x86 kernel files: explicit instructions, so no
    InstCombine rewrite can lose them)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [v.type for v in args]), name)
    return builder.call(fn, args)


def _vector_fn(module, base: str, vt: ir.VectorType, nargs: int, scalar_result: bool = False):
    name = f"{base}.v{vt.count}i{vt.element.width}"
    ret = vt.element if scalar_result else vt
    return cgutils.get_or_insert_function(module, ir.FunctionType(ret, [vt] * nargs), name)


def _lanes(builder, v, idx):
    """The lanes `idx` of vector v, as a new vector."""
    return builder.shuffle_vector(v, v, ir.Constant(vec(I32, len(idx)), list(idx)))


def _maddubs(builder, u8, s8):
    """<2n x u8> . <2n x s8> -> <n x i16> pair sums, saturated (the form `pmaddubsw` matches)."""
    n = u8.type.count // 2
    wide = vec(I32, n)
    even = builder.mul(builder.zext(_lanes(builder, u8, range(0, 2 * n, 2)), wide),
                       builder.sext(_lanes(builder, s8, range(0, 2 * n, 2)), wide))
    odd = builder.mul(builder.zext(_lanes(builder, u8, range(1, 2 * n, 2)), wide),
                      builder.sext(_lanes(builder, s8, range(1, 2 * n, 2)), wide))
    s = builder.add(even, odd)
    s = builder.call(_vector_fn(builder.module, "llvm.smax", wide, 2), [s, ir.Constant(wide, [-32768] * n)])
    s = builder.call(_vector_fn(builder.module, "llvm.smin", wide, 2), [s, ir.Constant(wide, [32767] * n)])
    return builder.trunc(s, vec(I16, n))


class Args:
    """Pointers into the numba arrays an intrinsic was given, and its run-time knobs."""

    def __init__(self, context, builder, sig, args):
        self.context, self.builder, self.sig, self.args = context, builder, sig, args
        knobs = args[-1]
        b = builder
        self.mask4_scalar, self.mask2_scalar = knobs, b.lshr(knobs, ir.Constant(knobs.type, 16))
        self.mask4 = _splat(b, knobs, I8, 32)
        self.shift4_scalar = b.and_(b.lshr(knobs, ir.Constant(knobs.type, 8)), ir.Constant(knobs.type, 255))
        self.shift4 = _splat(b, self.shift4_scalar, I8, 32)
        self.mask2 = _splat(b, b.lshr(knobs, ir.Constant(knobs.type, 16)), I8, 32)
        self.zero = b.trunc(b.lshr(knobs, ir.Constant(knobs.type, 24)), I32)
        self.zero16 = _splat(b, self.zero, I16, 16)  # xor'ed into pmaddubsw results: see the docstring

    def load32(self, which: int, offset, extra: int):
        """<32 x i8> at array argument `which`, element index `offset + extra`."""
        b = self.builder
        arr = self.context.make_array(self.sig.args[which])(self.context, b, self.args[which])
        idx = b.add(offset, ir.Constant(offset.type, extra))
        ptr = b.bitcast(b.gep(arr.data, [idx]), vec(I8, 32).as_pointer())
        return b.load(ptr, align=1)


def q4_k_scales_mins(builder, u0, u1, u2):
    """The 12 packed 6-bit scale/min bytes (as three little-endian i32) -> <16 x i8>: 8 scales,
    then 8 mins (llama.cpp's kmask unpacking of get_scale_min_k4)."""
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    k1, k2, k3 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    b = builder
    sc_lo = b.and_(u0, k1)
    sc_hi = b.or_(b.and_(u2, k2), b.shl(b.and_(b.lshr(u0, c(6)), k3), c(4)))
    mn_lo = b.and_(u1, k1)
    mn_hi = b.or_(b.and_(b.lshr(u2, c(4)), k2), b.shl(b.and_(b.lshr(u1, c(6)), k3), c(4)))
    v = ir.Constant(vec(I32, 4), ir.Undefined)
    for i, part in enumerate((sc_lo, sc_hi, mn_lo, mn_hi)):
        v = b.insert_element(v, part, c(i))
    return b.bitcast(v, vec(I8, 16))


# Each block asks for the cache lines PREFETCH bytes ahead of it in the weights (past the row's
# end that is the next row, which the same thread reads next). Decode streams ~500 MB of weights
# per token from DRAM, and without this the row kernels reached ~10 GB/s on matrices not in L3
# against 20-23 GB/s on one that is (the hardware prefetcher alone left the cores waiting).
# Measured on znver3, 2 threads, the 0.8B models' decode matrix-vector products (per-matrix loop,
# alternating processes, 3-4 rounds): Q4_K_M 48.9-53.4 -> 40.8-53.5 ms per token (mean 51.4 ->
# 46.3), Q8_0 71.9-75.4 -> 59.6-68.1; 256 bytes did little, 1024 matched 512 on Q8_0 and was
# worse on the K formats, 2048 worse. A prefetch past the array's end is harmless (no fault).
# Intel cores want it further ahead: on an Emerald Rapids VM (2 threads, whole 0.8B Q4_K_M decode
# steps, best of 4 x 16 per process, processes alternating, ms per token) 512 bytes 60-76,
# 1024 56-65, 2048 48-61, 3072 38-56, 4096 43-63, 8192 62-64 (the host's noise is ±15 %).
PREFETCH = 512          # AMD (znver*) and anything not x86
PREFETCH_INTEL = 2048   # other x86 CPU names: Intel's, and the generic x86-64 levels
# x86's x4 decode rows (x86/x4.py: blocks of 4 rows, 592 bytes of Q4_K where a row's block is
# 144) want about as many blocks ahead, so 4x the bytes. Zen 3, 2 threads, one process, the
# kernels compiled both ways and alternating, 12 rounds over 48 matrices of 3584x1024 not in
# cache, median GB/s 512 vs 2048: Q4_K 22.0 / 22.2 and 24.1 / 26.6, Q6_K 21.1 / 25.1 and 25.9 /
# 30.0, Q8_0 26.4 / 29.4 and 24.7 / 26.2; whole decode steps of the 0.8B Q8_0, 8 rounds of 32,
# median 39.5 vs 36.1 ms (Q4_K_M: even within the noise, 31.6 vs 32.2).
PREFETCH_X4_DECODE = 2048


def prefetch_bytes() -> int:
    """How far ahead of a block the row kernels prefetch, for the CPU numba compiles for."""
    from engine.quant import paths

    t = paths.target()
    return PREFETCH_INTEL if t.machine in paths.X86 and not t.cpu_name.startswith("znver") else PREFETCH


def prefetch(row: Row, p, span: int, ahead: int | None = None):
    """Prefetch the `span` bytes of weights `ahead` (default `prefetch_bytes()`) past the block at
    row offset p."""
    b = row.b
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]),
                                        "llvm.prefetch.p0")
    ahead = prefetch_bytes() if ahead is None else ahead
    for off in range(0, span, 64):
        ptr = array_ptr(row.context, b, row.aty["row"], row.arg["row"], b.add(p, ir.Constant(I64, ahead + off)), I8)
        b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def array_ptr(context, builder, aty, aval, index, elt):
    arr = context.make_array(aty)(context, builder, aval)
    return builder.bitcast(builder.gep(arr.data, [index]), elt.as_pointer())


class GroupScales:
    """A K block's scales per 16 values: `src` <16 x i16> holds them, `lane(g)` is the lane of
    value group g (values 16g..16g+15 of the block). Q4_K: a scale per 32 values (lane g // 2);
    Q6_K: one per 16 (lane g). The ISA files lay them out for their own instructions."""

    def __init__(self, src, lane):
        self.src, self.lane = src, lane

    def packed_pairs(self, builder, groups_a: list[int], groups_b: list[int]):
        """The <n x i32> (as i16 pairs) scale vector for `vpackssdw(A, B)` of two `vpdpbusd`
        results whose 128-bit lane L holds 4-value sums of group groups_a[L] (A) and
        groups_b[L] (B): vpackssdw puts A's four then B's four i16 of each 128-bit lane."""
        idx: list[int] = []
        for ga, gb in zip(groups_a, groups_b):
            idx += [self.lane(ga)] * 4 + [self.lane(gb)] * 4
        v = builder.shuffle_vector(self.src, self.src, ir.Constant(vec(I32, len(idx)), idx))
        return builder.bitcast(v, vec(I32, len(idx) // 2))


def _q4_k_unpack(a: Args, w_arg: int, p):
    """The Q4_K block at w[p]: its 8 runs of 32 quants, the <16 x i16> scale splat of each run,
    and the mins laid out against the 16 activation sums (min j in lanes 2j, 2j+1)."""
    builder = a.builder
    words = []
    for k in (4, 8, 12):
        ptr = array_ptr(a.context, builder, a.sig.args[w_arg], a.args[w_arg],
                         builder.add(p, ir.Constant(p.type, k)), I32)
        words.append(builder.load(ptr, align=1))
    packed = builder.zext(q4_k_scales_mins(builder, *words), vec(I16, 16))
    quants = []
    for c in range(4):
        q = a.load32(w_arg, p, 16 + 32 * c)
        quants.append(builder.and_(q, a.mask4))
        quants.append(builder.and_(builder.lshr(q, a.shift4), a.mask4))
    lanes = lambda m: ir.Constant(vec(I32, 16), m)  # noqa: E731
    scales = [builder.shuffle_vector(packed, packed, lanes([j] * 16)) for j in range(8)]
    mins = builder.shuffle_vector(packed, packed, lanes([8 + i // 2 for i in range(16)]))
    return quants, scales, mins, GroupScales(packed, lambda g: g // 2)


def _q6_k_unpack(a: Args, w_arg: int, p, sc_arg: int, g):
    """The Q6_K block at w[p] (int8 scales at sc[g]): its 8 runs of 32 quants (0..63), the
    <16 x i16> scales of each run (run 4h + t: scale 8h + 2t in lanes 0-7, the next in 8-15),
    and -32 * the 16 scales, laid out against the 16 activation sums (the quants' offset)."""
    builder = a.builder
    sptr = array_ptr(a.context, builder, a.sig.args[sc_arg], a.args[sc_arg], g, vec(I8, 16))
    all16 = builder.sext(builder.load(sptr, align=1), vec(I16, 16))
    # shift amounts as splats of run-time scalars (a shift by a computed vector is emulated
    # lane by lane on x86: vpsllw/vpblendvb chains)
    four = a.shift4_scalar
    two = builder.lshr(four, ir.Constant(four.type, 1))
    qh_shift = [None] + [_splat(builder, v, I8, 32) for v in (two, four, builder.add(two, four))]
    quants = []
    for h in range(2):
        qh = a.load32(w_arg, p, 128 + 32 * h)
        for t in range(4):
            ql = a.load32(w_arg, p, 64 * h + 32 * (t & 1))
            low = builder.and_(ql, a.mask4) if t < 2 else builder.and_(builder.lshr(ql, a.shift4), a.mask4)
            high = qh if t == 0 else builder.lshr(qh, qh_shift[t])
            high = builder.shl(builder.and_(high, a.mask2), ir.Constant(vec(I8, 32), [4] * 32))
            quants.append(builder.or_(low, high))
    scales = [builder.shuffle_vector(all16, all16, ir.Constant(vec(I32, 16), [
        2 * r + (i >= 8) for i in range(16)])) for r in range(8)]
    offset = builder.mul(all16, ir.Constant(vec(I16, 16), [-32] * 16))  # |.| <= 4096
    return quants, scales, offset, GroupScales(all16, lambda g: g)


I64 = ir.IntType(64)


def _sums16(a: Args, xs_arg: int, gx):
    """A token's int16 sums of its activations per 16 values, xs[gx:gx+16], as <16 x i16>."""
    ptr = array_ptr(a.context, a.builder, a.sig.args[xs_arg], a.args[xs_arg], gx, vec(I16, 16))
    return a.builder.load(ptr, align=2)


# Several tokens per weight block (the Q8_0 tile: short suffixes; the K formats' is WIDE_TILE
# below): the block is unpacked once and each token costs only its loads and multiply-adds.
TILE = 4


def _token_offset(builder, base, stride, t: int):
    return builder.add(base, builder.mul(stride, ir.Constant(stride.type, t)))


def store(context, builder, aty, aval, index: int, value):
    builder.store(value, array_ptr(context, builder, aty, aval, ir.Constant(I64, index), value.type))


F32 = ir.FloatType()


def fma(builder, a, b, c):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3),
                                        f"llvm.fma.v{a.type.count}f32")
    return builder.call(fn, [a, b, c])


def sum_lanes_f32(builder, v):
    """Horizontal sum of an <8 x float> by halving (the order is fixed, not reassociated)."""
    while v.type.count > 1:
        n = v.type.count // 2
        v = builder.fadd(_lanes(builder, v, range(n)), _lanes(builder, v, range(n, 2 * n)))
    return builder.extract_element(v, ir.Constant(I32, 0))


# ----------------------------------------------------------------------------- whole rows
# The K formats with llama.cpp's accumulator layout: per token an <8 x i32> of pair sums per
# block (even + odd lanes of the i32 products: x86 `pmaddwd`), converted and multiplied by the
# block's scales into an <8 x float> carried across the row's blocks, one reduction per row.

def pair_sums(builder, a16, b16):
    """<2n x i16> . <2n x i16> -> <n x i32> sums of adjacent products (x86 `pmaddwd`)."""
    n = a16.type.count // 2
    wide = vec(I32, 2 * n)
    products = builder.mul(builder.sext(a16, wide), builder.sext(b16, wide))
    return builder.add(_lanes(builder, products, range(0, 2 * n, 2)), _lanes(builder, products, range(1, 2 * n, 2)))


def splat_f32(builder, value, n: int = 8):
    one = builder.insert_element(ir.Constant(vec(F32, n), ir.Undefined), value, ir.Constant(I32, 0))
    return _lanes(builder, one, [0] * n)


def half_at(context, builder, aty, aval, index, lane: int = 0):
    """The f16 at element `index` of a uint8 array, as float32, read as lane `lane` of four f16
    lanes: the caller chooses the lane that keeps all 8 bytes inside the block."""
    # Four f16 lanes are loaded and converted as a vector: a scalar fpext became `vpinsrw $0, mem, %xmm0, %xmm1` on AVX2,
    # merging into whatever register LLVM chose for the unused lanes — the float accumulator —
    # so each block's scale waited for the previous block's FMA (a ~25-cycle chain per Q8_0
    # block: 3.3 GB/s against 13 on AVX-512 at 3584x1024, one thread, Emerald Rapids).
    # The load is volatile: where only one lane is used LLVM otherwise narrows it to one f16,
    # `vpinsrw $0, mem, %xmm0` merged into an undefined register it may take from the float
    # accumulator, the same chain (Q5_0 3584x896 rows, one thread, Zen 3: 7.3 GB/s).
    start = builder.sub(index, ir.Constant(index.type, 2 * lane)) if lane else index
    ptr = array_ptr(context, builder, aty, aval, start, vec(I16, 4))
    halves = builder.bitcast(_volatile_load(builder, ptr, 1), ir.VectorType(ir.HalfType(), 4))
    return builder.extract_element(builder.fpext(halves, vec(F32, 4)), ir.Constant(I32, lane))


class _VolatileLoad(ir.LoadInstr):
    """`load volatile` (llvmlite's builder has no flag for it): LLVM keeps its width and count."""

    def descr(self, buf):
        plain: list[str] = []
        super().descr(plain)
        buf.append(plain[0].replace("load ", "load volatile ", 1))


def _volatile_load(builder, ptr, align: int):
    ld = _VolatileLoad(builder.block, ptr, typ=ptr.type.pointee if not ptr.type.is_opaque else None)
    ld.align = align
    builder._insert(ld)
    return ld


_K_ROW = ("row", "nb", "xq", "xd", "xs", "knobs")
_K_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "xs", "so", "sstride", "res", "knobs")
_Q8_0_ROW = ("row", "nb", "xq", "xd")
_Q8_0_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "res")


class Row:
    """The arguments of a row intrinsic by name, and token t's offsets into the activations."""

    def __init__(self, context, builder, signature, args, names, ntok: int):
        self.context, self.b, self.ntok = context, builder, ntok
        self.arg = dict(zip(names, args))
        self.aty = dict(zip(names, signature.args))
        self.ix = {n: k for k, n in enumerate(names)}

    def offset(self, base: str, stride: str, t: int):
        return ir.Constant(I64, 0) if self.ntok == 1 else _token_offset(self.b, self.arg[base], self.arg[stride], t)

    def load(self, name: str, index, elt, align: int | None = None):
        """Array `name` at element `index`, read as `elt` (give `align` for vectors: numba
        arrays guarantee only their element's alignment)."""
        return self.b.load(array_ptr(self.context, self.b, self.aty[name], self.arg[name], index, elt), align=align)

    def half(self, index, lane: int = 0):
        return half_at(self.context, self.b, self.aty["row"], self.arg["row"], index, lane)


def row_codegen(names, ntok: int, block, lanes: int = 8):
    """Codegen of a row intrinsic: `block(row, a, i, accs)` adds block i of the row times each
    token's activations into the tokens' <lanes x float> accumulators (allocas); after the last
    block, one horizontal sum per token (returned for one token, else stored to `res`)."""
    def codegen(context, builder, signature, args):
        b = builder
        row = Row(context, b, signature, args, names, ntok)
        a = Args(context, b, signature, args) if "knobs" in names else None
        vf = vec(F32, lanes)
        accs = [cgutils.alloca_once_value(b, ir.Constant(vf, [0.0] * lanes)) for _ in range(ntok)]
        with cgutils.for_range(b, row.arg["nb"]) as loop:
            i = b.sext(loop.index, I64) if loop.index.type.width < 64 else loop.index
            block(row, a, i, accs)
        totals = [sum_lanes_f32(b, b.load(acc)) for acc in accs]
        if ntok == 1:
            return totals[0]
        for t, total in enumerate(totals):
            store(context, b, row.aty["res"], row.arg["res"], t, total)
        return context.get_dummy_value()

    return codegen


def accumulate(b, acc_ptr, isum, scale):
    """acc += float(isum) * splat(scale), for an <n x i32> isum and an <n x float> acc."""
    n = isum.type.count
    b.store(fma(b, b.sitofp(isum, vec(F32, n)), splat_f32(b, scale, n), b.load(acc_ptr)), acc_ptr)


def k_row_block(kind: str, row: Row, a: Args, i):
    """Block i of a Q4_K / Q6_K row as eight 32-byte runs (prefetching ahead): (quants, the
    runs' scale vectors, Q4_K's mins or Q6_K's -32 offset against the activation sums, the
    GroupScales, d, Q4_K's dmin or None)."""
    b = row.b
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    if kind == "q4_k":
        p = b.mul(i, i64(144))
        prefetch(row, p, 144)
        quants, scales, mins, groups = _q4_k_unpack(a, row.ix["row"], p)
        return quants, scales, mins, groups, row.half(p), row.half(b.add(p, i64(2)))
    p = b.mul(i, i64(210))
    prefetch(row, p, 210)
    quants, scales, offset, groups = _q6_k_unpack(a, row.ix["row"], p, row.ix["row"], b.add(p, i64(192)))
    return quants, scales, offset, groups, row.half(b.add(p, i64(208)), lane=3), None


def _k_block(kind: str):
    """Block body of the Q4_K / Q6_K rows (Q8_K activations: 256 int8, f32 scale, int16 sums)."""
    def block(row, a, i, accs):
        b = row.b
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        quants, scales, by_sums, _, d, dmin = k_row_block(kind, row, a, i)  # by_sums: mins / offset
        for t in range(row.ntok):
            o = b.add(row.offset("xo", "xstride", t), b.mul(i, i64(256)))
            sums = _sums16(a, row.ix["xs"], b.add(row.offset("so", "sstride", t), b.mul(i, i64(16))))
            isum = ir.Constant(vec(I32, 8), [0] * 8)
            for j, (q, sv) in enumerate(zip(quants, scales)):
                p16 = b.xor(_maddubs(b, q, a.load32(row.ix["xq"], o, 32 * j)), a.zero16)
                isum = b.add(isum, pair_sums(b, p16, sv))
            xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
            if kind == "q4_k":
                accumulate(b, accs[t], isum, b.fmul(d, xd))
                accumulate(b, accs[t], pair_sums(b, sums, by_sums), b.fsub(ir.Constant(F32, 0.0), b.fmul(dmin, xd)))
            else:
                accumulate(b, accs[t], b.add(isum, pair_sums(b, sums, by_sums)), b.fmul(d, xd))
    return block


def _q8_0_block(row, a, i, accs):
    """Block body of the Q8_0 rows (34 bytes: f16 scale, 32 int8) times Q8_0 activations (int8
    values as int16, f32 block scales): i32 products of sign-extended lanes, even plus odd
    lanes (x86 `pmaddwd`), the weights widened once for all tokens."""
    b = row.b
    p = b.mul(i, ir.Constant(I64, 34))
    prefetch(row, p, 34)
    d = row.half(p)
    weights = b.sext(row.load("row", b.add(p, ir.Constant(I64, 2)), vec(I8, 32), align=1), vec(I32, 32))
    for t in range(row.ntok):
        o = b.add(row.offset("xo", "xstride", t), b.mul(i, ir.Constant(I64, 32)))
        products = b.mul(weights, b.sext(row.load("xq", o, vec(I16, 32), align=2), vec(I32, 32)))
        pairs = b.add(_lanes(b, products, range(0, 32, 2)), _lanes(b, products, range(1, 32, 2)))
        block_sums = b.add(_lanes(b, pairs, range(8)), _lanes(b, pairs, range(8, 16)))
        xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
        accumulate(b, accs[t], block_sums, b.fmul(d, xd))


# ----------------------------------------------------------------------------- several tokens
# Prefill (and a chat turn's suffix) with 64-byte vectors: on AVX-512 one `vpmaddubsw` and one
# `vpdpwssd` cover two runs of 32 weights (llama.cpp's 2 multiplies per 64 MACs, against fp32
# BLAS's 4 FMAs), the weight block is unpacked once for WIDE_TILE tokens. Where the registers
# are 256 bits wide (AVX2, NEON) LLVM splits each operation in two, which is the row kernel's
# code again. The two runs of a vector must come from one loaded vector: a <64 x i8> made as
# concat(q & 15, q >> 4) lost the `pmaddubsw` match (vpmovsxbd + vpmaddwd, 2.5x slower), so the
# 32 bytes are broadcast to both halves and shifted per 16-bit lane (vpsrlvw) by 0 | 4.
# Measured (Q4_K 3584x1024, T = 512, 2 threads, Zen 5, kernels.MatvecPlan.tokens): the 256-bit
# tile 148 GMAC/s, this one 243 with the mins inside and 264-268 with them apart, against
# dequantize + fp32 BLAS 216-238.
WIDE_TILE = 4


def _both_halves(b, v32, shifts):
    """<32 x i8> v32 -> <64 x i8> [v32 >> shifts[0], v32 >> shifts[1]] (per-byte shifts done in
    16-bit lanes: the caller masks away the bits that cross from the neighbouring byte)."""
    v = b.shuffle_vector(v32, v32, ir.Constant(vec(I32, 64), list(range(32)) * 2))
    if shifts == (0, 0):
        return v
    amounts = ir.Constant(vec(I16, 32), [shifts[0]] * 16 + [shifts[1]] * 16)
    return b.bitcast(b.lshr(b.bitcast(v, vec(I16, 32)), amounts), vec(I8, 64))


def widen8(b, v8):
    """<8 x i32> -> <16 x i32> with zeros in the upper lanes."""
    return b.shuffle_vector(v8, ir.Constant(v8.type, [0] * 8), ir.Constant(vec(I32, 16), list(range(16))))


class WideBlock:
    """K block i of a row as four <64 x u8> vectors, vector c holding the block's values
    64c..64c+63 (two runs of 32: the tiles load the activations at 64c), its `GroupScales`, the
    f16 scale d, and (Q6_K) the quants' -32 offset as <16 x i16> against the activation sums."""

    def __init__(self, quants, groups: GroupScales, d, offset):
        self.quants, self.groups, self.d, self.offset = quants, groups, d, offset


def wide_unpack(kind: str, row: Row, a: Args, i) -> WideBlock:
    """Unpack block i of the row: per 32 bytes one load, broadcast to both halves of a 64-byte
    vector and shifted per 16-bit lane (`_both_halves`: one vector for two runs)."""
    b = row.b
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    mask4 = _splat(b, a.mask4_scalar, I8, 64)
    mask2 = _splat(b, a.mask2_scalar, I8, 64)
    quants = []
    if kind == "q4_k":
        p = b.mul(i, i64(144))
        prefetch(row, p, 144)
        words = [row.load("row", b.add(p, i64(k)), I32, align=1) for k in (4, 8, 12)]
        packed = b.zext(q4_k_scales_mins(b, *words), vec(I16, 16))
        for c in range(4):
            q = row.load("row", b.add(p, i64(16 + 32 * c)), vec(I8, 32), align=1)
            quants.append(b.and_(_both_halves(b, q, (0, 4)), mask4))
        return WideBlock(quants, GroupScales(packed, lambda g: g // 2), row.half(p), None)
    p = b.mul(i, i64(210))
    prefetch(row, p, 210)
    sptr = array_ptr(row.context, b, row.aty["row"], row.arg["row"], b.add(p, i64(192)), vec(I8, 16))
    all16 = b.sext(b.load(sptr, align=1), vec(I16, 16))
    four = _splat(b, a.shift4_scalar, I8, 64)
    for h in range(2):
        ql = row.load("row", b.add(p, i64(64 * h)), vec(I8, 64), align=1)
        qh = row.load("row", b.add(p, i64(128 + 32 * h)), vec(I8, 32), align=1)
        for k, low in enumerate((b.and_(ql, mask4), b.and_(b.lshr(ql, four), mask4))):
            high = b.and_(_both_halves(b, qh, (4 * k, 4 * k + 2)), mask2)
            quants.append(b.or_(low, b.shl(high, ir.Constant(vec(I8, 64), [4] * 64))))
    offset = b.mul(all16, ir.Constant(vec(I16, 16), [-32] * 16))  # the quants' -32, |.| <= 4096
    return WideBlock(quants, GroupScales(all16, lambda g: g), row.half(b.add(p, i64(208)), lane=3), offset)


def token_sums(row: Row, a: Args, i, t: int):
    """Token t's int16 activation sums per 16 values of block i, <16 x i16>."""
    b = row.b
    return _sums16(a, row.ix["xs"], b.add(row.offset("so", "sstride", t), b.mul(i, ir.Constant(I64, 16))))


def token_scale(row: Row, blk: WideBlock, i, t: int):
    """d of the weight block times token t's Q8_K block scale."""
    xd = row.load("xd", row.b.add(row.offset("do", "dstride", t), i), F32)
    return row.b.fmul(blk.d, xd)


def token_values(row: Row, i, t: int, c: int, nbytes: int):
    """Token t's int8 activations c*nbytes .. of block i, <nbytes x i8>."""
    b = row.b
    o = b.add(row.offset("xo", "xstride", t), b.mul(i, ir.Constant(I64, 256)))
    return row.load("xq", b.add(o, ir.Constant(I64, nbytes * c)), vec(I8, nbytes), align=1)


def _k_block_wide(kind: str):
    """Portable block body of the Q4_K / Q6_K tiles (generic IR, any LLVM target): four
    <64 x u8> weight vectors and their <32 x i16> scale vectors, then per token four
    `pmaddubsw` + `pmaddwd` shapes into a <16 x i32> block sum, scaled into the token's
    <16 x float> accumulator. Q4_K's mins are left out: the caller subtracts them as one small
    float product for all blocks (kernels.py), which measured ~20% faster than a float
    multiply-add per block and token here. The x86 levels have their own files
    (x86/avx2.py, x86/avx512.py: `tile_block`)."""
    def block(row, a, i, accs):
        b = row.b
        blk = wide_unpack(kind, row, a, i)
        g = blk.groups
        scales = [b.shuffle_vector(g.src, g.src, ir.Constant(vec(I32, 32), [g.lane(4 * c + j // 8) for j in range(32)]))
                  for c in range(4)]
        for t in range(row.ntok):
            isum = None
            for c, (q, sv) in enumerate(zip(blk.quants, scales)):
                part = pair_sums(b, _maddubs(b, q, token_values(row, i, t, c, 64)), sv)
                isum = part if isum is None else b.add(isum, part)
            if blk.offset is not None:
                isum = b.add(isum, widen8(b, pair_sums(b, token_sums(row, a, i, t), blk.offset)))
            accumulate(b, accs[t], isum, token_scale(row, blk, i, t))
    return block


def q3_k_scales(b, u0, u1, u2):
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
    v = ir.Constant(vec(I32, 4), ir.Undefined)
    for k, part in enumerate(parts):
        v = b.insert_element(v, part, c(k))
    return b.sub(b.bitcast(v, vec(I8, 16)), ir.Constant(vec(I8, 16), [32] * 16))


# The ISA files' block bodies, registered by each at its import (x86/avx2.py, x86/avx512.py,
# arm/neon.py; kernels.py, the dispatcher above, imports them): this file names no ISA file.
# A body maker takes (kind, level) and returns (block body, accumulator lanes).
BodyMaker = Callable[[str, Any], tuple[Callable, int]]
_TILE_BODIES: dict[str, BodyMaker] = {}
_ROW_BODIES: dict[str, BodyMaker] = {}


def register_bodies(levels: Iterable[str], *, tile: BodyMaker, row: BodyMaker | None = None) -> None:
    """An ISA file's tile (and, where it has its own, row) block bodies for `levels`."""
    for level in levels:
        _TILE_BODIES[str(level)] = tile
        if row is not None:
            _ROW_BODIES[str(level)] = row


def _registered(table: dict[str, BodyMaker], level) -> BodyMaker:
    maker = table.get(str(level))
    if maker is None:
        raise RuntimeError(f"no block body registered for level {level}: import engine.quant.kernels (it imports "
                           "the ISA files) before compiling an int8 kernel")
    return maker


def _tile_block(kind: str):
    """The tile's block body for the level numba compiles for (engine/quant/paths.py), and the
    width of its float accumulators."""
    from engine.quant import paths

    level = paths.target().level
    if level.is_arm:
        return _registered(_TILE_BODIES, level)(kind, level)
    _portable(kind)
    if level.is_x86_int8:
        return _registered(_TILE_BODIES, level)(kind, level)
    return _k_block_wide(kind), 16


def _portable(kind: str) -> None:
    if kind == "q5_k":
        raise TypeError("the Q5_K integer kernels are arm64's (arm/neon.py); kernels.has_int8_kernels "
                        "keeps Q5_K on the float kernels elsewhere")


def _row_block(kind: str):
    """The decode row's block body for the level numba compiles for, and its accumulator width:
    arm64 with dot products has its own (arm/neon.py), every other level this file's IR."""
    from engine.quant import paths

    level = paths.target().level
    if level.is_arm:
        return _registered(_ROW_BODIES, level)(kind, level)
    _portable(kind)
    return (_q8_0_block if kind == "q8_0" else _k_block(kind)), 8


def _q8_0_tile_block():
    from engine.quant import paths

    level = paths.target().level
    if level.is_arm:
        return _registered(_TILE_BODIES, level)("q8_0", level)
    return _q8_0_block, 8


@intrinsic
def q4_k_row_dot(typingctx, row, nb, xq, xd, xs, knobs):
    """The Q4_K row (nb blocks) times one token's Q8_K activations (xq int8, xd block scales, xs
    int16 sums per 16 values), as float32."""
    block, lanes = _row_block("q4_k")
    return types.float32(row, nb, xq, xd, xs, knobs), row_codegen(_K_ROW, 1, block, lanes=lanes)


@intrinsic
def q6_k_row_dot(typingctx, row, nb, xq, xd, xs, knobs):
    """`q4_k_row_dot` for a Q6_K row."""
    block, lanes = _row_block("q6_k")
    return types.float32(row, nb, xq, xd, xs, knobs), row_codegen(_K_ROW, 1, block, lanes=lanes)


@intrinsic
def q5_k_row_dot(typingctx, row, nb, xq, xd, xs, knobs):
    """`q4_k_row_dot` for a Q5_K row: arm64 with dot products only (arm/neon.py)."""
    block, lanes = _row_block("q5_k")
    return types.float32(row, nb, xq, xd, xs, knobs), row_codegen(_K_ROW, 1, block, lanes=lanes)


@intrinsic
def q4_k_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, knobs):
    """res[t] = the Q4_K row times token t's activations for t < WIDE_TILE: token t's values at
    xq[xo + t*xstride:], block scales at xd[do + t*dstride:], sums at xs[so + t*sstride:]."""
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, knobs)
    block, lanes = _tile_block("q4_k")
    return sig, row_codegen(_K_TILE, WIDE_TILE, block, lanes=lanes)


@intrinsic
def q6_k_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, knobs):
    """`q4_k_row_dot_tile` for a Q6_K row."""
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, knobs)
    block, lanes = _tile_block("q6_k")
    return sig, row_codegen(_K_TILE, WIDE_TILE, block, lanes=lanes)


@intrinsic
def q5_k_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, knobs):
    """`q4_k_row_dot_tile` for a Q5_K row: arm64 with dot products only (arm/neon.py)."""
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, knobs)
    block, lanes = _tile_block("q5_k")
    return sig, row_codegen(_K_TILE, WIDE_TILE, block, lanes=lanes)


@intrinsic
def q8_0_row_dot(typingctx, row, nb, xq, xd):
    """The Q8_0 row (nb blocks) times one token's Q8_0 activations (xq int8 values as int16, xd
    block scales), as float32."""
    block, lanes = _row_block("q8_0")
    return types.float32(row, nb, xq, xd), row_codegen(_Q8_0_ROW, 1, block, lanes=lanes)


@intrinsic
def q8_0_row_dot_tile(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, res):
    """res[t] = the Q8_0 row times token t's activations for t < TILE (token t's values at
    xq[xo + t*xstride:], block scales at xd[do + t*dstride:])."""
    sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, res)
    block, lanes = _q8_0_tile_block()
    return sig, row_codegen(_Q8_0_TILE, TILE, block, lanes=lanes)
