"""Integer dot products of K-format weights with Q8_K activations, written as LLVM vector IR.

llama.cpp multiplies a Q4_K/Q6_K row by activations quantized to Q8_K (int8 + one f32 scale per
256 values) in integer arithmetic: u8 x s8 pairs summed to i16 (x86 `pmaddubsw`), i16 x scale
pairs summed to i32 (`pmaddwd`), one float multiply per block. numba cannot say this: it types
integer arithmetic as int64, so its loops run 4 lanes per AVX2 register. The intrinsics below
emit the generic IR patterns LLVM's backends lower to those instructions. No target intrinsic is
named: the same IR compiles on arm64, where it is correct but not yet tuned (see
`INT8_MACHINES` in kernels.py).

Two things keep LLVM on the fast instructions (measured on znver3, Q4_K 1024x3584, 1 thread,
CPU-seconds: float-path kernel 2.5 GB/s, this one 5.5):

* The x86 backend recognises `pmaddubsw` only with its saturation clamp in the IR. When LLVM can
  prove the weight lanes small (after `& 15` or `>> 4` by constants) InstCombine deletes the
  clamp as redundant and the match is lost (the sum is then done with widening shuffles, 3.0-3.4
  GB/s). So the masks and shifts come in at run time (`KNOBS`), values LLVM cannot see.
* `pmaddwd` with a splat scale gets factored to ``(even + odd) * s`` (phadd + pmulld). The odd
  lanes of the scale vector are therefore ``s | zero`` with a run-time zero.
* Per-block bookkeeping stays inside the IR (Q4_K's 6-bit scale/min unpacking, the Q6_K -32
  offset through the activation sums): as scalar numba code it took 2/3 of the Q6_K time.

Left on the table: LLVM still de-interleaves the i16 pair products with shifts/blends before
`pmaddwd` (~50 of ~200 vector instructions per block).
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


def _maddwd(builder, a16, b16):
    """<16 x i16> . <16 x i16> -> <8 x i32> pair sums (the form `pmaddwd` matches)."""
    wide = _vec(I32, 8)
    even = builder.mul(builder.sext(_half_lanes(builder, a16, 16, 0), wide),
                       builder.sext(_half_lanes(builder, b16, 16, 0), wide))
    odd = builder.mul(builder.sext(_half_lanes(builder, a16, 16, 1), wide),
                      builder.sext(_half_lanes(builder, b16, 16, 1), wide))
    return builder.add(even, odd)


class _Args:
    """Pointers into the numba arrays an intrinsic was given, and its run-time knobs."""

    def __init__(self, context, builder, sig, args):
        self.context, self.builder, self.sig, self.args = context, builder, sig, args
        knobs = args[-1]
        b = builder
        self.mask4 = _splat(b, knobs, I8, 32)
        self.shift4 = _splat(b, b.lshr(knobs, ir.Constant(knobs.type, 8)), I8, 32)
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


@intrinsic
def q4_k_block_dot(typingctx, w, p, xq, o, xs, gx, knobs):
    """For the Q4_K block at w[p] and the Q8_K activations xq[o:o+256] (int16 sums per 16 values
    in xs[gx:gx+16]): (msum << 32) | isum as int64, where isum = sum_j scale_j * dot(4-bit quants
    of sub-block j, its 32 activations) and msum = sum_j min_j * (sum of its activations). The
    caller forms d * isum - dmin * msum."""
    sig = types.int64(w, p, xq, o, xs, gx, knobs)

    def codegen(context, builder, signature, args):
        a = _Args(context, builder, signature, args)
        warr = context.make_array(signature.args[0])(context, builder, args[0])
        words = []
        for k in (4, 8, 12):
            ptr = builder.gep(warr.data, [builder.add(args[1], ir.Constant(args[1].type, k))])
            words.append(builder.load(builder.bitcast(ptr, I32.as_pointer()), align=1))
        packed = builder.zext(_q4_k_scales_mins(builder, *words), _vec(I16, 16))
        plain, opaque = packed, builder.or_(packed, _splat(builder, a.zero, I16, 16))

        xarr = context.make_array(signature.args[4])(context, builder, args[4])
        xptr = builder.bitcast(builder.gep(xarr.data, [args[5]]), _vec(I16, 16).as_pointer())
        mins = builder.shuffle_vector(plain, opaque, ir.Constant(
            _vec(I32, 16), [8 + i // 2 + 16 * (i & 1) for i in range(16)]))
        msum = _reduce(builder, _maddwd(builder, mins, builder.load(xptr, align=2)))

        acc = ir.Constant(_vec(I32, 8), [0] * 8)
        for c in range(4):
            q = a.load32(0, args[1], 16 + 32 * c)
            lo = builder.and_(q, a.mask4)
            hi = builder.and_(builder.lshr(q, a.shift4), a.mask4)
            for j, nibbles in ((2 * c, lo), (2 * c + 1, hi)):
                x = a.load32(2, args[3], 32 * j)
                sv = builder.shuffle_vector(plain, opaque, ir.Constant(
                    _vec(I32, 16), [j + 16 * (i & 1) for i in range(16)]))
                acc = builder.add(acc, _maddwd(builder, _maddubs(builder, nibbles, x), sv))
        isum = _reduce(builder, acc)
        hi64 = builder.shl(builder.sext(msum, ir.IntType(64)), ir.Constant(ir.IntType(64), 32))
        return builder.or_(hi64, builder.zext(isum, ir.IntType(64)))

    return sig, codegen


@intrinsic
def q6_k_block_dot(typingctx, w, p, xq, o, sc, g, xs, gx, knobs):
    """sum_v sc[g + v // 16] * (q6_v - 32) * xq[o + v] over the 256 values of the Q6_K block at
    w[p], as int32. `sc` holds the block's int8 scales, `xs[gx:gx+16]` the int16 sums of xq per
    16 values (the -32 offset is taken through them)."""
    sig = types.int32(w, p, xq, o, sc, g, xs, gx, knobs)

    def codegen(context, builder, signature, args):
        a = _Args(context, builder, signature, args)
        sarr = context.make_array(signature.args[4])(context, builder, args[4])
        sptr = builder.bitcast(builder.gep(sarr.data, [args[5]]), _vec(I8, 16).as_pointer())
        even = builder.sext(builder.load(sptr, align=1), _vec(I16, 16))
        odd = builder.or_(even, _splat(builder, a.zero, I16, 16))
        xarr = context.make_array(signature.args[6])(context, builder, args[6])
        xptr = builder.bitcast(builder.gep(xarr.data, [args[7]]), _vec(I16, 16).as_pointer())
        offset = _maddwd(builder, even, builder.load(xptr, align=2))
        acc = builder.sub(ir.Constant(_vec(I32, 8), [0] * 8),
                          builder.shl(offset, ir.Constant(_vec(I32, 8), [5] * 8)))
        two = builder.lshr(a.shift4, ir.Constant(_vec(I8, 32), [1] * 32))
        six = builder.add(two, a.shift4)
        qh_shift = [None, two, a.shift4, six]
        for h in range(2):
            qh = a.load32(0, args[1], 128 + 32 * h)
            for t in range(4):
                ql = a.load32(0, args[1], 64 * h + 32 * (t & 1))
                low = builder.and_(ql, a.mask4) if t < 2 else builder.and_(builder.lshr(ql, a.shift4), a.mask4)
                high = qh if t == 0 else builder.lshr(qh, qh_shift[t])
                high = builder.shl(builder.and_(high, a.mask2), ir.Constant(_vec(I8, 32), [4] * 32))
                q = builder.or_(low, high)
                x = a.load32(2, args[3], 128 * h + 32 * t)
                # lanes 0-7 take scale k, 8-15 scale k+1; odd lanes from the `| zero` copy
                k = 8 * h + 2 * t
                lanes = [(k + (i >= 8)) + 16 * (i & 1) for i in range(16)]
                sv = builder.shuffle_vector(even, odd, ir.Constant(_vec(I32, 16), lanes))
                acc = builder.add(acc, _maddwd(builder, _maddubs(builder, q, x), sv))
        return _reduce(builder, acc)

    return sig, codegen
