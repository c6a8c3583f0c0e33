"""arm64's int8 kernels (engine/quant/arm/neon.py): `sdot` decode rows and multi-token tiles for
Q4_K, Q5_K, Q6_K and Q8_0 (Q4_K and Q6_K on weights repacked 4 rows interleaved, the x4 layout),
held to gguf.quants' decoding and the exact product of the rounded activations. They run where numba compiles for an arm64 CPU with dot products (under qemu:
``make test-arm64``, neoverse-n1/v1/v2; the CI subset runs them on neoverse-n1); the path
chooser's arm64 levels are checked everywhere.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from engine.quant.arm import tiles, x4
from engine.quant import int8_kernels, kernels as K
from engine.quant import choice, paths
from engine.quant.activations import round_activations
from tests.engine.test_quant_kernels import RTOL, _random_blocks

FORMATS = [T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0]
X4_FORMATS = (T.Q4_K, T.Q6_K)  # repacked 4 rows interleaved on every arm level
on_arm = pytest.mark.skipif(not paths.target().level.is_arm,
                            reason="arm64 with dot products (make test-arm64: neoverse-n1, -v1, -v2)")


def _exact(qtype, raw, rows, cols, x):
    """gguf.quants' weights times the activations as llama.cpp rounds them, in float64, and the
    tolerance scale sum |w x|."""
    W = gq.dequantize(raw.reshape(rows, -1), qtype).reshape(rows, cols).astype(np.float64)
    xr = round_activations(x, qtype).astype(np.float64)
    return xr @ W.T, np.abs(xr) @ np.abs(W).T


def test_arm_levels_from_the_cpu_name_and_features():
    level = lambda name, *f: paths.Target("aarch64", name, frozenset(f)).level  # noqa: E731
    assert level("generic") == "portable"
    assert level("neoverse-n1", "neon", "dotprod") == "neon-dotprod"
    assert level("neoverse-v1", "neon", "dotprod", "i8mm", "sve") == "neon-i8mm"
    # NUMBA_CPU_FEATURES="" means the named CPU's own features (how the image pins neoverse-n1)
    for name, want in (("neoverse-n1", "neon-dotprod"), ("neoverse-v1", "neon-i8mm"), ("neoverse-v2", "neon-i8mm")):
        assert paths.Target("aarch64", name, frozenset(paths.ARM_CPU_FEATURES[name])).level == want
    assert paths.Target("x86_64", "neoverse-n1", frozenset({"dotprod"})).level == "portable"


@pytest.mark.parametrize("rows", [1, 4, 7, 24])
@pytest.mark.parametrize("qtype", X4_FORMATS, ids=lambda t: t.name)
def test_x4_layout_holds_the_rows_weights(qtype, rows):
    # pure numpy, so it runs everywhere: the repacked bytes decode to exactly gguf.quants' weights
    # of the rows (arbitrary bytes; 1 and 7 rows: the zero-padded last group), in as many bytes
    # (Q6_K) or 16 more per 4 rows and block (Q4_K's 6-bit scales and mins as bytes)
    cols = 512
    raw = _random_blocks(qtype, rows, cols, rows)
    w4 = x4.repack_x4(qtype, raw)
    assert w4.shape == (-(-rows // 4), cols // 256 * x4.X4_BLOCK[x4._X4_KIND[qtype]])
    want = gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32)
    np.testing.assert_array_equal(x4.dequantize_x4(qtype, w4, rows), want)


@on_arm
def test_paths_name_the_arm_kernels_per_format():
    got = choice.kernel_paths(FORMATS)
    for qt in FORMATS:
        x4 = "x4" if qt in X4_FORMATS else ""
        # Q5_K and Q8_0 have `smmla` tiles on neon-i8mm: their prefill names the level; the x4
        # formats' tiles are `sdot` on every level
        level = "neon-dotprod" if x4 else paths.target().level
        assert got[qt.name] == {"decode": "neon-dotprod-int8" + x4, "prefill": f"{level}-int8{x4}"}, got
        assert K.has_int8_kernels(qt) and K.has_int8_prefill(qt)
    # a format without integer kernels on arm64 (all four legacy formats have `sdot` rows now)
    assert choice.kernel_paths([T.IQ3_XXS])["IQ3_XXS"] == {"decode": "float", "prefill": "dequantize+blas"}


@on_arm
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_decode_rows_are_the_exact_product(qtype):
    # arbitrary bytes: every nibble, 5/6-bit quant, int8 (-128 included) and scale value, so the
    # unpacking of each bit and the scale/min/offset bookkeeping are all exercised
    rows, cols = 23, 1024  # Q4_K, Q6_K: 5 groups of 4 rows and a partial one
    raw = _random_blocks(qtype, rows, cols, 11)
    x = np.random.default_rng(12).standard_normal(cols, dtype=np.float32)
    x[256:512] *= 1e-3  # an activation block of small magnitude
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    assert plan.int8
    # the x4 formats' plan holds the repacked matrix in place of the rows
    assert plan.x4 == (qtype in X4_FORMATS)
    assert plan.w.shape[0] == (6 if plan.x4 else rows)
    out = np.empty(rows, np.float32)
    plan(x, out)
    ref, scale = _exact(qtype, raw, rows, cols, x[None])
    err = np.abs(out - ref[0]) / scale[0]
    assert np.all(err <= RTOL), err.max()


@on_arm
@pytest.mark.parametrize("tokens,cols", [(2, 1024), (5, 512), (67, 256)])
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_tiles_are_the_exact_product(qtype, tokens, cols):
    rows = 19  # not a multiple of the row chunk; T not always a multiple of the tile
    raw = _random_blocks(qtype, rows, cols, 13)
    x = np.random.default_rng(tokens).standard_normal((tokens, cols), dtype=np.float32)
    y = K.MatvecPlan(qtype, raw, rows, cols).tokens(x)
    ref, scale = _exact(qtype, raw, rows, cols, x)
    assert y.shape == (tokens, rows)
    err = np.abs(y - ref) / scale
    assert np.all(err <= RTOL), err.max()


@on_arm
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_arm_kernels_are_sdot_code(qtype):
    """The decode row of each format multiplies with `sdot`, its tile with `sdot` or, on the i8mm
    level where the format has one (Q5_K, Q8_0), `smmla`; both prefetch the weights."""
    from tests.asm import asm_of

    rows, cols = 256, 256  # big enough for the parallel kernels, not their serial twins
    raw = _random_blocks(qtype, rows, cols, 3)
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    plan(np.ones(cols, np.float32), np.empty(rows, np.float32))
    plan.tokens(np.ones((3, cols), np.float32))
    i8mm = paths.target().level == "neon-i8mm"
    if plan.x4:  # the x4 tiles are `sdot` on both levels (arm/x4.py: they beat `smmla` ones)
        tile, tile_op = tiles.mm_k_x4, "sdot"
    elif i8mm:
        tile, tile_op = (tiles.mm_q8_0_smmla if qtype == T.Q8_0 else tiles.mm_k_smmla), "smmla"
    else:
        tile = {T.Q8_0: int8_kernels.mm_q8_0_q8, T.Q5_K: int8_kernels.mm_q5_k_q8k}.get(qtype, int8_kernels.mm_k_q8k)
        tile_op = "sdot"
    assert plan.k.tile is tile
    for kernel, want in ((plan.kernel, "sdot"), (tile, tile_op)):
        asm = "\n".join(asm_of(kernel))
        for op in (want, "prfm"):
            assert f"\t{op}\t" in asm or f" {op} " in asm, f"{kernel.__name__}: no {op}"
        assert "smull" not in asm or want in asm



@on_arm
def test_the_x4_decode_rows_spend_few_vector_ops_per_sdot():
    """Vector instructions per `sdot` in the x4 decode kernel's assembly (arm.tiles.mv_k_x4: the
    Q4_K and the Q6_K row, each inlined twice; their block loops are almost all of it, 64 `sdot`
    a block each). bench/arm64's per-block pricing (llvm-mca neoverse-n1) found the Q6_K row
    widening its 16 scales with zip/ushll/shl/sshr each (LLVM's fold of a shuffled sext) and
    merging each 6-bit quant with shl/and/orr: 4.90 per `sdot` in all. Widening by `smull`/`umull`
    (arm.neon.widen_quarters) and merging with `sli`/`sri` made it 3.84 (3.95 with the
    unpacking written per run, for the tiles); undoing either gives 4.3 or more."""
    import re

    from tests.asm import asm_of

    rows, cols = 256, 256
    plan = K.MatvecPlan(T.Q6_K, _random_blocks(T.Q6_K, rows, cols, 5), rows, cols)
    plan(np.ones(cols, np.float32), np.empty(rows, np.float32))
    assert plan.kernel is tiles.mv_k_x4
    asm = "\n".join(asm_of(plan.kernel))
    vector = re.findall(r"^\s*([a-z][a-z0-9.]*)\s+v\d+\.", asm, re.M)
    sdots = vector.count("sdot")
    assert sdots >= 4 * 64, f"{sdots} sdot: not the two rows inlined twice"
    assert vector.count("sli") >= 32 and vector.count("sri") >= 32, "the Q6_K row merges without sli/sri"
    ratio = len(vector) / sdots
    assert ratio <= 4.2, f"{len(vector)} vector instructions for {sdots} sdot: {ratio:.2f} per sdot"


@on_arm
def test_the_x4_sdot_tiles_take_8_tokens_and_spill_nothing():
    """The x4 prefill tile (arm.tiles.mm_k_x4, every arm level) runs 8 tokens per unpacked weight vector (4 for a
    last, partial step) and its block loops keep everything in registers: before the run
    barrier and the per-run loads (arm.x4._run_barrier, _Runs) LLVM spilled 90-126 vectors per
    8-token block loop and 32-53 per 4-token one, a store and a load each (bench/arm64's N1
    pricing). Each block loop with 256 `sdot` or more may move vectors to or from the stack 4
    times at most."""
    import re

    from tests.asm import asm_of

    rows, cols = 256, 256
    plan = K.MatvecPlan(T.Q4_K, _random_blocks(T.Q4_K, rows, cols, 5), rows, cols)
    plan.tokens(np.ones((9, cols), np.float32))
    assert plan.k.tile is tiles.mm_k_x4
    asm = "\n".join(asm_of(tiles.mm_k_x4))
    loops = [blk for blk in re.split(r"^\.LBB\w+:", asm, flags=re.M) if blk.count("\tsdot\t") >= 256]
    sdots = sorted(blk.count("\tsdot\t") for blk in loops)
    # Q4_K and Q6_K, 4 and 8 tokens: 64 sdot per token and block
    assert sdots == [256, 256, 512, 512], sdots
    # vector registers stored to or loaded from the stack (pointers reloaded into x registers
    # are a few scalar loads, not counted)
    spills = [len(re.findall(r"^\s*(?:ldr|str|ldp|stp|ldur|stur)\s+q\d+,.*\[sp\b", blk, re.M)) for blk in loops]
    assert max(spills) <= 4, f"vector stack accesses per block loop: {spills}"
