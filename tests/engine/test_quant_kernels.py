"""engine.quant.kernels: numba kernels against the numpy reference decoder."""

import platform

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from engine.quant import formats as F
from engine.quant import kernels as K, traits
from engine.quant.activations import round_activations

ALL = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]
# matvec uses fastmath (reassociation, FMA) in float32: |out - ref| <= RTOL * sum_j |w_ij x_j|
RTOL = 2e-5


def _matrix(qtype, rows, cols, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    x[0] *= 1e-3  # a row of small magnitudes (small / subnormal-ish f16 scales)
    raw = F.quantize(x, qtype)
    return raw, F.dequantize(raw, qtype, (rows, cols))


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_dequantize_rows_into_bit_identical(qtype):
    rows, cols = 13, 512  # 13 rows: not divisible by the thread count
    raw, ref = _matrix(qtype, rows, cols, 0)
    out = np.full((rows, cols), np.nan, dtype=np.float32)
    K.dequantize_rows_into(qtype, raw, out)
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))
    # a 1-D byte view (as sliced from an mmap) works too
    out2 = np.empty_like(out)
    K.dequantize_rows_into(qtype, raw.reshape(-1), out2)
    np.testing.assert_array_equal(out2.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.Q4_1, T.F16], ids=lambda t: t.name)
def test_dequantize_rows_into_random_bytes(qtype):
    rows, cols = 5, 2 * 256
    raw = _random_blocks(qtype, rows, cols, 1)
    ref = F.dequantize(raw, qtype, (rows, cols))
    out = np.empty((rows, cols), np.float32)
    K.dequantize_rows_into(qtype, raw, out)
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))


def _random_blocks(qtype, rows, cols, seed):
    """Arbitrary bit patterns (not just what our quantizer emits) with finite f16 scales."""
    fmt = F.get_format(qtype)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, F.row_bytes(qtype, cols)), dtype=np.uint8)
    blocks = raw.reshape(-1, fmt.type_size)
    if qtype == T.F16:
        blocks.view(np.uint16)[:] &= np.uint16(0xFBFF)
        return raw
    offs = {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.Q4_1: [0, 2]}[qtype]
    for o in offs:
        s = rng.uniform(-1, 1, len(blocks)) * 2.0 ** rng.integers(-24, 5, len(blocks))
        blocks[:, o:o + 2] = s.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


@pytest.fixture
def int8_here(monkeypatch):
    """The integer kernels enabled on this machine whatever INT8_MACHINES says: their IR is
    generic LLVM, so `make test-arm64` compiles and checks it on every arm64 target too."""
    monkeypatch.setattr(traits, "INT8_MACHINES", traits.INT8_MACHINES | {platform.machine()})


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_int8_kernels_run_where_enabled(qtype):
    raw = _random_blocks(qtype, 2, 256, 5)
    from engine.quant import paths

    # x86_64, and arm64 with dot products (its own kernels, engine/quant/arm/neon.py)
    here = platform.machine() in traits.INT8_MACHINES or paths.target().level.is_arm
    assert K.MatvecPlan(qtype, raw, 2, 256).int8 == here


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_int8_kernels_on_random_bytes(qtype, int8_here):
    # every nibble, 6-bit quant, int8 (-128 included) and scale value, through the integer path:
    # the pair sums must never saturate and the scale/min/offset bookkeeping must be exact
    rows, cols = 24, 1024
    raw = _random_blocks(qtype, rows, cols, 5)
    W = F.dequantize(raw, qtype, (rows, cols)).astype(np.float64)
    x = np.random.default_rng(6).standard_normal(cols, dtype=np.float32)
    x[:256] *= 1e-3  # one activation block of small magnitude
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    assert plan.int8
    out = np.empty(rows, np.float32)
    plan(x, out)
    xr = round_activations(x, qtype).astype(np.float64)
    scale = np.abs(W) @ np.abs(xr)
    assert np.all(np.abs(out - W @ xr) <= RTOL * scale), np.max(np.abs(out - W @ xr) / scale)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 7, 33])
def test_matvec_close_to_reference(qtype, rows):
    cols = 768
    raw, W = _matrix(qtype, rows, cols, rows)
    x = np.random.default_rng(9).standard_normal(cols, dtype=np.float32)
    out = np.full(rows, np.nan, dtype=np.float32)
    K.matvec(qtype, raw, x, out)
    W64 = W.astype(np.float64)
    xr = round_activations(x, qtype).astype(np.float64)  # what llama.cpp multiplies by
    ref = W64 @ xr
    if qtype in (T.Q4_1, T.Q5_1) and K.has_int8_kernels(qtype):
        # the integer rows add each block's min times Q8_1's f16-rounded sum, as llama.cpp does
        from tests.engine.test_quant_lowbit import _exact
        ref = _exact(W64, raw, qtype, x[None])[0]
    scale = np.abs(W64) @ np.abs(xr)
    assert np.all(np.abs(out - ref) <= RTOL * scale + 1e-30), np.max(np.abs(out - ref) / scale)


