"""Integer dot products of K-format weights with Q8_K activations, written as LLVM vector IR.

llama.cpp multiplies a Q4_K/Q6_K row by activations quantized to Q8_K (int8 + one f32 scale per
256 values) in integer arithmetic: u8 x s8 pairs summed to i16 (x86 `pmaddubsw`), i16 x scale
pairs summed to i32 (`pmaddwd`), one float multiply per block. numba cannot say this: it types
integer arithmetic as int64, so its loops run 4 lanes per AVX2 register. The intrinsics below
emit the generic IR patterns LLVM's backends lower to those instructions. No target intrinsic is
named, but the IR has only been compiled and checked on x86_64 (`INT8_MACHINES` in kernels.py
keeps arm64 on the float kernels until it is).

What keeps LLVM on the fast instructions (measured on znver3, `python -m bench.kernels`, Q4_K
1024x3584, 1 thread, CPU-seconds: float-path kernel 2.5 GB/s; with the first two points 5.5;
with all of them and the f16 scales through `fpext` 8.7-12):

* The x86 backend recognises `pmaddubsw` only with its saturation clamp in the IR. When LLVM can
  prove the weight lanes small (after `& 15` or `>> 4` by constants) InstCombine deletes the
  clamp as redundant and the match is lost (the sum is then done with widening shuffles, 3.0-3.4
  GB/s). So the masks and shifts come in at run time (`KNOBS`), values LLVM cannot see.
* The scale multiply is written as ``acc += sext(p16) * sext(scale)`` lane by lane, feeding the
  final `reduce.add`: LLVM's X86PartialReduction pass turns such multiply-adds into `pmaddwd`
  (hand-written even/odd pair sums were instead de-interleaved with ~4 shuffles per 32 values).
  The pass wants each multiply operand used once, so every operand is xor'ed with a run-time
  zero of its token's own; the xor on the `pmaddubsw` result also stops InstCombine folding
  sext(trunc(clamp)) away.
* Per-block bookkeeping stays inside the IR (Q4_K's 6-bit scale/min unpacking, the Q6_K -32
  offset through the activation sums): as scalar numba code it took 2/3 of the Q6_K time.
* Shift amounts are splats of run-time scalars: a computed shift vector is emulated lane by
  lane on x86 (vpsllw/vpblendvb chains).

Q8_0 (`q8_0_row_dot`) has a scale per 32 values, so a horizontal reduction per block would cost
as much as the products: the whole row runs inside the IR with an `<8 x float>` accumulator
carried across blocks (llama.cpp's layout) and one reduction at the end. Its products are written
as i32 multiplies of sign-extended lanes, even plus odd lanes, which x86 lowers to `pmaddwd`
(the activations come in as int16, so only the weights are widened in the loop).

Left on the table: the K-format kernels still end every block with horizontal reductions and
scalar float math; the Q8_0 layout would remove them, which matters most for the multi-token
kernels.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)

# byte 0: nibble mask 15, byte 1: shift 4, byte 2: two-bit mask 3, byte 3: zero.
KNOBS = 15 | (4 << 8) | (3 << 16)


def _vec(t: ir.IntType, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _splat(builder, value, t: ir.IntType, n: int):
    v = builder.trunc(value, t) if value.type.width > t.width else builder.zext(value, t) \
        if value.type.width < t.width else value
    one = builder.insert_element(ir.Constant(_vec(t, n), ir.Undefined), v, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, ir.Constant(_vec(t, n), ir.Undefined),
                                  ir.Constant(_vec(I32, n), [0] * n))


def _vector_fn(module, base: str, vt: ir.VectorType, nargs: int, scalar_result: bool = False):
    name = f"{base}.v{vt.count}i{vt.element.width}"
    ret = vt.element if scalar_result else vt
    return cgutils.get_or_insert_function(module, ir.FunctionType(ret, [vt] * nargs), name)


def _half_lanes(builder, v, n: int, odd: int):
    mask = ir.Constant(_vec(I32, n // 2), [2 * i + odd for i in range(n // 2)])
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), mask)


def _maddubs(builder, u8, s8):
    """<32 x u8> . <32 x s8> -> <16 x i16> pair sums, saturated (the form `pmaddubsw` matches)."""
    wide = _vec(I32, 16)
    even = builder.mul(builder.zext(_half_lanes(builder, u8, 32, 0), wide),
                       builder.sext(_half_lanes(builder, s8, 32, 0), wide))
    odd = builder.mul(builder.zext(_half_lanes(builder, u8, 32, 1), wide),
                      builder.sext(_half_lanes(builder, s8, 32, 1), wide))
    s = builder.add(even, odd)
    s = builder.call(_vector_fn(builder.module, "llvm.smax", wide, 2), [s, ir.Constant(wide, [-32768] * 16)])
    s = builder.call(_vector_fn(builder.module, "llvm.smin", wide, 2), [s, ir.Constant(wide, [32767] * 16)])
    return builder.trunc(s, _vec(I16, 16))


def _mul_acc(builder, acc, a16, b16, zero16):
    """acc (<16 x i32>) + a16 * b16 lane by lane, for a sum that ends in a reduction: LLVM's x86
    partial-reduction pass turns the widening multiply-adds feeding it into `pmaddwd`. `a16` is
    xor'ed with a run-time zero so InstCombine cannot fold sext(trunc(clamp)) of `pmaddubsw`."""
    wide = _vec(I32, 16)
    a = builder.sext(builder.xor(a16, zero16), wide)
    return builder.add(acc, builder.mul(a, builder.sext(b16, wide)))


