"""The smaller downloads' formats (engine/quant/lowbit.py, lowbit_kernels.py): decode bit-identical
to gguf.quants on arbitrary bytes, the numba decode rows bit-identical to it, the float decode
rows against the exact product, encoders that gguf decodes back within a bound, and the
activation rounding llama.cpp applies for each."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from engine.quant import formats as F
from engine.quant import kernels as K
from engine.quant import choice, paths
from engine.quant.activations import activation_format, round_activations

LOWBIT = [T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.IQ3_S, T.IQ3_XXS]
# byte offsets of f16 fields in each block
F16_FIELDS = {T.Q5_K: [0, 2], T.Q2_K: [80, 82], T.Q3_K: [108], T.IQ4_NL: [0], T.IQ4_XS: [0], T.IQ3_S: [0], T.IQ3_XXS: [0],
              T.Q4_0: [0], T.Q5_0: [0], T.Q4_1: [0, 2], T.Q5_1: [0, 2]}
# RMS(error) / RMS(values) of our encoders on N(0, 1) (measured 0.278, 0.153, 0.077, 0.079, 0.137, 0.198)
RMS_BOUND = {T.Q2_K: 0.30, T.Q3_K: 0.17, T.IQ4_NL: 0.085, T.IQ4_XS: 0.088, T.IQ3_S: 0.15, T.IQ3_XXS: 0.21}
ACTIVATIONS = {T.Q2_K: "q8_k", T.Q3_K: "q8_k", T.IQ4_NL: "q8_0", T.IQ4_XS: "q8_k", T.IQ3_S: "q8_k",
               T.IQ3_XXS: "q8_k"}
ids = pytest.mark.parametrize("qtype", LOWBIT, ids=lambda t: t.name)


def _random_blocks(qtype, rows, cols, seed):
    """Every bit pattern our encoder might not emit, with finite f16 scales of many magnitudes."""
    fmt = F.get_format(qtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, F.row_bytes(qtype, cols)), dtype=np.uint8)
    blocks = raw.reshape(-1, fmt.type_size)
    for o in F16_FIELDS[qtype]:
        s = rng.uniform(-1, 1, len(blocks)) * 2.0 ** rng.integers(-24, 5, len(blocks))
        blocks[:, o:o + 2] = s.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@ids
def test_registered_with_ggml_geometry(qtype):
    fmt = F.get_format(qtype)
    assert qtype in F.supported_types() and fmt.qtype == qtype
    assert (fmt.block_size, fmt.type_size) == gq.GGML_QUANT_SIZES[qtype]


@ids
def test_decode_bit_identical_to_gguf_on_random_bytes(qtype):
    raw = _random_blocks(qtype, 7, 1024, 1)
    ours = F.dequantize(raw, qtype, (7, 1024))
    ref = gq.dequantize(raw, qtype).reshape(7, 1024)
    np.testing.assert_array_equal(_bits(ours), _bits(ref))


@ids
def test_numba_decode_rows_bit_identical(qtype):
    raw = _random_blocks(qtype, 13, 512, 2)  # 13 rows: not a multiple of the thread count
    ref = gq.dequantize(raw, qtype).reshape(13, 512)
    out = np.full((13, 512), np.nan, np.float32)
    K.dequantize_rows_into(qtype, raw, out)
    np.testing.assert_array_equal(_bits(out), _bits(ref))


@ids
def test_encoder_round_trip_bound_and_gguf_decode(qtype):
    x = np.random.default_rng(3).standard_normal((48, 1024), dtype=np.float32)
    q = F.quantize(x, qtype)
    assert q.shape == (48, F.row_bytes(qtype, 1024))
    y = F.dequantize(q, qtype, x.shape)
    rel = np.sqrt(np.mean((x - y) ** 2)) / np.sqrt(np.mean(x ** 2))
    assert rel <= RMS_BOUND[qtype], rel
    np.testing.assert_array_equal(_bits(y), _bits(gq.dequantize(q, qtype).reshape(x.shape)))
    # zeros stay zeros, tiny and huge magnitudes keep the relative bound
    z = F.dequantize(F.quantize(np.zeros((2, 256), np.float32), qtype), qtype, (2, 256))
    np.testing.assert_array_equal(z, 0.0)
    for mag in (1e-3, 1e3):
        ym = F.dequantize(F.quantize(x[:8] * np.float32(mag), qtype), qtype, (8, 1024))
        rel = np.sqrt(np.mean((x[:8] * mag - ym) ** 2)) / (mag * np.sqrt(np.mean(x[:8] ** 2)))
        assert rel <= 1.2 * RMS_BOUND[qtype], (mag, rel)


@ids
def test_activations_rounded_as_llama_cpp(qtype):
    assert activation_format(qtype) == ACTIVATIONS[qtype]


@ids
@pytest.mark.parametrize("rows", [3, 300])  # the serial twin and the parallel kernel
def test_decode_rows_match_exact_product(qtype, rows):
    cols = 512
    raw = _random_blocks(qtype, rows, cols, 4)
    w = F.dequantize(raw, qtype, (rows, cols)).astype(np.float64)
    x = np.random.default_rng(5).standard_normal(cols, dtype=np.float32)
    xr = round_activations(x[None], qtype)[0].astype(np.float64)
    out = np.empty(rows, np.float32)
    K.matvec(qtype, raw, x, out)
    ref = w @ xr
    bound = 2e-5 * (np.abs(w) @ np.abs(xr)) + 1e-30
    assert np.all(np.abs(out - ref) <= bound), np.max(np.abs(out - ref) / bound)


# x86/lowbit.py's integer rows and tiles (Q5_K: the Q3_K_M / IQ4_XS mixes' other type; Q4_0,
# Q5_0, Q4_1, Q5_1: the legacy 32-value formats, Q5_0 most of the real Qwen2.5 file)
X86_INT8 = [T.Q2_K, T.Q3_K, T.IQ4_XS, T.IQ4_NL, T.IQ3_S, T.Q5_K, T.Q4_0, T.Q5_0, T.Q4_1, T.Q5_1]
Q8_1 = (T.Q4_1, T.Q5_1)


def _exact(w: np.ndarray, raw: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """The product llama.cpp computes, in float64: w @ the rounded activations, and for Q4_1 /
    Q5_1 each block's min times Q8_1's s, the activation block's sum rounded to f16 (d * sum q,
    d before its own rounding) instead of its exact sum."""
    xr = round_activations(x, qtype).astype(np.float64)
    out = xr @ w.T
    if qtype in Q8_1:
        blocks = raw.reshape(raw.shape[0], -1, F.get_format(qtype).type_size)
        m = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        xb = np.asarray(x, np.float32).reshape(x.shape[0], -1, 32)
        amax = np.abs(xb).max(axis=2)
        raw_d = (amax / np.float32(127)).astype(np.float32)
        inv = np.where(amax != 0, np.float32(127) / np.where(amax != 0, amax, 1), 0).astype(np.float32)
        q = np.rint(xb * inv[..., None])
        s = (raw_d * q.sum(axis=2).astype(np.float32)).astype(np.float16).astype(np.float64)
        out += (s - xr.reshape(x.shape[0], -1, 32).sum(axis=2)) @ m.T
    return out
x86_int8 = pytest.mark.skipif(not paths.target().level.is_x86_int8,
                              reason="the low-bit integer rows are x86 code (AVX2 and up)")


@pytest.mark.parametrize("qtype", LOWBIT + [T.Q4_0, T.Q5_0, T.Q4_1, T.Q5_1], ids=lambda t: t.name)
def test_path_chooser_names_the_paths(qtype):
    # integer decode rows on x86 (AVX2 instructions on every level) for the X86_INT8 formats;
    # IQ3_XXS decodes with float rows; prefill is dequantize + BLAS past SHORT_PREFILL
    if paths.target().level.is_arm:
        pytest.skip("arm64's paths (its own sdot rows for the low-bit formats): tests/engine/test_arm_lowbit.py")
    int8 = qtype in X86_INT8 and paths.target().level.is_x86_int8
    # IQ4_XS's, Q3_K's and Q5_K's tiles are the panel tiles on AVX-512 VNNI (x86/lowbit.py)
    vnni512 = paths.target().level == "avx512vnni" and qtype in (T.IQ4_XS, T.Q3_K, T.Q5_K)
    # long prompts: the panel tiles, or the tiles where Q4_K's take every length (Zen with
    # AVX-512), else BLAS
    zen512 = paths.target().level.is_avx512 and paths.target().cpu_name.startswith("znver")
    long = int8 and (vnni512 or zen512)
    tile = "avx512vnni-int8" if vnni512 else "avx2-int8"
    want = {"decode": "avx2-int8" if int8 else "float", "prefill": tile if long else "dequantize+blas"}
    assert choice.kernel_paths([qtype]) == {qtype.name: want}
    assert K.has_int8_kernels(qtype) == int8 and K.has_multi_token_kernel(qtype) == int8
    # a chat turn's suffix runs the integer tile (kernels.SHORT_PREFILL) on every x86 level
    assert K.int8_prefill_wins(qtype, 5) == int8 and K.int8_prefill_wins(qtype, K.SHORT_PREFILL + 1) == long


@x86_int8
@pytest.mark.parametrize("qtype", X86_INT8, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [3, 300])  # the serial twin and the parallel kernel
def test_integer_decode_rows_match_the_exact_product(qtype, rows):
    # arbitrary bytes (every nibble, scale, grid index and sign pattern) through the integer
    # rows, against gguf.quants' decode times the activations rounded as llama.cpp rounds them
    # (Q8_K; IQ4_NL Q8_0), in float64: the integer sums are exact, so only the f32 scaling and
    # the accumulation order differ
    cols = 1024
    raw = _random_blocks(qtype, rows, cols, 8)
    w = gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    assert plan.int8
    rng = np.random.default_rng(9)
    for _ in range(3):
        x = rng.standard_normal(cols, dtype=np.float32)
        x[256:512] *= 1e-3  # an activation block of small magnitude
        out = np.full(rows, np.nan, np.float32)
        plan(x, out)
        xr = round_activations(x[None], qtype)[0].astype(np.float64)
        ref = _exact(w, raw, qtype, x[None])[0]
        bound = 2e-6 * (np.abs(w) @ np.abs(xr)) + 1e-30
        assert np.all(np.abs(out - ref) <= bound), np.max(np.abs(out - ref) / bound)


@x86_int8
@pytest.mark.parametrize("qtype", X86_INT8, ids=lambda t: t.name)
# 67 x 4608: on AVX-512 VNNI two 64-row panels, the last of 3 rows (an odd row pairs with
# itself), and 18 blocks a row (two passes of lowbit_kernels._PANEL_K blocks)
@pytest.mark.parametrize("rows, cols", [(40, 1024), (67, 4608)], ids=["one-panel", "panels"])
def test_integer_tiles_match_the_exact_product(qtype, rows, cols):
    # the multi-token tiles (TILE tokens per unpacked block; 67 tokens: padding to the tile)
    raw = _random_blocks(qtype, rows, cols, 10)
    w = gq.dequantize(raw, qtype).reshape(rows, cols).astype(np.float64)
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    for t in (2, 5, 67):
        x = np.random.default_rng(t).standard_normal((t, cols), dtype=np.float32)
        x[:, :256] *= 1e-3
        got = plan.tokens(x)
        assert got.shape == (t, rows)
        xr = round_activations(x, qtype).astype(np.float64)
        ref = _exact(w, raw, qtype, x)
        bound = 2e-6 * (np.abs(xr) @ np.abs(w).T) + 1e-30
        assert np.all(np.abs(got - ref) <= bound), (t, np.max(np.abs(got - ref) / bound))


@x86_int8
def test_integer_rows_catch_a_flipped_weight_nibble():
    # the tolerance above is meaningful: one changed level in one IQ4_XS block shows
    raw = _random_blocks(T.IQ4_XS, 4, 512, 3)
    raw[2, 8 + 20] ^= 0x01  # block 0, sub-block 1, a low nibble
    x = np.random.default_rng(1).standard_normal(512, dtype=np.float32)
    w = gq.dequantize(_random_blocks(T.IQ4_XS, 4, 512, 3), T.IQ4_XS).reshape(4, 512).astype(np.float64)
    xr = round_activations(x[None], T.IQ4_XS)[0].astype(np.float64)
    out = np.empty(4, np.float32)
    K.matvec(T.IQ4_XS, raw, x, out)
    err = np.abs(out - w @ xr) / (np.abs(w) @ np.abs(xr))
    assert err[2] > 1e-4 and np.all(np.delete(err, 2) <= 2e-6), err


def test_iq4_level_table_matches_the_binary_search():
    """The IQ4 encoders' table lookup (lowbit._nearest_level) picks the level searchsorted over the
    midpoints picks, on every midpoint, the floats either side of it, far outside the levels,
    signed zeros and NaN: the factory's IQ4_XS / IQ4_NL bytes (pinned by the recorded fixtures'
    sha256) must not move."""
    from engine.quant import lowbit

    mid = lowbit._level_midpoints()
    big = np.float32(1e30)
    edges = np.concatenate([mid, np.nextafter(mid, -big), np.nextafter(mid, big), mid / 2, mid * 2,
                            [-big, big, np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    t = np.concatenate([edges, np.random.default_rng(3).standard_normal(200_000).astype(np.float32) * 80])
    np.testing.assert_array_equal(lowbit._nearest_level(t), np.searchsorted(mid, t).astype(np.uint8))
    grid = t[: len(t) // 32 * 32].reshape(-1, 32)  # the encoders pass 2-D blocks
    np.testing.assert_array_equal(lowbit._nearest_level(grid), np.searchsorted(mid, grid).astype(np.uint8))
