"""x86's Q4_K and Q6_K kernels over the x4 layout (engine/quant/x86/x4.py: 4 rows interleaved, one
`vpmaddwd` lane per row) on the AVX2 level: decode rows and 8-token / 4-token tiles held to
gguf.quants' decoding times the activations as llama.cpp rounds them. They run where the level
is AVX2 (this suite on an AVX2-only CPU; `make test-avx2` everywhere on x86)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from engine.quant import choice, paths
from engine.quant import kernels as K
from engine.quant.x86 import x4 as X
from tests.engine.test_arm_neon import _exact
from tests.engine.test_quant_kernels import RTOL, _random_blocks

on_avx2 = pytest.mark.skipif(paths.target().level != "avx2",
                             reason="the AVX2 level (make test-avx2 pins it on any x86_64)")


FORMATS = [T.Q4_K, T.Q6_K, T.Q8_0]
fmt = pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)


@on_avx2
@fmt
def test_the_k_formats_run_the_x4_kernels_at_every_length(qtype):
    assert choice.kernel_paths([qtype])[qtype.name] == {"decode": "avx2-int8x4", "prefill": "avx2-int8x4"}
    assert K.int8_prefill_wins(qtype, 4096) and K.int8_prefill_wins(qtype, 2)


@on_avx2
@fmt
@pytest.mark.parametrize("rows", [23, 256])  # a partial last group; the parallel kernel, not its serial twin
def test_decode_rows_are_the_exact_product(qtype, rows):
    # arbitrary bytes: every nibble / 6-bit quant, scale and min, and f16 d / dmin of either sign
    cols = 1024
    raw = _random_blocks(qtype, rows, cols, 11)
    x = np.random.default_rng(12).standard_normal(cols, dtype=np.float32)
    x[256:512] *= 1e-3  # an activation block of small magnitude
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    assert plan.x4 and plan.w.shape[0] == -(-rows // 4)  # the plan holds the repacked matrix only
    out = np.empty(rows, np.float32)
    plan(x, out)
    ref, scale = _exact(qtype, raw, rows, cols, x[None])
    err = np.abs(out - ref[0]) / scale[0]
    assert np.all(err <= RTOL), err.max()


@on_avx2
@fmt
@pytest.mark.parametrize("tokens,cols", [(2, 1024), (12, 512), (19, 256), (67, 256)])
def test_tiles_are_the_exact_product(qtype, tokens, cols):
    # 12 tokens: one 8-token pass and one of 4; 19: padded to 20 (8 + 8 + 4); rows not a
    # multiple of 4 nor of the chunk of groups
    rows = 19
    raw = _random_blocks(qtype, rows, cols, 13)
    x = np.random.default_rng(tokens).standard_normal((tokens, cols), dtype=np.float32)
    x[:, :256] *= 1e-3  # an activation block of small magnitude
    y = K.MatvecPlan(qtype, raw, rows, cols).tokens(x)
    ref, scale = _exact(qtype, raw, rows, cols, x)
    assert y.shape == (tokens, rows)
    err = np.abs(y - ref) / scale
    assert np.all(err <= RTOL), err.max()


@on_avx2
@pytest.mark.parametrize("qtype,byte,bit", [(T.Q4_K, 16 + 77, 0x10), (T.Q6_K, 128 + 50, 0x20), (T.Q8_0, 3 * 34 + 19, 0x80)],
                         ids=["Q4_K-high-nibble", "Q6_K-high-bits", "Q8_0-sign"])
def test_a_flipped_weight_bit_changes_only_its_row(qtype, byte, bit):
    rows, cols = 8, 256
    raw = _random_blocks(qtype, rows, cols, 5)
    x = np.random.default_rng(6).standard_normal((4, cols), dtype=np.float32)
    before = K.MatvecPlan(qtype, raw, rows, cols).tokens(x)
    bad = raw.copy()
    bad[5, byte] ^= bit  # row 5: a quant's high nibble (Q4_K qs), a top bit (Q6_K qh), a sign (Q8_0)
    after = K.MatvecPlan(qtype, bad, rows, cols).tokens(x)
    changed = np.any(before != after, axis=0)
    assert changed.tolist() == [r == 5 for r in range(rows)]


@on_avx2
@fmt
def test_x4_kernels_are_vector_integer_code(qtype):
    """The row and the tiles multiply with `vpmaddubsw` + `vpmaddwd`, broadcast the activations
    with `vpshufd`, join the two halves of a weight vector with `vinserti128` and prefetch."""
    from tests.asm import asm_of

    rows, cols = 256, 256
    plan = K.MatvecPlan(qtype, _random_blocks(qtype, rows, cols, 3), rows, cols)
    plan(np.ones(cols, np.float32), np.empty(rows, np.float32))
    plan.tokens(np.ones((12, cols), np.float32))
    kernels = (X.mv_q8_0_x4_avx2, X.mm_q8_0_x4_avx2) if qtype == T.Q8_0 else (X.mv_k_x4_avx2, X.mm_k_x4_avx2)
    for kernel in kernels:
        asm = "\n".join(asm_of(kernel))
        for op in ("vpmaddubsw", "vpmaddwd", "vpshufd", "vinserti128", "prefetcht0") + (("vpsignb",) if qtype == T.Q8_0 else ()):
            assert f"\t{op}\t" in asm, f"{kernel.__name__}: no {op}"


@on_avx2
@fmt
def test_x4_decode_prefetches_its_distance_ahead(qtype):
    """The decode row asks for the weights PREFETCH_X4_DECODE bytes past each block (4 rows' worth
    of blocks: 512, the row kernels' distance on AMD, left Q6_K and Q8_0 ~15 % slower from DRAM)."""
    import re

    from engine.quant.arm import x4
    from engine.quant.int8_dot import PREFETCH_X4_DECODE
    from tests.asm import asm_of

    rows, cols = 256, 256
    plan = K.MatvecPlan(qtype, _random_blocks(qtype, rows, cols, 3), rows, cols)
    plan(np.ones(cols, np.float32), np.empty(rows, np.float32))
    asm = "\n".join(asm_of(plan.kernel))
    ahead = [int(d) for d in re.findall(r"\tprefetcht0\t(\d+)\(", asm)]
    # (the K formats' row has both blocks, Q4_K's and Q6_K's)
    assert ahead and min(ahead) >= PREFETCH_X4_DECODE and max(ahead) < PREFETCH_X4_DECODE + max(x4.X4_BLOCK.values())


@pytest.mark.parametrize("rows", [1, 4, 7, 24])
def test_q8_0_x4_layout_holds_the_rows_weights(rows):
    # numpy and the repack loop only, so it runs everywhere: the repacked bytes (a partial last
    # group padded with zero rows) decode to exactly gguf.quants' weights
    from gguf import quants as gq

    from engine.quant.arm import x4

    cols = 96
    raw = _random_blocks(T.Q8_0, rows, cols, rows)
    w4 = x4.repack_x4(T.Q8_0, raw)
    assert w4.shape == (-(-rows // 4), cols // 32 * x4.X4_BLOCK["q8_0"])
    want = gq.dequantize(raw, T.Q8_0).reshape(rows, cols).astype(np.float32)
    np.testing.assert_array_equal(x4.dequantize_x4(T.Q8_0, w4, rows), want)
    if rows % 4:  # the padding rows' bytes of the last group's first vector are zeros
        assert not w4[-1, 8 + 4 * (rows % 4):8 + 16].any()