class _Args:
    """Pointers into the numba arrays an intrinsic was given, and its run-time knobs."""

    def __init__(self, context, builder, sig, args):
        self.context, self.builder, self.sig, self.args = context, builder, sig, args
        knobs = args[-1]
        b = builder
        self.mask4 = _splat(b, knobs, I8, 32)
        self.shift4_scalar = b.and_(b.lshr(knobs, ir.Constant(knobs.type, 8)), ir.Constant(knobs.type, 255))
        self.shift4 = _splat(b, self.shift4_scalar, I8, 32)
        self.mask2 = _splat(b, b.lshr(knobs, ir.Constant(knobs.type, 16)), I8, 32)
        self.zero = b.trunc(b.lshr(knobs, ir.Constant(knobs.type, 24)), I32)

    def load32(self, which: int, offset, extra: int):
        """<32 x i8> at array argument `which`, element index `offset + extra`."""
        b = self.builder
        arr = self.context.make_array(self.sig.args[which])(self.context, b, self.args[which])
        idx = b.add(offset, ir.Constant(offset.type, extra))
        ptr = b.bitcast(b.gep(arr.data, [idx]), _vec(I8, 32).as_pointer())
        return b.load(ptr, align=1)


def _reduce(builder, acc):
    return builder.call(_vector_fn(builder.module, "llvm.vector.reduce.add", acc.type, 1, True), [acc])


def _q4_k_scales_mins(builder, u0, u1, u2):
    """The 12 packed 6-bit scale/min bytes (as three little-endian i32) -> <16 x i8>: 8 scales,
    then 8 mins (llama.cpp's kmask unpacking of get_scale_min_k4)."""
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    k1, k2, k3 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    b = builder
    sc_lo = b.and_(u0, k1)
    sc_hi = b.or_(b.and_(u2, k2), b.shl(b.and_(b.lshr(u0, c(6)), k3), c(4)))
    mn_lo = b.and_(u1, k1)
    mn_hi = b.or_(b.and_(b.lshr(u2, c(4)), k2), b.shl(b.and_(b.lshr(u1, c(6)), k3), c(4)))
    v = ir.Constant(_vec(I32, 4), ir.Undefined)
    for i, part in enumerate((sc_lo, sc_hi, mn_lo, mn_hi)):
        v = b.insert_element(v, part, c(i))
    return b.bitcast(v, _vec(I8, 16))


