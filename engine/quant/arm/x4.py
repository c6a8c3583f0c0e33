"""arm64's x4 layout of Q4_K and Q6_K (every arm level): four weight rows interleaved so one
`sdot` by element gives a run's sums for 4 rows in one i32 vector; `repack_x4` (made once when
kernels.MatvecPlan is built, replacing the row-major bytes), its exact decoder, and the row and
tile intrinsics arm/tiles.py drives. The NEON basics (`sdot`, `sli`/`sri`, lane helpers) are
arm/neon.py's.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.int8_dot import (F32, I8, I16, I32, I64, Row, array_ptr, prefetch, token_values,
                                   vec)
from engine.quant.arm.neon import V4, V16, c8, sdot, sli, sri, widen_quarters


# The x4 layout (Q4_K, Q6_K on every arm level; `repack_x4`, made once when MatvecPlan is built,
# replaces the row-major bytes it came from). Four weight rows' blocks i are one x4 block whose
# quant vectors hold 4 consecutive values of each row: bytes 4r..4r+3 of a vector are row r's
# bytes 16s + 4k .. 16s + 4k + 3 of the block's 16-byte segment s (vector 4s + k). Unpacked as
# the row layout is (the same masks and shifts per vector), a vector's lane r is row r's 4-value
# sum when `sdot` takes the activations by element (`sdot v.4s, v.16b, v.4b[k]`: the 4 values
# 16s' + 4k.. of the token broadcast to the four lanes). So one i32 vector holds a run's sums
# for 4 rows, and one vector `mla` by the 4 rows' scales (stored widened to a byte per row per
# run, in the order the lanes want) scales all four: a quarter of the row kernels' `mul`/`mla`
# (docs/arm64.md: they were 80 % of N1's gap to llama.cpp), no horizontal sums, and the result
# of a block is a <4 x float> of 4 rows, stored with one instruction. The scales' and mins'
# widening, the f16 conversion and the prefetches are per 4 rows as well.
#
#   Q4_K x4 block, 592 bytes (4 x 144 + 16: the 6-bit scales and mins stored as bytes):
#     d[4] f16, dmin[4] f16, scales[8 runs][4 rows] u8, mins[8][4] u8, 8 segments x 64 bytes
#   Q6_K x4 block, 840 bytes (4 x 210):
#     scales[16 groups][4 rows] i8, 12 segments x 64 bytes (ql 0-7, qh 8-11), d[4] f16
# Q6_K's -32 is subtracted from the unpacked quants in the tiles (-32..31 are valid int8) and
# taken through the activations' sums in the decode row; Q4_K's mins go against the
# activations' sums per 32 (decode: `smlal` by element into an i32 vector per 4 rows; tiles:
# one small float product, as every tile).
# Rows beyond the last multiple of 4 are zero rows (d = 0) whose results are dropped.
#   Q8_0 x4 block, 136 bytes (4 x 34; x86/x4.py only, arm64 keeps its row-pair kernels):
#     d[4] f16, 2 segments x 64 bytes (values 0-15, 16-31)
X4 = 4
X4_BLOCK = {"q4_k": 592, "q6_k": 840, "q8_0": 136}
_X4_KIND = {T.Q4_K: "q4_k", T.Q6_K: "q6_k", T.Q8_0: "q8_0"}


def release_pages(w) -> None:
    """Tell the kernel the process is done with the pages of `w` (MADV_DONTNEED) when `w` is a
    view of a read-only file mapping (np.memmap mode "r", how the GGUF is opened): the x4 copy
    replaces them, so a repacked model holds its weights once, not twice. A later read (an
    embedding lookup of the tied head) faults them back in from the file. Anything else —
    ordinary arrays, writable maps — is left alone (DONTNEED would zero anonymous memory)."""
    import ctypes
    import mmap
    import sys

    base = w
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    if base is None or getattr(base, "mode", None) != "r" or not sys.platform.startswith("linux"):
        return
    page = mmap.PAGESIZE
    start = -(-w.ctypes.data // page) * page          # whole pages inside w only
    end = (w.ctypes.data + w.nbytes) // page * page
    if end > start:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 4)  # MADV_DONTNEED


def repack_x4(qtype, w):
    """The (rows, row bytes) uint8 matrix `w` of Q4_K, Q6_K (or x86's Q8_0) as x4 blocks: (ceil(rows / 4),
    blocks per row * X4_BLOCK) uint8. Pure byte moves: the quants are the same bits, the
    scales the same values (Q4_K's 6-bit ones unpacked to bytes)."""
    kind = _X4_KIND[T(qtype)]
    rows, rb = w.shape
    size, xsize, q0, qo, nseg = _GEOMETRY[kind]
    out = np.empty((-(-rows // X4), rb // size * xsize), np.uint8)
    # a byte loop per group (numba): numpy's transposes over the small axes moved 0.13-1.25 GB/s
    # (1.1 s for a 151936 x 896 Q8_0 head; ~1.5 s of a 0.8B Q4_K_M model's first forward)
    _repack_rows(np.ascontiguousarray(w), out, _KIND_ID[kind], size, xsize, q0, qo, nseg)
    return out


# (row block bytes, x4 block bytes, where a row block's quants start, where the x4 block's do,
# segments of 16 quant bytes) per kind, for _repack_rows
_GEOMETRY = {"q4_k": (144, 592, 16, 80, 8), "q6_k": (210, 840, 0, 64, 12), "q8_0": (34, 136, 2, 8, 2)}
_KIND_ID = {"q4_k": 0, "q6_k": 1, "q8_0": 2}


@njit(parallel=True, cache=True)
def _repack_rows(w, out, kind, size, xsize, q0, qo, nseg):
    """repack_x4's byte moves, one group of 4 rows per iteration: the quants 16 bytes a segment
    (row r's bytes 16s + 4k.. to 64s + 16k + 4r..), then each kind's header. Rows past the
    matrix (the last group's padding) are zeros: d = 0."""
    rows = w.shape[0]
    nb = w.shape[1] // size
    for g in prange(out.shape[0]):
        dst = out[g]
        for r in range(X4):
            row = X4 * g + r
            pad = row >= rows
            src = w[min(row, rows - 1)]
            for i in range(nb):
                o, p = i * xsize, i * size
                for s in range(nseg):
                    for k in range(4):
                        q, a = o + qo + 64 * s + 16 * k + 4 * r, p + q0 + 16 * s + 4 * k
                        for e in range(4):
                            dst[q + e] = 0 if pad else src[a + e]
                if kind == 1:  # Q6_K: scales[16 groups][4 rows] i8, then d[4] f16 at the end
                    for j in range(16):
                        dst[o + 4 * j + r] = 0 if pad else src[p + 192 + j]
                    for b in range(2):
                        dst[o + 832 + 2 * r + b] = 0 if pad else src[p + 208 + b]
                    continue
                for b in range(2):  # d (Q4_K, Q8_0) and dmin (Q4_K)
                    dst[o + 2 * r + b] = 0 if pad else src[p + b]
                if kind == 0:
                    for b in range(2):
                        dst[o + 8 + 2 * r + b] = 0 if pad else src[p + 2 + b]
                    # the 6-bit scales and mins (get_scale_min_k4) as bytes, [8 runs][4 rows]
                    for j in range(8):
                        if pad:
                            sc, mn = 0, 0
                        elif j < 4:
                            sc, mn = src[p + 4 + j] & 63, src[p + 8 + j] & 63
                        else:
                            sc = (src[p + 8 + j] & 0xF) | ((src[p + j] >> 6) << 4)
                            mn = (src[p + 8 + j] >> 4) | ((src[p + 4 + j] >> 6) << 4)
                        dst[o + 16 + 4 * j + r] = sc
                        dst[o + 48 + 4 * j + r] = mn


def dequantize_x4(qtype, w4, rows: int):
    """The float32 (rows, cols) matrix an x4 array holds (numpy; what the tests check the layout
    and the kernels against, beside gguf.quants on the original bytes)."""
    kind = _X4_KIND[T(qtype)]
    groups = w4.shape[0]
    blk = w4.reshape(groups, -1, X4_BLOCK[kind])
    nb = blk.shape[1]
    f16 = lambda a: a.copy().view(np.float16).astype(np.float32)  # noqa: E731
    if kind == "q4_k":
        d, dmin = f16(blk[..., 0:8]), f16(blk[..., 8:16])            # (g, i, r)
        s = blk[..., 16:48].reshape(groups, nb, 8, X4).astype(np.float32)   # (g, i, run, r)
        m = blk[..., 48:80].reshape(groups, nb, 8, X4).astype(np.float32)
        v = blk[..., 80:].reshape(groups, nb, 8, 4, X4, 4)            # (g, i, s, k, r, e)
        c, hh = np.divmod(np.arange(8), 2)
        vals = np.empty((groups, nb, X4, 256), np.float32)
        for seg in range(8):
            for half, nib in enumerate((v[:, :, seg] & 15, v[:, :, seg] >> 4)):
                run = 2 * c[seg] + half
                o = 64 * c[seg] + 32 * half + 16 * hh[seg]
                q = nib.transpose(0, 1, 3, 2, 4).reshape(groups, nb, X4, 16).astype(np.float32)
                vals[..., o:o + 16] = (d * s[:, :, run])[..., None] * q - (dmin * m[:, :, run])[..., None]
    elif kind == "q8_0":
        d = f16(blk[..., 0:8])                                          # (g, i, r)
        v = blk[..., 8:136].view(np.int8).reshape(groups, nb, 2, 4, X4, 4)   # (g, i, s, k, r, e)
        q = v.transpose(0, 1, 4, 2, 3, 5).reshape(groups, nb, X4, 32).astype(np.float32)
        return (d[..., None] * q).transpose(0, 2, 1, 3).reshape(groups * X4, nb * 32)[:rows]
    else:
        d = f16(blk[..., 832:840])
        s = blk[..., 0:64].view(np.int8).reshape(groups, nb, 16, X4).astype(np.float32)
        v = blk[..., 64:832].reshape(groups, nb, 12, 4, X4, 4)
        vals = np.empty((groups, nb, X4, 256), np.float32)
        for h in range(2):
            for t in range(4):
                for hb in range(2):
                    grp = 8 * h + 2 * t + hb
                    ql = v[:, :, 4 * h + 2 * (t & 1) + hb]
                    qh = v[:, :, 8 + 2 * h + hb]
                    q = ((ql & 15) if t < 2 else (ql >> 4)) | (((qh >> (2 * t)) & 3) << 4)
                    q = q.transpose(0, 1, 3, 2, 4).reshape(groups, nb, X4, 16).astype(np.float32) - 32
                    vals[..., 16 * grp:16 * grp + 16] = (d * s[:, :, grp])[..., None] * q
    return vals.transpose(0, 2, 1, 3).reshape(groups * X4, nb * 256)[:rows]


def _dup32(b, v16, k: int):
    """The 4 bytes 4k..4k+3 of v16 in all four 32-bit lanes (the by-element `sdot` operand)."""
    v4 = b.bitcast(v16, V4)
    return b.bitcast(b.shuffle_vector(v4, v4, ir.Constant(vec(I32, 4), [k] * 4)), V16)


def _f16x4(row, index):
    """Four f16 at byte `index` of the weights as <4 x float> (`fcvtl`)."""
    b = row.b
    halves = b.bitcast(row.load("row", index, vec(I16, 4), align=1), ir.VectorType(ir.HalfType(), 4))
    return b.fpext(halves, vec(F32, 4))


class X4Block:
    """x4 block i: `runs` (a list, or a _Runs unpacking each when first used) = per scale (Q4_K:
    8 runs of 32 values; Q6_K: 16 groups of 16) its weight vectors as (vector, the token's 16-value activation vector offset in the block, lane),
    `scale(j)` the 4 rows' scale of run j as <4 x i32>, d4 (and Q4_K's dmin4, `mins16(j)` the
    rows' min of run j as <4 x i16>) per 4 rows."""

    def __init__(self, runs, scale, d4, dmin4=None, mins16=None):
        self.runs, self.scale, self.d4, self.dmin4, self.mins16 = runs, scale, d4, dmin4, mins16


class _Runs:
    """A block's runs, each loaded and unpacked when first asked for, so its loads sit with its
    `sdot`s. With the tiles' barrier between runs (_run_barrier) a Q4_K vector's high nibbles
    (the next run) load it again instead of keeping the raw vector live across 8 tokens' work:
    LLVM spilled those (a store and a load each) rather than load twice."""

    def __init__(self, n: int, make):
        self.n, self.make = n, make
        self.done: dict[int, list] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j: int):
        if j not in self.done:
            self.done[j] = self.make(j)
        return self.done[j]

    def __iter__(self):
        return (self[j] for j in range(self.n))


def x4_unpack(kind: str, row, i, q6_minus32: bool = True, lazy: bool = False) -> X4Block:
    """Block i of an x4 row unpacked to int8 runs. `q6_minus32=False`: Q6_K's quants as stored,
    0..63, for a caller that takes the -32 through the activations' sums. `lazy`: each run
    loaded and unpacked when first used (the tiles, with _run_barrier); else all at once, in
    the order that lets a decode row's scheduler merge each Q6_K low-bits vector's two uses."""
    b = row.b
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    size = X4_BLOCK[kind]
    p = b.mul(i, i64(size))
    prefetch(row, p, size)
    load16 = lambda off: row.load("row", b.add(p, i64(off)), V16, align=1)  # noqa: E731
    if kind == "q4_k":
        sc = [q for off in (16, 32) for q in widen_quarters(b, load16(off), signed=False)]
        mn16 = b.zext(row.load("row", b.add(p, i64(48)), vec(I8, 32), align=1), vec(I16, 32))
        mins16 = lambda j: b.shuffle_vector(mn16, mn16, ir.Constant(vec(I32, 4), list(range(4 * j, 4 * j + 4))))  # noqa: E731

        def q4_unit(j: int, hh: int, k: int):
            c, half = divmod(j, 2)
            v = load16(80 + 64 * (2 * c + hh) + 16 * k)
            return (b.and_(v, c8(15)) if half == 0 else b.lshr(v, c8(4)), 64 * c + 32 * half + 16 * hh, k)
        runs = _x4_runs(q4_unit, 8, 2, [(2 * c + half, hh, k) for c in range(4) for hh in range(2)
                                        for k in range(4) for half in range(2)], lazy)
        return X4Block(runs, lambda j: sc[j], _f16x4(row, p), _f16x4(row, b.add(p, i64(8))), mins16)
    sc = [q for off in (0, 16, 32, 48) for q in widen_quarters(b, load16(off), signed=True)]

    def q6_unit(g: int, _: int, k: int):
        h, t, hh = g // 8, (g % 8) // 2, g % 2
        qh = load16(64 + 64 * (8 + 2 * h + hh) + 16 * k)
        ql = load16(64 + 64 * (4 * h + 2 * (t & 1) + hh) + 16 * k)
        # qh's bits 2t, 2t+1 beside ql's nibble: `sli`/`sri` shift, mask and merge in one op
        # (3.25 ops a weight vector before, with shl/and/orr: per-block pricing)
        bits = qh if t % 2 == 0 else b.lshr(qh, c8(2))
        if t < 2:
            q = sli(b, ql, b.and_(bits, c8(3)), 4)        # ql & 15 | bits << 4
        else:
            q = sri(b, b.and_(bits, c8(0x30)), ql, 4)     # ql >> 4 | bits 4, 5
        return (b.sub(q, c8(32)) if q6_minus32 else q, 16 * g, k)
    runs = _x4_runs(q6_unit, 16, 1, [(8 * h + 2 * t + hh, 0, k) for h in range(2) for hh in range(2)
                                     for k in range(4) for t in range(4)], lazy)
    return X4Block(runs, lambda j: sc[j], _f16x4(row, b.add(p, i64(832))))


def _x4_runs(unit, n: int, halves: int, order, lazy: bool):
    """The n runs of `unit(run, half, k)` (a run: its halves x 4 vectors, in that order): a
    _Runs, or lists made in `order` (run, half, k)."""
    if lazy:
        return _Runs(n, lambda j: [unit(j, hh, k) for hh in range(halves) for k in range(4)])
    runs: list[list] = [[] for _ in range(n)]
    for j, hh, k in order:
        runs[j].append(unit(j, hh, k))
    return runs


def _x4_token_vectors(row, i, t: int):
    """Token t's activation vectors of block i, loaded on first use: off -> <16 x i8>."""
    cache: dict[int, object] = {}

    def get(off: int):
        if off not in cache:
            cache[off] = token_values(row, i, t, off // 16, 16)
        return cache[off]
    return get


def _fvec_splat(b, value):
    one = b.insert_element(ir.Constant(vec(F32, 4), ir.Undefined), value, ir.Constant(I32, 0))
    return b.shuffle_vector(one, one, ir.Constant(vec(I32, 4), [0] * 4))


def _fma4(b, acc, isum, scale4):
    fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(scale4.type, [scale4.type] * 3), "llvm.fma.v4f32")
    return b.call(fn, [b.sitofp(isum, scale4.type), scale4, acc])


_X4_ROW = ("row", "nb", "xq", "xd", "xs", "out", "o")
_X4_TILE = ("row", "nb", "xq", "xo", "xstride", "xd", "do", "dstride", "out", "oo", "ostride")


def _run_barrier(b, values: list) -> list:
    """values (<4 x i32> each) through an empty `asm volatile` with a memory clobber: the run's
    sums are done before it and the next run's loads come after it. Without it LLVM's scheduler
    starts several runs of a tile at once (their weight loads first) and spills: 90-126 vector
    stores and loads per block loop of the 8-token tiles, 32-53 of the 4-token ones; with it
    (and _Runs) 0-2. It emits no instruction."""
    n = len(values)
    ty = ir.FunctionType(ir.LiteralStructType([V4] * n), [V4] * n)
    constraint = ",".join(["=w"] * n + [str(k) for k in range(n)] + ["~{memory}"])
    res = b.call(ir.InlineAsm(ty, "", constraint, side_effect=True), values)
    return [b.extract_value(res, k) for k in range(n)]


def _x4_sdot_codegen(kind: str, ntok: int):
    """4 rows (one x4 row) times ntok tokens with by-element `sdot`: out[o + r] (decode, Q4_K's
    mins inside) or out[oo + t * ostride + r] (tiles; Q4_K: minus what is there, the mins'
    product)."""
    names = _X4_ROW if ntok == 1 else _X4_TILE

    def codegen(context, builder, signature, args):
        b = builder
        row = Row(context, b, signature, args, names, ntok)
        vf = vec(F32, 4)
        zero = ir.Constant(V4, [0] * 4)
        mins = kind == "q4_k" and ntok == 1
        # Q6_K decode: the quants stay 0..63 and each group's sum starts at -32 x the token's
        # sum of that group (its Q8_K sums per 16): one `dup` per 16 values instead of one `sub`
        # per weight vector (bench/arm64's per-block pricing: ours' N1 decode rows spent 3.0-4.1
        # cycles per sdot against llama.cpp's 2.6-2.9). Integer arithmetic: the same sums.
        q6_sums = kind == "q6_k" and ntok == 1
        if ntok == 1:
            accs = [cgutils.alloca_once_value(b, ir.Constant(vf, [0.0] * 4)) for _ in range(1 + mins)]
        else:
            # tiles add each block into the output itself (a load and a store per token and
            # block): 8 float sums fewer in registers for the 8-token tile, whose integer sums, a
            # run's weight vectors and the tokens' activations fill the other 32. Starting from
            # minus what is there is Q4_K's "minus the mins' product".
            accs = [array_ptr(context, b, row.aty["out"], row.arg["out"], row.offset("oo", "ostride", t), vf)
                    for t in range(ntok)]
            for ptr in accs:
                first = b.fsub(ir.Constant(vf, [0.0] * 4), b.load(ptr, align=4)) if kind == "q4_k" else ir.Constant(vf, [0.0] * 4)
                b.store(first, ptr, align=4)
        with cgutils.for_range(b, row.arg["nb"]) as loop:
            i = b.sext(loop.index, I64) if loop.index.type.width < 64 else loop.index
            blk = x4_unpack(kind, row, i, q6_minus32=not q6_sums, lazy=ntok > 1)
            xs = [_x4_token_vectors(row, i, t) for t in range(ntok)]
            isums = [zero] * ntok
            if q6_sums:
                s16 = row.load("xs", b.mul(i, ir.Constant(I64, 16)), vec(I16, 16), align=2)
                start = b.mul(b.sext(s16, vec(I32, 16)), ir.Constant(vec(I32, 16), [-32] * 16))
            for j, units in enumerate(blk.runs):
                sv = blk.scale(j)
                for t in range(ntok):
                    s = b.shuffle_vector(start, start, ir.Constant(vec(I32, 4), [j] * 4)) if q6_sums else zero
                    for w, off, k in units:
                        s = sdot(b, s, w, _dup32(b, xs[t](off), k))
                    isums[t] = b.add(isums[t], b.mul(s, sv))
                if ntok > 1:
                    isums = _run_barrier(b, isums)
            for t in range(ntok):
                xd = _fvec_splat(b, row.load("xd", b.add(row.offset("do", "dstride", t), i), F32))
                b.store(_fma4(b, b.load(accs[t], align=4), isums[t], b.fmul(blk.d4, xd)), accs[t], align=4)
            if mins:
                # the token's sums per 32 (adjacent sums per 16, |.| <= 4064) times the rows' mins:
                # i16 x i16 -> i32 multiply-accumulate by element (`smlal`)
                so = b.mul(i, ir.Constant(I64, 16))
                s16 = row.load("xs", so, vec(I16, 16), align=2)
                wide = vec(I32, 4)
                by32 = b.add(b.shuffle_vector(s16, s16, ir.Constant(vec(I32, 8), list(range(0, 16, 2)))),
                             b.shuffle_vector(s16, s16, ir.Constant(vec(I32, 8), list(range(1, 16, 2)))))
                msum = zero
                for j in range(8):
                    lane = b.shuffle_vector(by32, by32, ir.Constant(vec(I32, 4), [j] * 4))
                    msum = b.add(msum, b.mul(b.sext(blk.mins16(j), wide), b.sext(lane, wide)))
                xd = _fvec_splat(b, row.load("xd", i, F32))
                b.store(_fma4(b, b.load(accs[1]), msum, b.fmul(blk.dmin4, xd)), accs[1])
        if ntok == 1:
            res = b.load(accs[0])
            if mins:
                res = b.fsub(res, b.load(accs[1]))
            b.store(res, array_ptr(context, b, row.aty["out"], row.arg["out"], row.arg["o"], vf), align=4)
        return context.get_dummy_value()
    return codegen


def _x4_row_intrinsic(kind: str):
    def typer(typingctx, row, nb, xq, xd, xs, out, o):
        return types.void(row, nb, xq, xd, xs, out, o), _x4_sdot_codegen(kind, 1)
    typer.__name__ = f"{kind}_x4_dot"
    return intrinsic(typer)


def _x4_tile_intrinsic(kind: str, ntok: int):
    def typer(typingctx, row, nb, xq, xo, xstride, xd, do, dstride, out, oo, ostride):
        sig = types.void(row, nb, xq, xo, xstride, xd, do, dstride, out, oo, ostride)
        return sig, _x4_sdot_codegen(kind, ntok)
    typer.__name__ = f"{kind}_x4_tile{ntok}"
    return intrinsic(typer)


# out[o + r] = x4 row (rows r = 0..3 of a group) times one token's Q8_K activations (xq int8,
# xd block scales, xs int16 sums per 16): the decode rows of every arm level
q4_k_x4_dot = _x4_row_intrinsic("q4_k")
q6_k_x4_dot = _x4_row_intrinsic("q6_k")
# out[oo + t * ostride + r] (Q4_K: minus what is there, the mins' product) for t < 4 or 8 tokens
# (values at xq[xo + t * xstride:], block scales at xd[do + t * dstride:]), `sdot` by element on
# every arm level: 8 tokens per unpacked weight vector, 4 for a last step (tokens are padded to
# WIDE_TILE = 4). On V1/V2 this beat the `smmla` x4 tile it replaced (2 rows x 2 tokens per
# instruction, but a zip per weight vector pair and token pair): per-block N1-code pricing of
# prefill 512 on the image's V1 level, ours / ik_llama.cpp 1.152 -> 0.929 on V1, 1.054 -> 0.828
# on V2 (bench/results/arm64-20261207-220234.json).
X4_SDOT_TILE = 8
q4_k_x4_tile = _x4_tile_intrinsic("q4_k", 4)
q6_k_x4_tile = _x4_tile_intrinsic("q6_k", 4)
q4_k_x4_tile8 = _x4_tile_intrinsic("q4_k", X4_SDOT_TILE)
q6_k_x4_tile8 = _x4_tile_intrinsic("q6_k", X4_SDOT_TILE)


# The drivers' handling of the last, partial group of 4 rows, shared by arm64's and x86's x4 tiles
@njit(inline="always", cache=True)
def x4_tile_dst(out, tmp, rows, t0, g, n):
    """Where group g's tile results for tokens t0 .. t0 + n go: out itself (flat (Tp, rows), at
    t0 * rows + 4g, stride rows), or for the last, partial group tmp (4 rows x n tokens) loaded
    with what out holds (Q4_K: the mins' product, which its tiles subtract)."""
    if 4 * g + 4 <= rows:
        return out, t0 * rows + 4 * g, rows
    for t in range(n):
        for r in range(4):
            tmp[4 * t + r] = out[(t0 + t) * rows + 4 * g + r] if 4 * g + r < rows else 0.0
    return tmp, 0, 4


@njit(inline="always", cache=True)
def x4_tile_tail(out, tmp, rows, t0, g, n):
    """The partial group's rows from tmp back into out (x4_tile_dst's other half)."""
    if 4 * g + 4 > rows:
        for t in range(n):
            for r in range(rows - 4 * g):
                out[(t0 + t) * rows + 4 * g + r] = tmp[4 * t + r]
