"""arm64 int8 kernels (Graviton2 and later): Q4_K, Q5_K, Q6_K times Q8_K activations and Q8_0
times Q8_0 activations with `sdot` (Armv8.2 dot product), through LLVM's aarch64 intrinsics.

llama.cpp's NEON `ggml_vec_dot_q4_K_q8_K` and friends multiply 16 int8 weights by 16 int8
activations per `sdot` (four 4-value sums into the four i32 lanes), take one horizontal sum
(`vaddvq`) per sub-block and scale it in scalar code. Here the sub-block's scale multiplies the
`sdot` result as a vector (`mla` by element) into one i32 vector per block, converted and scaled
into a float accumulator vector once per block, one horizontal sum per row: no per-sub-block
horizontal sums.

Why the unpacking is safe in `sdot`: Q4_K quants are 0..15, Q5_K 0..31, Q6_K 0..63 (its -32
offset goes through the activations' sums, as on x86), so every quant is a valid *signed* int8
and a lane's 4 products sum to at most 4·63·127 = 32004; times a 6-bit (K4/K5) or int8 (Q6_K)
sub-block scale and summed over a block that is below 2^27. Nothing saturates (x86's
`pmaddubsw` does, which is why int8_dot.py keeps its clamp; `sdot` has none to lose).

The intrinsic is named explicitly (`llvm.aarch64.neon.sdot.v4i32.v16i8`): LLVM 22.1's
auto-vectorised int8 reductions on SVE targets lower through a partial reduction that is wrong at
vector lengths above 128 bits (docs/arm64.md, llvm/llvm-project#204939); fixed 128-bit NEON
intrinsics never take that path, and `sdot` exists on every Graviton (N1, V1, V2).

Layout: a K block is 16 vectors of 16 quants, vector k the block's values 16k..16k+15 (the
16-value group k: Q6_K's scale granularity; Q4_K/Q5_K have one scale per two groups), against
the activations at 256i + 16k. The tiles (several tokens) loop runs outer and tokens inner, so
a run's two weight vectors and its scale stay in registers while the tile's tokens pass them.

Where they run: `paths.Target.level` is `neon-dotprod` (dotprod, e.g. neoverse-n1) or
`neon-i8mm` (V1/V2); int8_dot's row and tile intrinsics take their block bodies from here on
those levels (`row_block`, `tile_block`). On `neon-i8mm` the prefill tiles are the `smmla`
row-pair intrinsics at the end of this file (arm.tiles.mm_k_smmla, mm_q8_0_smmla).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.int8_dot import (F32, I8, I16, I32, I64, Row, accumulate, array_ptr, pair_sums, prefetch,
                                   q4_k_scales_mins, vec, register_bodies, token_sums, token_values)

V16 = vec(I8, 16)
V4 = vec(I32, 4)
SDOT = "llvm.aarch64.neon.sdot.v4i32.v16i8"
# block bytes and where the quants start (after d, dmin, 12 scale bytes and Q5_K's 32 qh bytes)
K_BLOCK = {"q4_k": 144, "q5_k": 176, "q6_k": 210}


def neon_call(builder, name: str, ret, args):
    """Call the aarch64 intrinsic `name` (an explicit instruction: LLVM cannot rewrite it away)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [v.type for v in args]), name)
    return builder.call(fn, args)


def sdot(builder, acc, a, b):
    """acc (<4 x i32>) + the four 4-value dot products of a and b (<16 x i8>): `sdot v.4s`."""
    return neon_call(builder, SDOT, V4, [acc, a, b])


def c8(v: int):
    return ir.Constant(V16, [v] * 16)


def sli(builder, keep, v, n: int):
    """(v << n) | (keep's low n bits), bytewise: `sli v.16b, #n` (one op for a shift, mask, or)."""
    return neon_call(builder, "llvm.aarch64.neon.vsli.v16i8", V16, [keep, v, ir.Constant(I32, n)])