def _array_ptr(context, builder, aty, aval, index, elt):
    arr = context.make_array(aty)(context, builder, aval)
    return builder.bitcast(builder.gep(arr.data, [index]), elt.as_pointer())


def _q4_k_unpack(a: "_Args", w_arg: int, p):
    """The Q4_K block at w[p]: its 8 runs of 32 quants, the <16 x i16> scale splat of each run,
    and the mins laid out against the 16 activation sums (min j in lanes 2j, 2j+1)."""
    builder = a.builder
    words = []
    for k in (4, 8, 12):
        ptr = _array_ptr(a.context, builder, a.sig.args[w_arg], a.args[w_arg],
                         builder.add(p, ir.Constant(p.type, k)), I32)
        words.append(builder.load(ptr, align=1))
    packed = builder.zext(_q4_k_scales_mins(builder, *words), _vec(I16, 16))
    quants = []
    for c in range(4):
        q = a.load32(w_arg, p, 16 + 32 * c)
        quants.append(builder.and_(q, a.mask4))
        quants.append(builder.and_(builder.lshr(q, a.shift4), a.mask4))
    lanes = lambda m: ir.Constant(_vec(I32, 16), m)  # noqa: E731
    scales = [builder.shuffle_vector(packed, packed, lanes([j] * 16)) for j in range(8)]
    mins = builder.shuffle_vector(packed, packed, lanes([8 + i // 2 for i in range(16)]))
    return quants, scales, mins


def _q6_k_unpack(a: "_Args", w_arg: int, p, sc_arg: int, g):
    """The Q6_K block at w[p] (int8 scales at sc[g]): its 8 runs of 32 quants (0..63), the
    <16 x i16> scales of each run (run 4h + t: scale 8h + 2t in lanes 0-7, the next in 8-15),
    and -32 * the 16 scales, laid out against the 16 activation sums (the quants' offset)."""
    builder = a.builder
    sptr = _array_ptr(a.context, builder, a.sig.args[sc_arg], a.args[sc_arg], g, _vec(I8, 16))
    all16 = builder.sext(builder.load(sptr, align=1), _vec(I16, 16))
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
            high = builder.shl(builder.and_(high, a.mask2), ir.Constant(_vec(I8, 32), [4] * 32))
            quants.append(builder.or_(low, high))
    scales = [builder.shuffle_vector(all16, all16, ir.Constant(_vec(I32, 16), [
        2 * r + (i >= 8) for i in range(16)])) for r in range(8)]
    offset = builder.mul(all16, ir.Constant(_vec(I16, 16), [-32] * 16))  # |.| <= 4096
    return quants, scales, offset


_ZERO16 = ir.Constant(_vec(I32, 16), [0] * 16)
I64 = ir.IntType(64)


class _Token:
    """One token's activations: xq[o:o+256] (int8) and xs[gx:gx+16] (int16 sums per 16)."""

    def __init__(self, a: "_Args", x_arg: int, o, xs_arg: int, gx, t: int = 0):
        self.a, self.x_arg, self.o = a, x_arg, o
        ptr = _array_ptr(a.context, a.builder, a.sig.args[xs_arg], a.args[xs_arg], gx, _vec(I16, 16))
        self.sums = a.builder.load(ptr, align=2)
        # a run-time zero of the token's own: the x86 pass that forms pmaddwd needs every
        # multiply operand used once, and equal scale vectors across a tile's tokens would be
        # merged into one (knobs < 2**24, so every shift of `zero` is zero too)
        z = a.builder.lshr(a.zero, ir.Constant(I32, t)) if t else a.zero
        self.zero16 = _splat(a.builder, z, I16, 16)

    def dot(self, quants, scales, acc):
        """acc + sum over the 8 runs of scale * (quants . their 32 activations)."""
        b = self.a.builder
        for i, (q, sv) in enumerate(zip(quants, scales)):
            x = self.a.load32(self.x_arg, self.o, 32 * i)
            acc = _mul_acc(b, acc, _maddubs(b, q, x), b.xor(sv, self.zero16), self.zero16)
        return acc

    def sums_dot(self, vec16, acc):
        """acc + vec16 * the activation sums, lane by lane."""
        b = self.a.builder
        return _mul_acc(b, acc, self.sums, b.xor(vec16, self.zero16), self.zero16)


def _pack(builder, isum, msum):
    hi = builder.shl(builder.sext(msum, I64), ir.Constant(I64, 32))
    return builder.or_(hi, builder.zext(isum, I64))


@intrinsic
def q4_k_block_dot(typingctx, w, p, xq, o, xs, gx, knobs):
    """For the Q4_K block at w[p] and the Q8_K activations xq[o:o+256] (int16 sums per 16 values
    in xs[gx:gx+16]): (msum << 32) | isum as int64, where isum = sum_j scale_j * dot(4-bit quants
    of sub-block j, its 32 activations) and msum = sum_j min_j * (sum of its activations). The
    caller forms d * isum - dmin * msum."""
    sig = types.int64(w, p, xq, o, xs, gx, knobs)

    def codegen(context, builder, signature, args):
        a = _Args(context, builder, signature, args)
        quants, scales, mins = _q4_k_unpack(a, 0, args[1])
        tok = _Token(a, 2, args[3], 4, args[5])
        msum = _reduce(builder, tok.sums_dot(mins, _ZERO16))
        return _pack(builder, _reduce(builder, tok.dot(quants, scales, _ZERO16)), msum)

    return sig, codegen


@intrinsic
def q6_k_block_dot(typingctx, w, p, xq, o, sc, g, xs, gx, knobs):
    """sum_v sc[g + v // 16] * (q6_v - 32) * xq[o + v] over the 256 values of the Q6_K block at
    w[p], as int32. `sc` holds the block's int8 scales, `xs[gx:gx+16]` the int16 sums of xq per
    16 values (the -32 offset is taken through them)."""
    sig = types.int32(w, p, xq, o, sc, g, xs, gx, knobs)

    def codegen(context, builder, signature, args):
        a = _Args(context, builder, signature, args)
        quants, scales, offset = _q6_k_unpack(a, 0, args[1], 4, args[5])
        tok = _Token(a, 2, args[3], 6, args[7])
        return _reduce(builder, tok.dot(quants, scales, tok.sums_dot(offset, _ZERO16)))

    return sig, codegen


# Several tokens per weight block (prefill of short suffixes): the block is unpacked once and
# each token costs only its loads and multiply-adds. Token t's activations start at
# o + t * stride in xq and gx + t * sstride in xs; results go to res.
TILE = 4


def _token_offset(builder, base, stride, t: int):
    return builder.add(base, builder.mul(stride, ir.Constant(stride.type, t)))


def _store(context, builder, aty, aval, index: int, value):
    builder.store(value, _array_ptr(context, builder, aty, aval, ir.Constant(I64, index), value.type))


@intrinsic
def q4_k_block_dot_tile(typingctx, w, p, xq, o, stride, xs, gx, sstride, res, knobs):
    """`q4_k_block_dot` for TILE tokens: res[t] = the packed int64 of token t."""
    sig = types.void(w, p, xq, o, stride, xs, gx, sstride, res, knobs)

    def codegen(context, builder, signature, args):
        a = _Args(context, builder, signature, args)
        quants, scales, mins = _q4_k_unpack(a, 0, args[1])
        for t in range(TILE):
            tok = _Token(a, 2, _token_offset(builder, args[3], args[4], t), 5,
                         _token_offset(builder, args[6], args[7], t), t)
            msum = _reduce(builder, tok.sums_dot(mins, _ZERO16))
            isum = _reduce(builder, tok.dot(quants, scales, _ZERO16))
            _store(context, builder, signature.args[8], args[8], t, _pack(builder, isum, msum))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def q6_k_block_dot_tile(typingctx, w, p, xq, o, stride, sc, g, xs, gx, sstride, res, knobs):
    """`q6_k_block_dot` for TILE tokens: res[t] = the int32 sum of token t."""
    sig = types.void(w, p, xq, o, stride, sc, g, xs, gx, sstride, res, knobs)

    def codegen(context, builder, signature, args):
        a = _Args(context, builder, signature, args)
        quants, scales, offset = _q6_k_unpack(a, 0, args[1], 5, args[6])
        for t in range(TILE):
            tok = _Token(a, 2, _token_offset(builder, args[3], args[4], t), 7,
                         _token_offset(builder, args[8], args[9], t), t)
            acc = tok.dot(quants, scales, tok.sums_dot(offset, _ZERO16))
            _store(context, builder, signature.args[10], args[10], t, _reduce(builder, acc))
        return context.get_dummy_value()

    return sig, codegen


F32 = ir.FloatType()


def _fma(builder, a, b, c):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3),
                                        f"llvm.fma.v{a.type.count}f32")
    return builder.call(fn, [a, b, c])


def _lanes(builder, v, idx):
    return builder.shuffle_vector(v, v, ir.Constant(_vec(I32, len(idx)), list(idx)))


def _sum_lanes_f32(builder, v):
    """Horizontal sum of an <8 x float> by halving (the order is fixed, not reassociated)."""
    while v.type.count > 1:
        n = v.type.count // 2
        v = builder.fadd(_lanes(builder, v, range(n)), _lanes(builder, v, range(n, 2 * n)))
    return builder.extract_element(v, ir.Constant(I32, 0))


@intrinsic
def q8_0_row_dot(typingctx, row, xq16, xd, nb):
    """sum_b f16(row block b scale) * xd[b] * (the block's 32 int8 quants . xq16[32b:32b+32]) over
    the nb Q8_0 blocks (34 bytes: f16 scale, 32 int8) of `row` (uint8), as float32. `xq16` holds
    the activations quantized to Q8_0 (int8 values as int16), `xd` their block scales."""
    sig = types.float32(row, xq16, xd, nb)

    def codegen(context, builder, signature, args):
        b = builder
        w = context.make_array(signature.args[0])(context, b, args[0])
        xq = context.make_array(signature.args[1])(context, b, args[1])
        xd = context.make_array(signature.args[2])(context, b, args[2])
        v8f = _vec(F32, 8)
        acc_ptr = cgutils.alloca_once_value(b, ir.Constant(v8f, [0.0] * 8))
        with cgutils.for_range(b, args[3]) as loop:
            i = loop.index
            p = b.mul(i, ir.Constant(i.type, 34))
            w_scale_ptr = b.bitcast(b.gep(w.data, [p]), I16.as_pointer())
            w_scale = b.fpext(b.bitcast(b.load(w_scale_ptr, align=1), ir.HalfType()), F32)
            scale = b.fmul(w_scale, b.load(b.gep(xd.data, [i])))
            quants_ptr = b.bitcast(b.gep(w.data, [b.add(p, ir.Constant(p.type, 2))]), _vec(I8, 32).as_pointer())
            x_ptr = b.bitcast(b.gep(xq.data, [b.mul(i, ir.Constant(i.type, 32))]), _vec(I16, 32).as_pointer())
            products = b.mul(b.sext(b.load(quants_ptr, align=1), _vec(I32, 32)),
                             b.sext(b.load(x_ptr, align=2), _vec(I32, 32)))
            pairs = b.add(_lanes(b, products, range(0, 32, 2)), _lanes(b, products, range(1, 32, 2)))
            block_sums = b.add(_lanes(b, pairs, range(8)), _lanes(b, pairs, range(8, 16)))
            scale8 = _lanes(b, b.insert_element(ir.Constant(v8f, ir.Undefined), scale, ir.Constant(I32, 0)), [0] * 8)
            b.store(_fma(b, b.sitofp(block_sums, v8f), scale8, b.load(acc_ptr)), acc_ptr)
        return _sum_lanes_f32(b, b.load(acc_ptr))

    return sig, codegen
