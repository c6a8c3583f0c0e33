"""256-bit int8 tiles for the K formats (Q4_K, Q6_K times Q8_K activations), in x86 intrinsics:
the x86-64-v3 floor (AVX2) and AVX-VNNI (AVX2 hosts with VEX `vpdpbusd`/`vpdpwssd`: Alder Lake
and later client cores, Sierra Forest, Zen 5 without AVX-512 enabled).

The block is int8_dot's row layout (`k_row_block`): eight 32-byte runs per 256-value block. Runs are the outer loop and tokens the inner one, so a run's weights and scales
stay in two of the 16 ymm registers while the tile's tokens pass them (the 64-byte layout
split in halves by LLVM needs all 8 runs live at once and spilled on a 16-register target).

* `avx2`: `vpmaddubsw` (u8 weights x s8 activations, pairs to i16) then `vpmaddwd` by the run's
  scales into the token's i32 sums: 2 multiplies per 32 values.
* `avxvnni`: `vpdpbusd` per run (4-value sums in i32), two runs narrowed by `vpackssdw` (the sums
  fit in i16: see x86/avx512.py) and one `vpdpwssd` by the group scales: 1.5 multiplies per 32.
"""
from __future__ import annotations

from llvmlite import ir

from engine.quant.int8_dot import (F32, I8, I16, I32, I64, accumulate, pair_sums, vec, k_row_block, register_bodies,
                                   token_sums, x86_call)


def tile_block(kind: str, vnni: bool):
    """Block body for int8_dot's tile codegen (8-lane float accumulators). Q4_K's mins are left
    to the caller, as in every tile (int8_kernels.mm_k_q8k)."""
    def block(row, a, i, accs):
        b = row.b
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        quants, scales, by_sums, groups, d, _ = k_row_block(kind, row, a, i)
        offset = by_sums if kind == "q6_k" else None  # Q4_K's mins: the caller's
        v8 = vec(I32, 8)
        zero = ir.Constant(v8, [0] * 8)
        offs = [b.add(row.offset("xo", "xstride", t), b.mul(i, i64(256))) for t in range(row.ntok)]

        def x_run(t, j):
            return row.load("xq", b.add(offs[t], i64(32 * j)), vec(I8, 32), align=1)

        isums = [zero] * row.ntok
        if vnni:
            for m in range(4):
                ja, jb = 2 * m, 2 * m + 1
                sv = groups.packed_pairs(b, [2 * ja, 2 * ja + 1], [2 * jb, 2 * jb + 1])
                qa, qb = b.bitcast(quants[ja], v8), b.bitcast(quants[jb], v8)
                for t in range(row.ntok):
                    da = x86_call(b, "llvm.x86.avx512.vpdpbusd.256", v8, [zero, qa, b.bitcast(x_run(t, ja), v8)])
                    db = x86_call(b, "llvm.x86.avx512.vpdpbusd.256", v8, [zero, qb, b.bitcast(x_run(t, jb), v8)])
                    narrow = x86_call(b, "llvm.x86.avx2.packssdw", vec(I16, 16), [da, db])
                    isums[t] = x86_call(b, "llvm.x86.avx512.vpdpwssd.256", v8, [isums[t], b.bitcast(narrow, v8), sv])
        else:
            for j in range(8):
                for t in range(row.ntok):
                    p16 = x86_call(b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), [quants[j], x_run(t, j)])
                    isums[t] = b.add(isums[t], x86_call(b, "llvm.x86.avx2.pmadd.wd", v8, [p16, scales[j]]))
        for t in range(row.ntok):
            isum = isums[t]
            if offset is not None:
                isum = b.add(isum, pair_sums(b, token_sums(row, a, i, t), offset))
            xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
            accumulate(b, accs[t], isum, b.fmul(d, xd))
    return block


# AVX2 and AVX-VNNI: 256-bit, 8-lane float accumulators (AVX-VNNI's `vpdpbusd` in the same body)
register_bodies(("avx2", "avxvnni"), tile=lambda kind, level: (tile_block(kind, vnni=level.vnni), 8))