def sri(builder, keep, v, n: int):
    """(v >> n) | (keep's high n bits), bytewise: `sri v.16b, #n`."""
    return neon_call(builder, "llvm.aarch64.neon.vsri.v16i8", V16, [keep, v, ir.Constant(I32, n)])


def widen_quarters(builder, v16, signed: bool) -> list:
    """<16 x i8> as four <4 x i32> (bytes 4q..4q+3), by widening multiplies by one
    (`smull`/`umull` and their `2` forms: 6 ops). An IR sext/zext followed by the quarters'
    shuffles is folded by LLVM into an extension of each 4-byte quarter, which <4 x i8> being no
    legal type costs zip + ushll + shl + sshr each (bench/arm64's per-block pricing of the x4
    decode rows: 64 ops per Q6_K block)."""
    b = builder
    kind = "smull" if signed else "umull"
    v8, v8h, v4h = vec(I8, 8), vec(I16, 8), vec(I16, 4)
    half = lambda v, n, q: b.shuffle_vector(v, v, ir.Constant(vec(I32, n), list(range(n * q, n * q + n))))  # noqa: E731
    out = []
    for h in range(2):
        w16 = neon_call(b, f"llvm.aarch64.neon.{kind}.v8i16", v8h, [half(v16, 8, h), ir.Constant(v8, [1] * 8)])
        for q in range(2):
            out.append(neon_call(b, f"llvm.aarch64.neon.{kind}.v4i32", V4, [half(w16, 4, q), ir.Constant(v4h, [1] * 4)]))
    return out


def lane_splat(b, v, lane: int, n: int = 4):
    return b.shuffle_vector(v, v, ir.Constant(vec(I32, n), [lane] * n))


def fold(b, v8):
    """<8 x i32> -> <4 x i32>: lanes 0-3 plus lanes 4-7."""
    return b.add(b.shuffle_vector(v8, v8, ir.Constant(vec(I32, 4), [0, 1, 2, 3])),
                 b.shuffle_vector(v8, v8, ir.Constant(vec(I32, 4), [4, 5, 6, 7])))


class NeonBlock:
    """K block i of a row: `quants` 16 <16 x i8> (vector k = values 16k..16k+15), `scale(k)` the
    <4 x i32> splat of group k's integer scale, `by_sums` <16 x i16> against the activations'
    16 sums (Q4_K/Q5_K: min j in lanes 2j, 2j+1; Q6_K: -32·scale g in lane g), d and dmin."""

    def __init__(self, quants, scale, by_sums, d, dmin):
        self.quants, self.scale, self.by_sums, self.d, self.dmin = quants, scale, by_sums, d, dmin


