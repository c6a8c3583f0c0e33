"""arm64's integer kernels for the low-bit formats (engine/quant/arm/lowbit.py): `sdot` decode rows
and multi-token tiles for Q2_K, Q3_K, IQ4_XS, IQ4_NL, IQ3_S and the legacy Q4_0, Q5_0, Q4_1, Q5_1,
held to gguf.quants' decoding times the activations as llama.cpp rounds them (Q8_K; IQ4_NL, Q4_0,
Q5_0 Q8_0; Q4_1, Q5_1 Q8_1, whose per-block sum s is rounded to f16). They run where numba
compiles for an arm64 CPU with dot products (under qemu: ``make test-arm64``, neoverse-n1/v1/v2;
the CI subset runs IQ4_XS's row on neoverse-n1); the path table is checked everywhere.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from engine.quant import kernels as K
from engine.quant import choice, paths
from engine.quant.activations import round_activations
from tests.engine.test_quant_lowbit import _exact as _llama_product
from tests.engine.test_quant_lowbit import _random_blocks

FORMATS = [T.IQ4_XS, T.Q3_K, T.IQ4_NL, T.Q2_K, T.IQ3_S, T.Q4_0, T.Q5_0, T.Q4_1, T.Q5_1]
# the integer sums are exact; only the f32 scaling per block and the accumulation order differ
# (x86.lowbit's bound: test_quant_lowbit.py)
BOUND = 2e-6
on_arm = pytest.mark.skipif(not paths.target().level.is_arm,
                            reason="arm64 with dot products (make test-arm64: neoverse-n1, -v1, -v2)")


def _exact(qtype, raw, rows, cols, x):
    """gguf.quants' weights times the rounded activations in float64 (Q8_1's s as llama.cpp
    rounds it: test_quant_lowbit), and the scale sum |w x|."""
    W = gq.dequantize(raw.reshape(rows, -1), qtype).reshape(rows, cols).astype(np.float64)
    xr = round_activations(x, qtype).astype(np.float64)
    return _llama_product(W, raw, qtype, x), np.abs(xr) @ np.abs(W).T


def test_arm_lowbit_formats_are_their_own_and_every_low_bit_format():
    # the formats issue 20 lists and the legacy 32-value ones (issue 49), none of them also one of
    # arm/neon.py's
    from engine.quant.arm import lowbit as arm_lowbit

    assert set(arm_lowbit.MATVEC_INT8) == set(arm_lowbit.MULTI_TOKEN_INT8) == set(FORMATS)
    assert not set(arm_lowbit.MATVEC_INT8) & {T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0}


@on_arm
def test_paths_name_the_arm_lowbit_kernels():
    got = choice.kernel_paths(FORMATS)
    for qt in FORMATS:
        # `sdot` tiles on every arm level (no smmla tile for these formats yet)
        assert got[qt.name] == {"decode": "neon-dotprod-int8", "prefill": "neon-dotprod-int8"}, got
        assert K.has_int8_kernels(qt) and K.has_int8_prefill(qt)
    assert choice.kernel_paths([T.IQ3_XXS])["IQ3_XXS"] == {"decode": "float", "prefill": "dequantize+blas"}


@on_arm
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_decode_rows_are_the_exact_product(qtype):
    # arbitrary bytes: every nibble, 2/3-bit quant, high bit, grid index, sign and scale value
    rows, cols = 24, 1024
    raw = _random_blocks(qtype, rows, cols, 11)
    x = np.random.default_rng(12).standard_normal(cols, dtype=np.float32)
    x[256:512] *= 1e-3  # an activation block of small magnitude
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    assert plan.int8
    out = np.full(rows, np.nan, np.float32)
    plan(x, out)
    ref, scale = _exact(qtype, raw, rows, cols, x[None])
    err = np.abs(out - ref[0]) / scale[0]
    assert np.all(err <= BOUND), err.max()


@on_arm
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_tiles_are_the_exact_product(qtype):
    rows, cols = 19, 512  # not a multiple of the row chunk; T not always a multiple of the tile
    raw = _random_blocks(qtype, rows, cols, 13)
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    for tokens in (2, 5, 67):
        x = np.random.default_rng(tokens).standard_normal((tokens, cols), dtype=np.float32)
        x[:, :256] *= 1e-3
        y = plan.tokens(x)
        ref, scale = _exact(qtype, raw, rows, cols, x)
        assert y.shape == (tokens, rows)
        err = np.abs(y - ref) / scale
        assert np.all(err <= BOUND), (tokens, err.max())


@on_arm
def test_rows_catch_a_flipped_weight_bit():
    # the bound above is meaningful: one changed Q3_K high bit in one block shows
    rows, cols = 4, 512
    raw = _random_blocks(T.Q3_K, rows, cols, 3)
    raw.reshape(-1, 110)[:, 108:110] = np.array([1.0], np.float16).view(np.uint8)  # blocks of one magnitude
    x = np.random.default_rng(1).standard_normal(cols, dtype=np.float32)
    ref, scale = _exact(T.Q3_K, raw, rows, cols, x[None])
    raw[2, 5] ^= 0x10  # row 2, block 0, hmask byte 5: bit 4 (value 128 + 5)
    out = np.empty(rows, np.float32)
    K.matvec(T.Q3_K, raw, x, out)
    err = np.abs(out - ref[0]) / scale[0]
    assert err[2] > 1e-4 and np.all(np.delete(err, 2) <= BOUND), err


@on_arm
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_arm_lowbit_kernels_are_sdot_code(qtype):
    """The decode row and the tile of each format multiply with `sdot` and prefetch the weights;
    the IQ4 formats look their levels up with `tbl`."""
    from engine.quant.arm import lowbit as arm_lowbit
    from tests.asm import asm_of

    rows, cols = 256, 256  # big enough for the parallel kernels, not their serial twins
    raw = _random_blocks(qtype, rows, cols, 3)
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    plan(np.ones(cols, np.float32), np.empty(rows, np.float32))
    plan.tokens(np.ones((3, cols), np.float32))
    want = ("sdot", "prfm", "tbl") if qtype in (T.IQ4_XS, T.IQ4_NL) else ("sdot", "prfm")
    for kernel in (plan.kernel, arm_lowbit.MULTI_TOKEN_INT8[qtype]):
        asm = "\n".join(asm_of(kernel))
        for op in want:
            assert f"\t{op}\t" in asm or f" {op} " in asm, f"{kernel.__name__}: no {op}"
        assert "smull" not in asm or "sdot" in asm