def test_matvec_detects_a_wrong_row():
    # guard that the tolerance above is meaningful: one flipped weight byte must be caught
    raw, W = _matrix(T.Q4_K, 4, 512, 3)
    x = np.random.default_rng(2).standard_normal(512, dtype=np.float32)
    bad = raw.copy()
    bad[2, 200] ^= 0x0F
    out = np.empty(4, np.float32)
    K.matvec(T.Q4_K, bad, x, out)
    xr = round_activations(x, T.Q4_K).astype(np.float64)
    ref = W.astype(np.float64) @ xr
    scale = np.abs(W.astype(np.float64)) @ np.abs(xr)
    assert np.abs(out[2] - ref[2]) > RTOL * scale[2]


def test_argument_checks():
    raw, _ = _matrix(T.Q8_0, 4, 64, 0)
    with pytest.raises(ValueError):
        K.matvec(T.Q8_0, raw, np.zeros(64, np.float64), np.zeros(4, np.float32))
    with pytest.raises(ValueError):
        K.matvec(T.Q8_0, raw, np.zeros(64, np.float32), np.zeros(5, np.float32))
    with pytest.raises(ValueError):
        K.dequantize_rows_into(T.Q8_0, raw, np.zeros((4, 96), np.float32))
    with pytest.raises(F.UnsupportedWeightType):
        K.matvec(T.IQ2_XXS, raw, np.zeros(64, np.float32), np.zeros(4, np.float32))  # not supported (docs/formats.md)


def test_bench_matvec_reports_positive_rate():
    assert K.bench_matvec(T.Q4_K, 64, 512, reps=2) > 0


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
# (5, 4608): 18 blocks a row, two passes of the AVX-512 VNNI panel tiles' 16-block chunks (Intel)
@pytest.mark.parametrize("tokens,cols", [(2, 1024), (5, 1024), (8, 1024), (67, 256), (5, 4608)])
def test_multi_token_int8_kernel(qtype, tokens, cols, int8_here):
    # several tokens per weight block (TILE / WIDE_TILE = 4, padding when T is not a multiple,
    # rows not a multiple of the kernel's row chunk): the exact product of the rounded
    # activations and the weights, to float32 accumulation
    rows = 19
    raw = _random_blocks(qtype, rows, cols, 7)
    W = F.dequantize(raw, qtype, (rows, cols)).astype(np.float64)
    x = np.random.default_rng(tokens).standard_normal((tokens, cols), dtype=np.float32)
    plan = K.MatvecPlan(qtype, raw, rows, cols)
    y = plan.tokens(x)
    assert y.shape == (tokens, rows)
    xr = round_activations(x, qtype).astype(np.float64)
    scale = np.abs(xr) @ np.abs(W).T
    assert np.all(np.abs(y - xr @ W.T) <= RTOL * scale), np.max(np.abs(y - xr @ W.T) / scale)