def unpack(kind: str, row, i) -> NeonBlock:
    """Block i of a Q4_K / Q5_K / Q6_K row (the weights `row` of int8_dot's Row), prefetching
    ahead as the x86 rows do."""
    b = row.b
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    size = K_BLOCK[kind]
    p = b.mul(i, i64(size))
    prefetch(row, p, size)
    load16 = lambda off: row.load("row", b.add(p, i64(off)), V16, align=1)  # noqa: E731
    if kind == "q6_k":
        sptr = array_ptr(row.context, b, row.aty["row"], row.arg["row"], b.add(p, i64(192)), V16)
        s8 = b.load(sptr, align=1)
        s32 = b.sext(s8, vec(I32, 16))
        quants = []
        for h in range(2):
            for t in range(4):
                for hh in range(2):
                    ql = load16(64 * h + 32 * (t & 1) + 16 * hh)
                    low = b.and_(ql, c8(15)) if t < 2 else b.lshr(ql, c8(4))
                    qh = load16(128 + 32 * h + 16 * hh)
                    high = b.shl(b.and_(b.lshr(qh, c8(2 * t)) if t else qh, c8(3)), c8(4))
                    quants.append(b.or_(low, high))
        offset = b.mul(b.sext(s8, vec(I16, 16)), ir.Constant(vec(I16, 16), [-32] * 16))  # |.| <= 4096
        return NeonBlock(quants, lambda k: lane_splat(b, s32, k), offset, row.half(b.add(p, i64(208)), lane=3), None)
    words = [row.load("row", b.add(p, i64(k)), I32, align=1) for k in (4, 8, 12)]
    packed = q4_k_scales_mins(b, *words)  # 8 scales, 8 mins (6-bit, unsigned)
    s32 = b.zext(b.shuffle_vector(packed, packed, ir.Constant(vec(I32, 8), list(range(8)))), vec(I32, 8))
    mins = b.zext(b.shuffle_vector(packed, packed, ir.Constant(vec(I32, 16), [8 + k // 2 for k in range(16)])),
                  vec(I16, 16))
    q0 = 48 if kind == "q5_k" else 16
    qh = [load16(16 + 16 * hh) for hh in range(2)] if kind == "q5_k" else None
    quants = [None] * 16
    for c in range(4):
        for hh in range(2):
            v = load16(q0 + 32 * c + 16 * hh)
            for half, nib in enumerate((b.and_(v, c8(15)), b.lshr(v, c8(4)))):
                j = 2 * c + half  # the sub-block (run of 32): Q5_K's high bit is bit j of qh
                if qh is not None:
                    bit = b.and_(qh[hh], c8(1 << j))
                    bit = b.shl(bit, c8(4 - j)) if j < 4 else b.lshr(bit, c8(j - 4)) if j > 4 else bit
                    nib = b.or_(nib, bit)
                quants[2 * j + hh] = nib
    return NeonBlock(quants, lambda k: lane_splat(b, s32, k // 2), mins, row.half(p), row.half(b.add(p, i64(2))))


def k_block(kind: str, with_mins: bool):
    """Block body for int8_dot's `_row_codegen` (4-lane float accumulators): per token, 16 `sdot`
    and 8 (Q4_K/Q5_K: one scale per run of 32) or 16 (Q6_K) vector multiply-adds by the scales.
    `with_mins`: Q4_K/Q5_K's mins inside (the decode rows); the tiles leave them to the caller
    (one small float product for all blocks, kernels.py), as every tile does."""
    per32 = kind != "q6_k"

    def block(row, a, i, accs):
        b = row.b
        blk = unpack(kind, row, i)
        zero = ir.Constant(V4, [0] * 4)
        isums = [zero] * row.ntok
        q = blk.quants
        for j in range(8):
            sa = blk.scale(2 * j)
            sb = sa if per32 else blk.scale(2 * j + 1)
            for t in range(row.ntok):
                x0 = token_values(row, i, t, 2 * j, 16)
                x1 = token_values(row, i, t, 2 * j + 1, 16)
                if per32:
                    isums[t] = b.add(isums[t], b.mul(sdot(b, sdot(b, zero, q[2 * j], x0), q[2 * j + 1], x1), sa))
                else:
                    isums[t] = b.add(isums[t], b.mul(sdot(b, zero, q[2 * j], x0), sa))
                    isums[t] = b.add(isums[t], b.mul(sdot(b, zero, q[2 * j + 1], x1), sb))
        for t in range(row.ntok):
            xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
            isum = isums[t]
            if not per32 or with_mins:
                by = fold(b, pair_sums(b, token_sums(row, a, i, t), blk.by_sums))
                if not per32:
                    isum = b.add(isum, by)
                else:
                    accumulate(b, accs[t], by, b.fsub(ir.Constant(F32, 0.0), b.fmul(blk.dmin, xd)))
            accumulate(b, accs[t], isum, b.fmul(blk.d, xd))
    return block


def q8_0_block(row, a, i, accs):
    """Block body of the Q8_0 rows and tile (34 bytes: f16 scale, 32 int8): two `sdot` per token
    into a <4 x i32>, scaled by d·d_x into the token's accumulator (llama.cpp's
    `vmlaq_n_f32(sum, vcvtq_f32_s32(p), d·d_x)`). The activations are int8 (kernels.py gives
    int8 where this runs); int16 ones, the x86 layout, are narrowed here."""
    b = row.b
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    p = b.mul(i, i64(34))
    prefetch(row, p, 34)
    d = row.half(p)
    w = [row.load("row", b.add(p, i64(2 + 16 * h)), V16, align=1) for h in range(2)]
    wide = row.aty["xq"].dtype.bitwidth == 16
    zero = ir.Constant(V4, [0] * 4)
    for t in range(row.ntok):
        o = b.add(row.offset("xo", "xstride", t), b.mul(i, i64(32)))
        if wide:
            xs = [b.trunc(row.load("xq", b.add(o, i64(16 * h)), vec(I16, 16), align=2), V16) for h in range(2)]
        else:
            xs = [row.load("xq", b.add(o, i64(16 * h)), V16, align=1) for h in range(2)]
        s = sdot(b, sdot(b, zero, w[0], xs[0]), w[1], xs[1])
        xd = row.load("xd", b.add(row.offset("do", "dstride", t), i), F32)
        accumulate(b, accs[t], s, b.fmul(d, xd))


def row_block(kind: str):
    """The decode row's block body and accumulator width (int8_dot's q*_row_dot)."""
    return (q8_0_block if kind == "q8_0" else k_block(kind, with_mins=True)), 4


def tile_block(kind: str):
    """The multi-token tile's block body and accumulator width (int8_dot's q*_row_dot_tile)."""
    return (q8_0_block if kind == "q8_0" else k_block(kind, with_mins=False)), 4


# int8_dot's row and tile intrinsics take these on both arm64 int8 levels
register_bodies(("neon-dotprod", "neon-i8mm"), tile=lambda kind, level: tile_block(kind),
                row=lambda kind, level: row_block(kind))


# ----------------------------------------------------------------------------- i8mm (V1/V2)
# `smmla vd.4s, vn.16b, vm.16b` adds the 2x2 product of two 2x8 int8 matrices (vn's rows times
# vm's rows) to vd: [r0·t0, r0·t1, r1·t0, r1·t1]. Two weight rows against two tokens per
# instruction: 32 MACs, twice an `sdot`, and the four sums land in the four result lanes, so the
# tile needs no horizontal sum at all. Inputs are 8-byte halves of two rows (weights) and of two
# tokens (activations) zipped into one vector (`zip1`/`zip2 .2d`).
SMMLA = "llvm.aarch64.neon.smmla.v4i32.v16i8"


def smmla(builder, acc, a, b):
    """acc + a (2x8, row-major) · bᵀ (b 2x8): `smmla v.4s`."""
    return neon_call(builder, SMMLA, V4, [acc, a, b])


def zip64(b, u, v, high: int):
    """[u's 8 bytes `high`, v's 8 bytes `high`] as one <16 x i8> (zip1/zip2 on .2d lanes)."""
    o = 8 * high
    return b.shuffle_vector(u, v, ir.Constant(vec(I32, 16), [*range(o, o + 8), *range(16 + o, 24 + o)]))


_Q8_0_PAIR = ("row0", "row1", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "res")


def _q8_0_pair_codegen(context, builder, signature, args):
    """Two Q8_0 rows times TILE tokens (int8 activations): res[r * TILE + t]."""
    from engine.quant.int8_dot import TILE, half_at, store

    b = builder
    row = Row(context, b, signature, args, _Q8_0_PAIR, TILE)
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    vf = vec(F32, 4)
    pairs = TILE // 2
    accs = [cgutils.alloca_once_value(b, ir.Constant(vf, [0.0] * 4)) for _ in range(pairs)]
    with cgutils.for_range(b, row.arg["nb"]) as loop:
        i = b.sext(loop.index, I64) if loop.index.type.width < 64 else loop.index
        p = b.mul(i, i64(34))
        ws, ds = [], []
        for name in ("row0", "row1"):
            ptr = lambda off, name=name: array_ptr(context, b, row.aty[name], row.arg[name], b.add(p, i64(off)), V16)  # noqa: E731
            ws.append([b.load(ptr(2 + 16 * h), align=1) for h in range(2)])
            ds.append(half_at(context, b, row.aty[name], row.arg[name], p))
            pf = cgutils.get_or_insert_function(b.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]),
                                                "llvm.prefetch.p0")
            from engine.quant.int8_dot import prefetch_bytes
            b.call(pf, [array_ptr(context, b, row.aty[name], row.arg[name], b.add(p, i64(prefetch_bytes())), I8),
                        ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
        a_mats = [zip64(b, ws[0][h], ws[1][h], k) for h in range(2) for k in range(2)]
        d4 = ir.Constant(vf, ir.Undefined)
        for lane, d in enumerate((ds[0], ds[0], ds[1], ds[1])):
            d4 = b.insert_element(d4, d, ir.Constant(I32, lane))
        for q in range(pairs):
            xs, xds = [], []
            for t in (2 * q, 2 * q + 1):
                o = b.add(row.offset("xo", "xstride", t), b.mul(i, i64(32)))
                xs.append([row.load("xq", b.add(o, i64(16 * h)), V16, align=1) for h in range(2)])
                xds.append(row.load("xd", b.add(row.offset("do", "dstride", t), i), F32))
            s = ir.Constant(V4, [0] * 4)
            for h in range(2):
                for k in range(2):
                    s = smmla(b, s, a_mats[2 * h + k], zip64(b, xs[0][h], xs[1][h], k))
            x4 = ir.Constant(vf, ir.Undefined)
            for lane, xd in enumerate((xds[0], xds[1], xds[0], xds[1])):
                x4 = b.insert_element(x4, xd, ir.Constant(I32, lane))
            _accumulate_vec(b, accs[q], s, b.fmul(d4, x4))
    for q in range(pairs):
        acc = b.load(accs[q])
        for lane, (r, t) in enumerate(((0, 2 * q), (0, 2 * q + 1), (1, 2 * q), (1, 2 * q + 1))):
            store(context, b, row.aty["res"], row.arg["res"], r * TILE + t, b.extract_element(acc, ir.Constant(I32, lane)))
    return context.get_dummy_value()


def _accumulate_vec(b, acc_ptr, isum, scale4):
    """acc += float(isum) * scale4 (lane by lane)."""
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(scale4.type, [scale4.type] * 3), "llvm.fma.v4f32")
    b.store(b.call(fn, [b.sitofp(isum, scale4.type), scale4, b.load(acc_ptr)]), acc_ptr)


@intrinsic
def q8_0_row_pair_smmla(typingctx, row0, row1, nb, xq, xo, xstride, xd, do, dstride, res):
    """res[r * TILE + t] = Q8_0 row r (of row0, row1) times token t's int8 Q8_0 activations
    (values at xq[xo + t*xstride:], scales at xd[do + t*dstride:]), t < TILE: i8mm only."""
    if xq.dtype.bitwidth != 8:
        raise TypeError("the smmla tile takes int8 activations (traits.Int8Kernels.q8_0)")
    return types.void(row0, row1, nb, xq, xo, xstride, xd, do, dstride, res), _q8_0_pair_codegen


_K_PAIR = ("row", "row_b", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "xs", "so", "sstride", "res", "knobs")


def _reduce_add(b, v):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(v.type.element, [v.type]), "llvm.vector.reduce.add.v4i32")
    return b.call(fn, [v])


def _k_pair_codegen(kind: str):
    """Two K-format rows times WIDE_TILE tokens with `smmla`: res[r * WIDE_TILE + t]. Q4_K/Q5_K
    leave their mins to the caller (as every tile); Q6_K's -32 goes through the activation sums."""
    from engine.quant.int8_dot import WIDE_TILE, Args, store

    per32 = kind != "q6_k"

    def codegen(context, builder, signature, args):
        b = builder
        # two views of the arguments: "row" is row0 in the first, row1 in the second
        swapped = ("row_b", "row", *_K_PAIR[2:])
        views = [Row(context, b, signature, args, _K_PAIR, WIDE_TILE), Row(context, b, signature, args, swapped, WIDE_TILE)]
        a = Args(context, b, signature, args)
        v0 = views[0]
        vf = vec(F32, 4)
        pairs = WIDE_TILE // 2
        accs = [cgutils.alloca_once_value(b, ir.Constant(vf, [0.0] * 4)) for _ in range(pairs)]
        zero = ir.Constant(V4, [0] * 4)
        with cgutils.for_range(b, v0.arg["nb"]) as loop:
            i = b.sext(loop.index, I64) if loop.index.type.width < 64 else loop.index
            blks = [unpack(kind, v, i) for v in views]
            isums = [zero] * pairs
            step = 2 if per32 else 1  # groups per scale
            for k0 in range(0, 16, step):
                mats = [(zip64(b, blks[0].quants[k], blks[1].quants[k], 0), zip64(b, blks[0].quants[k], blks[1].quants[k], 1))
                        for k in range(k0, k0 + step)]
                sv = b.shuffle_vector(blks[0].scale(k0), blks[1].scale(k0), ir.Constant(vec(I32, 4), [0, 1, 4, 5]))
                for q in range(pairs):
                    s = zero
                    for k, (lo, hi) in zip(range(k0, k0 + step), mats):
                        xa = token_values(v0, i, 2 * q, k, 16)
                        xb = token_values(v0, i, 2 * q + 1, k, 16)
                        s = smmla(b, smmla(b, s, lo, zip64(b, xa, xb, 0)), hi, zip64(b, xa, xb, 1))
                    isums[q] = b.add(isums[q], b.mul(s, sv))
            for q in range(pairs):
                ts = (2 * q, 2 * q + 1)
                xds = [v0.load("xd", b.add(v0.offset("do", "dstride", t), i), F32) for t in ts]
                isum = isums[q]
                if not per32:
                    sums = [token_sums(v0, a, i, t) for t in ts]
                    offs = ir.Constant(V4, ir.Undefined)
                    for lane, (r, t) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
                        by = fold(b, pair_sums(b, sums[t], blks[r].by_sums))
                        offs = b.insert_element(offs, _reduce_add(b, by), ir.Constant(I32, lane))
                    isum = b.add(isum, offs)
                scale = ir.Constant(vf, ir.Undefined)
                for lane, (r, t) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
                    scale = b.insert_element(scale, b.fmul(blks[r].d, xds[t]), ir.Constant(I32, lane))
                _accumulate_vec(b, accs[q], isum, scale)
        for q in range(pairs):
            acc = b.load(accs[q])
            for lane, (r, t) in enumerate(((0, 2 * q), (0, 2 * q + 1), (1, 2 * q), (1, 2 * q + 1))):
                store(context, b, v0.aty["res"], v0.arg["res"], r * WIDE_TILE + t,
                       b.extract_element(acc, ir.Constant(I32, lane)))
        return context.get_dummy_value()
    return codegen


def _k_pair_intrinsic(kind: str):
    def typer(typingctx, row, row_b, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, knobs):
        sig = types.void(row, row_b, nb, xq, xo, xstride, xd, do, dstride, xs, so, sstride, res, knobs)
        return sig, _k_pair_codegen(kind)
    typer.__name__ = f"{kind}_row_pair_smmla"
    return intrinsic(typer)


# res[r * WIDE_TILE + t] = K row r (of row, row_b) times token t's Q8_K activations (the
# arguments of int8_dot's q4_k_row_dot_tile with a second row): i8mm only
q4_k_row_pair_smmla = _k_pair_intrinsic("q4_k")
q5_k_row_pair_smmla = _k_pair_intrinsic("q5_k")
q6_k_row_pair_smmla = _k_pair_intrinsic("q6_k")
