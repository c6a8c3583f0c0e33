"""x86's Q4_K kernels over the x4 layout (engine/quant/x86/x4.py: 4 rows interleaved, one
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


@on_avx2
def test_q4_k_runs_the_x4_kernels_at_every_length():
    assert choice.kernel_paths([T.Q4_K])["Q4_K"] == {"decode": "avx2-int8x4", "prefill": "avx2-int8x4"}
    assert K.int8_prefill_wins(T.Q4_K, 4096) and K.int8_prefill_wins(T.Q4_K, 2)


@on_avx2
@pytest.mark.parametrize("rows", [23, 256])  # a partial last group; the parallel kernel, not its serial twin
def test_decode_rows_are_the_exact_product(rows):
    # arbitrary bytes: every nibble, 6-bit scale and min, and f16 d / dmin of either sign
    cols = 1024
    raw = _random_blocks(T.Q4_K, rows, cols, 11)
    x = np.random.default_rng(12).standard_normal(cols, dtype=np.float32)
    x[256:512] *= 1e-3  # an activation block of small magnitude
    plan = K.MatvecPlan(T.Q4_K, raw, rows, cols)
    assert plan.x4 and plan.w.shape[0] == -(-rows // 4)  # the plan holds the repacked matrix only
    out = np.empty(rows, np.float32)
    plan(x, out)
    ref, scale = _exact(T.Q4_K, raw, rows, cols, x[None])
    err = np.abs(out - ref[0]) / scale[0]
    assert np.all(err <= RTOL), err.max()


@on_avx2
@pytest.mark.parametrize("tokens,cols", [(2, 1024), (12, 512), (19, 256), (67, 256)])
def test_tiles_are_the_exact_product(tokens, cols):
    # 12 tokens: one 8-token pass and one of 4; 19: padded to 20 (8 + 8 + 4); rows not a
    # multiple of 4 nor of the chunk of groups
    rows = 19
    raw = _random_blocks(T.Q4_K, rows, cols, 13)
    x = np.random.default_rng(tokens).standard_normal((tokens, cols), dtype=np.float32)
    y = K.MatvecPlan(T.Q4_K, raw, rows, cols).tokens(x)
    ref, scale = _exact(T.Q4_K, raw, rows, cols, x)
    assert y.shape == (tokens, rows)
    err = np.abs(y - ref) / scale
    assert np.all(err <= RTOL), err.max()


@on_avx2
def test_a_flipped_weight_bit_changes_only_its_row():
    rows, cols = 8, 256
    raw = _random_blocks(T.Q4_K, rows, cols, 5)
    x = np.random.default_rng(6).standard_normal((4, cols), dtype=np.float32)
    before = K.MatvecPlan(T.Q4_K, raw, rows, cols).tokens(x)
    bad = raw.copy()
    bad[5, 16 + 77] ^= 0x10  # row 5, a high nibble of its quants
    after = K.MatvecPlan(T.Q4_K, bad, rows, cols).tokens(x)
    changed = np.any(before != after, axis=0)
    assert changed.tolist() == [r == 5 for r in range(rows)]


@on_avx2
def test_x4_kernels_are_vector_integer_code():
    """The row and the tiles multiply with `vpmaddubsw` + `vpmaddwd`, broadcast the activations
    with `vpshufd`, join the two halves of a weight vector with `vinserti128` and prefetch."""
    from tests.asm import asm_of

    rows, cols = 256, 256
    plan = K.MatvecPlan(T.Q4_K, _random_blocks(T.Q4_K, rows, cols, 3), rows, cols)
    plan(np.ones(cols, np.float32), np.empty(rows, np.float32))
    plan.tokens(np.ones((12, cols), np.float32))
    for kernel in (X.mv_q4_k_x4, X.mm_q4_k_x4):
        asm = "\n".join(asm_of(kernel))
        for op in ("vpmaddubsw", "vpmaddwd", "vpshufd", "vinserti128", "prefetcht0"):
            assert f"\t{op}\t" in asm, f"{kernel.__name__}: no {op}"
