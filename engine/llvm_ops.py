"""Bit-level operations numba has no spelling for, as one LLVM instruction each.

Portable LLVM IR (no target intrinsics): the same code compiles for x86_64 and arm64.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic


@intrinsic
def bits_to_f32(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32."""
    if not isinstance(bits, types.Integer):
        return None
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        v = args[0]
        width = bits.bitwidth
        if width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif width < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return sig, codegen


@intrinsic
def half_bits_to_f32(typingctx, bits):
    """IEEE half (the low 16 bits of an integer) -> float32 through LLVM's `fpext half`: one
    vcvtph2ps on x86 (F16C) and one fcvt on arm64, exact for every half (subnormals, inf, nan).
    The integer-and-branches decode it replaced took half of the Q4_K decode kernel's time."""
    if not isinstance(bits, types.Integer):
        return None
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        v = args[0]
        v = builder.trunc(v, ir.IntType(16)) if bits.bitwidth > 16 else v
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())

    return sig, codegen


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693145751953125)     # ln 2 split so n * _LN2_HI is exact
_LN2_LO = np.float32(1.428606765330187e-06)


@njit(inline="always", fastmath=True, cache=True)
def fast_exp(x):
    """e^x in float32 that LLVM vectorises (numba's np.exp is a scalar libm call per element):
    2^n · p(r) with n = round(x / ln 2), |r| <= ln2/2, p the degree-6 Taylor polynomial.
    Max relative error 4.6e-7 over [-87, 88] (measured against float64); inputs are clamped
    there, so no inf/nan (the uses are sigmoid and SiLU, which saturate long before)."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    n = np.floor(x * _LOG2E + np.float32(0.5))
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * bits_to_f32((np.int32(n) + np.int32(127)) << np.int32(23))


@intrinsic
def f32_to_half_to_f32(typingctx, x):
    """float32 rounded to the nearest IEEE half (ties to even, as numpy's astype(float16)) and
    back: `fptrunc` + `fpext`, vcvtps2ph/vcvtph2ps on x86 and fcvt on arm64."""
    if not isinstance(x, types.Float):
        return None
    sig = types.float32(x)

    def codegen(context, builder, signature, args):
        v = args[0]
        if x.bitwidth != 32:
            v = builder.fptrunc(v, ir.FloatType())
        return builder.fpext(builder.fptrunc(v, ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def fp_control_or(typingctx, bits):
    """This thread's floating-point control register (x86 MXCSR, arm64 FPCR) |= bits; returns
    the new value (engine/fpmode.py: the subnormal policy, set inside numba's workers)."""
    if not isinstance(bits, types.Integer):
        return None
    sig = types.uint64(bits)

    def codegen(context, builder, signature, args):
        import platform

        i32, i64 = ir.IntType(32), ir.IntType(64)
        b = builder.zext(args[0], i64) if bits.bitwidth < 64 else args[0]
        mod = builder.module
        if platform.machine() in ("aarch64", "arm64"):  # intrinsics: numba's JIT parses no inline asm there
            read = mod.globals.get("llvm.aarch64.get.fpcr") or ir.Function(mod, ir.FunctionType(i64, []),
                                                                           "llvm.aarch64.get.fpcr")
            write = mod.globals.get("llvm.aarch64.set.fpcr") or ir.Function(
                mod, ir.FunctionType(ir.VoidType(), [i64]), "llvm.aarch64.set.fpcr")
            new = builder.or_(builder.call(read, []), b)
            builder.call(write, [new])
            return new
        ptr_t = ir.IntType(8).as_pointer()
        fty = ir.FunctionType(ir.VoidType(), [ptr_t])
        st = mod.globals.get("llvm.x86.sse.stmxcsr") or ir.Function(mod, fty, "llvm.x86.sse.stmxcsr")
        ld = mod.globals.get("llvm.x86.sse.ldmxcsr") or ir.Function(mod, fty, "llvm.x86.sse.ldmxcsr")
        slot = builder.alloca(i32)
        p = builder.bitcast(slot, ptr_t)
        builder.call(st, [p])
        new = builder.or_(builder.load(slot), builder.trunc(b, i32))
        builder.store(new, slot)
        builder.call(ld, [p])
        return builder.zext(new, i64)

    return sig, codegen


@njit(parallel=True, cache=True)
def fp_control_or_in_workers(bits, n):
    """`fp_control_or(bits)` in n iterations over numba's pool (n >= its thread count reaches
    every worker: numba gives each thread one contiguous share); returns each iteration's value."""
    out = np.empty(n, np.uint64)
    for i in prange(n):
        out[i] = fp_control_or(bits)
    return out
