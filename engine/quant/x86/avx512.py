"""AVX-512 int8 tiles for the K formats (Q4_K, Q6_K times Q8_K activations), in x86 intrinsics.

The block layout is int8_dot.wide_unpack's: four 64-byte weight vectors per 256-value block,
vector c against the token's activations 64c..64c+63.

* `avx512vnni` (Ice Lake and later Xeons, Zen 4/5): one `vpdpbusd` per vector gives 4-value sums
  (u8 weights x s8 activations) in 16 i32 lanes; two of them are narrowed into one vector by
  `vpackssdw` (every sum fits: Q4_K |4·15·127|, Q6_K |4·63·127| = 32004 < 32767) and one
  `vpdpwssd` applies the per-group scales. Per token and block that is 4 + 2 multiplies and 2
  shuffles, against 4 `vpmaddubsw` + 4 `vpmaddwd` before: Intel runs 512-bit integer multiplies
  on one port (p0) and shuffles on another (p5), so moving work from multiplies to shuffles is
  what helps there (Zen 4/5 have two multiply pipes and did not need it).
* `avx512bw` (Skylake-X, Cascade Lake without VNNI): `vpmaddubsw` then `vpmaddwd` by the scales.

Measured on a 2-core Emerald Rapids VM, 3584x1024 Q4_K at T = 512, all variants and
dequantize + fp32 BLAS alternating in one process, best of 20 (GMAC/s, three runs):
generic IR (LLVM's own instruction choice) 64-89, maddubs + dpwssd intrinsics 66-86,
dpbusd + packssdw + dpwssd 81-95, dequantize + OpenBLAS SkylakeX sgemm 80-94. The host
measured ±15 % between runs; the VNNI form was never behind the others.
"""
from __future__ import annotations

from llvmlite import ir

from engine.quant.int8_dot import (I16, I32, accumulate, vec, widen8, pair_sums, register_bodies, token_scale,
                                   token_sums, token_values, wide_unpack, x86_call)


def tile_block(kind: str, vnni: bool):
    """Block body for int8_dot's tile codegen (16-lane float accumulators)."""
    def block(row, a, i, accs):
        b = row.b
        blk = wide_unpack(kind, row, a, i)
        g = blk.groups
        v16 = vec(I32, 16)
        zero = ir.Constant(v16, [0] * 16)
        if vnni:
            # vector c's 128-bit lane L holds the sums of value group 4c + L
            pairs = [(0, 1), (2, 3)]
            pscales = [g.packed_pairs(b, [4 * ca + L for L in range(4)], [4 * cb + L for L in range(4)])
                       for ca, cb in pairs]
            qv = [b.bitcast(q, v16) for q in blk.quants]
        else:
            scales = [b.bitcast(b.shuffle_vector(g.src, g.src, ir.Constant(vec(I32, 32),
                                                 [g.lane(4 * c + j // 8) for j in range(32)])), v16)
                      for c in range(4)]
        for t in range(row.ntok):
            xs = [token_values(row, i, t, c, 64) for c in range(4)]
            if vnni:
                dots = [x86_call(b, "llvm.x86.avx512.vpdpbusd.512", v16, [zero, qv[c], b.bitcast(xs[c], v16)])
                        for c in range(4)]
                isum = zero
                for (ca, cb), sv in zip(pairs, pscales):
                    narrow = x86_call(b, "llvm.x86.avx512.packssdw.512", vec(I16, 32), [dots[ca], dots[cb]])
                    isum = x86_call(b, "llvm.x86.avx512.vpdpwssd.512", v16, [isum, b.bitcast(narrow, v16), sv])
            else:
                isum = None
                for c in range(4):
                    p16 = x86_call(b, "llvm.x86.avx512.pmaddubs.w.512", vec(I16, 32), [blk.quants[c], xs[c]])
                    part = x86_call(b, "llvm.x86.avx512.pmaddw.d.512", v16, [p16, b.bitcast(scales[c], vec(I16, 32))])
                    isum = part if isum is None else b.add(isum, part)
            if blk.offset is not None:
                isum = b.add(isum, widen8(b, pair_sums(b, token_sums(row, a, i, t), blk.offset)))
            accumulate(b, accs[t], isum, token_scale(row, blk, i, t))
    return block


# AVX-512 BW and VNNI: 512-bit, 16-lane float accumulators
register_bodies(("avx512bw", "avx512vnni"), tile=lambda kind, level: (tile_block(kind, vnni=level.vnni), 16))