def test_q8_k_tokens_are_quantize_q8_k_per_token_padded_with_zeros():
    from engine.quant.activations import quantize_q8_k, quantize_q8_k_tokens

    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    x[1, :256] = 0.0
    a = quantize_q8_k_tokens(x, 4)
    assert a.tokens == 5 and a.padded == 8
    q, d, sums = np.empty(x.size, np.int8), np.empty(x.size // 256, np.float32), np.empty(x.size // 16, np.int16)
    quantize_q8_k(x.reshape(-1), q, d, sums)
    np.testing.assert_array_equal(a.q[:x.size], q)
    np.testing.assert_array_equal(a.d[:d.size], d)
    np.testing.assert_array_equal(a.sums16[:sums.size], sums)
    assert not a.q[x.size:].any() and not a.d[d.size:].any() and not a.scaled_sums32[5:].any()
    sums32 = q.reshape(5, 16, 32).astype(np.int64).sum(-1)  # 16 runs of 32 per token
    np.testing.assert_allclose(a.scaled_sums32[:5], sums32 * np.repeat(d.reshape(5, 2), 8, axis=1), rtol=1e-6)
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q8_k_tokens(np.zeros((2, 100), np.float32), 4)


def test_multi_token_kernel_checks_its_activations(int8_here):
    from engine.quant.activations import quantize_q8_k_tokens

    raw = _random_blocks(T.Q4_K, 8, 512, 1)
    plan = K.MatvecPlan(T.Q4_K, raw, 8, 512)
    with pytest.raises(ValueError, match="this matrix takes 512 per token"):
        plan.tokens_q8k(quantize_q8_k_tokens(np.zeros((3, 256), np.float32), K.WIDE_TILE))
    with pytest.raises(ValueError, match="multiple of 4"):
        plan.tokens_q8k(quantize_q8_k_tokens(np.zeros((3, 512), np.float32), 3))


def test_multi_token_kernel_is_refused_where_there_is_none():
    raw = np.zeros((4, F.row_bytes(T.IQ3_XXS, 256)), np.uint8)   # IQ3_XXS has float rows only
    with pytest.raises(ValueError, match="no multi-token integer kernel"):
        K.MatvecPlan(T.IQ3_XXS, raw, 4, 256).tokens(np.zeros((2, 256), np.float32))


def test_q8_0_integer_activations_are_the_rounded_activations():
    # the Q8_0 integer kernel's activations (int values + block scales) times each other are
    # exactly what round_activations gives the float kernels (and llama.cpp's quantize_row_q8_0)
    from engine.quant.activations import quantize_q8_0

    rng = np.random.default_rng(4)
    x = (rng.standard_normal(1024) * 10.0 ** rng.integers(-6, 4, 1024)).astype(np.float32)
    x[:32] = 0.0
    q16 = np.empty(1024, np.int16)
    d = np.empty(32, np.float32)
    quantize_q8_0(x, q16, d)
    assert np.abs(q16).max() <= 127 and d[0] == 0.0
    got = (q16.reshape(32, 32) * d[:, None]).reshape(-1).astype(np.float32)
    np.testing.assert_array_equal(got, round_activations(x, T.Q8_0))  # equal values (0.0 == -0.0)


def test_fast_exp_accuracy():
    from numba import njit

    from engine.llvm_ops import fast_exp

    @njit
    def run(a, o):
        for i in range(a.size):
            o[i] = fast_exp(a[i])

    x = np.linspace(-87, 88, 200001).astype(np.float32)
    out = np.empty_like(x)
    run(x, out)
    ref = np.exp(x.astype(np.float64))
    assert np.max(np.abs(out - ref) / ref) < 1e-6
    big = np.array([-1e4, -100, 100, 1e4], np.float32)  # clamped: finite, no nan
    run(big, out[:4])
    assert np.all(np.isfinite(out[:4])) and out[0] < 1e-37 and out[3] > 1e38


def test_q8_0_activation_rounding_matches_numpy_float16():
    # llama.cpp's quantize_row_q8_0: d = amax/127 stored as f16 (round to nearest even; tiny
    # values give f16 subnormals), q = round(x * 127/amax); checked bit for bit against numpy
    rng = np.random.default_rng(0)
    for scale in (1e-6, 1e-3, 1.0, 1e3):
        x = (rng.standard_normal((16, 256)) * scale).astype(np.float32)
        x[0, :32] = 0.0
        b = x.reshape(-1, 32)
        amax = np.abs(b).max(1)
        d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        ref = (np.rint(b * inv[:, None]) * d[:, None]).reshape(x.shape)
        got = round_activations(x, T.Q8_0)
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def _q8_k_reference(block: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """ggml's quantize_row_q8_K for one 256-value block, as written there: the first value of
    largest magnitude sets the scale (-127 / it); values rounded to nearest even, capped at 127."""
    amax, mx = np.float32(0), np.float32(0)
    for v in block:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax == 0:
        return np.zeros(256, np.int32), np.float32(0)
    iscale = np.float32(-127.0) / mx
    return np.minimum(np.rint(block * iscale), 127).astype(np.int32), np.float32(1.0) / iscale


def test_q8_k_rounding_matches_ggml_including_ties():
    """The vectorised max/min scale must pick what ggml's ordered scan picks, ties included."""
    from engine.quant.activations import quantize_q8_k

    rng = np.random.default_rng(7)
    blocks = rng.standard_normal((6, 256)).astype(np.float32)
    blocks[1] = 0.0                                   # a zero block
    blocks[2, 10], blocks[2, 200] = -5.0, 5.0         # |min| == |max|, the negative first
    blocks[3, 10], blocks[3, 200] = 5.0, -5.0         # ... the positive first
    blocks[4, 50] = -9.0                              # the negative one is the largest
    blocks[5] = np.float32(0.25)                      # every value the same
    x = blocks.reshape(-1)
    q = np.empty(x.size, np.int8)
    d = np.empty(x.size // 256, np.float32)
    sums = np.empty(x.size // 16, np.int16)
    quantize_q8_k(x, q, d, sums)
    rounded = round_activations(blocks, T.Q4_K)
    for i, block in enumerate(blocks):
        ref_q, ref_d = _q8_k_reference(block)
        np.testing.assert_array_equal(q[i * 256:(i + 1) * 256], ref_q, err_msg=f"block {i}")
        assert d[i] == ref_d, (i, d[i], ref_d)
        np.testing.assert_array_equal(rounded[i], (ref_q * ref_d).astype(np.float32), err_msg=f"block {i}")
        np.testing.assert_array_equal(sums[i * 16:(i + 1) * 16], ref_q.reshape(16, 16).sum(axis=1))
