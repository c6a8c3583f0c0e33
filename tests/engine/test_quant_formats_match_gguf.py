"""engine.quant.formats: decode parity with gguf-py, quantizer round trips and bounds."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

from engine.quant import formats as F

ALL = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]
QUANT = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]
GGUF_CAN_QUANTIZE = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16, T.F16]
# byte offsets of f16 scale fields inside each block
F16_FIELDS = {
    T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
# RMS(error) / RMS(values) on N(0, 1) data, with margin (measured: 0.0053, 0.086, 0.078,
# 0.043, 0.038, 0.074, 0.037, 0.0177)
RMS_BOUND = {
    T.Q8_0: 0.007, T.Q4_0: 0.10, T.Q4_1: 0.09, T.Q5_0: 0.05, T.Q5_1: 0.045,
    T.Q4_K: 0.08, T.Q5_K: 0.042, T.Q6_K: 0.021,
    T.F16: 0.0005, T.BF16: 0.003, T.F32: 0.0,
}

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@st.composite
def raw_blocks(draw, qtype):
    fmt = F.get_format(qtype)
    n = draw(st.integers(1, 24))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, fmt.type_size), dtype=np.uint8)
    if qtype == T.F16:
        # finite halves only (exponent != 31), subnormals included
        h = raw.view(np.uint16)
        h &= np.uint16(0xFBFF)
    elif qtype == T.F32:
        u = raw.view(np.uint32)
        u &= np.uint32(0xBFFFFFFF)  # exponent never all-ones: finite
    elif qtype == T.BF16:
        h = raw.view(np.uint16)
        h &= np.uint16(0xBFFF)
    else:
        scale_exp = draw(st.sampled_from([-14.0, -8.0, -3.0, 0.0, 4.0]))
        for off in F16_FIELDS[qtype]:
            s = rng.uniform(-1, 1, n) * 2.0**scale_exp
            raw[:, off:off + 2] = s.astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_dequantize_blocks_bit_identical_to_gguf(qtype):
    @SETTINGS
    @given(raw_blocks(qtype))
    def check(raw):
        ours = F.get_format(qtype).dequantize_blocks(raw)
        ref = gq.dequantize(raw.reshape(-1), qtype).reshape(ours.shape)
        assert ours.dtype == np.float32 and ours.shape == (len(raw), F.get_format(qtype).block_size)
        np.testing.assert_array_equal(_bits(ours), _bits(ref))

    check()


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_dequantize_tensor_shape_and_bytes(qtype):
    fmt = F.get_format(qtype)
    shape = (2, 3, 2 * 256)
    raw = F.quantize(np.random.default_rng(1).standard_normal((6, 512), dtype=np.float32), qtype)
    out = F.dequantize(raw.reshape(-1), qtype, shape)
    assert out.shape == shape and out.dtype == np.float32
    ref = gq.dequantize(raw, qtype).reshape(shape)
    np.testing.assert_array_equal(_bits(out), _bits(ref))
    with pytest.raises(ValueError):
        F.dequantize(raw.reshape(-1)[:-1], qtype, shape)
    assert raw.shape == (6, F.row_bytes(qtype, 512)) == (6, 512 // fmt.block_size * fmt.type_size)


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
def test_quantize_round_trip_error_bound_and_gguf_decode(qtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((48, 1024), dtype=np.float32)
    q = F.quantize(x, qtype)
    assert q.dtype == np.uint8 and q.shape == (48, F.row_bytes(qtype, 1024))
    y = F.dequantize(q, qtype, x.shape)
    rel = np.sqrt(np.mean((x - y) ** 2)) / np.sqrt(np.mean(x**2))
    assert rel <= RMS_BOUND[qtype], rel
    # our decode of our encoding == gguf-py's decode of it, bit for bit
    np.testing.assert_array_equal(_bits(y), _bits(gq.dequantize(q, qtype).reshape(x.shape)))


@pytest.mark.parametrize("qtype", QUANT, ids=lambda t: t.name)
def test_quantize_scale_invariance_and_heavy_tails(qtype):
    # the bound is relative: it must hold for tiny and huge magnitudes and for outlier-heavy rows
    rng = np.random.default_rng(3)
    base = (rng.standard_normal((16, 512)) ** 3).astype(np.float32)
    for mag in (1e-4, 1.0, 1e3):
        x = base * np.float32(mag)
        y = F.dequantize(F.quantize(x, qtype), qtype, x.shape)
        rel = np.sqrt(np.mean((x - y) ** 2)) / np.sqrt(np.mean(x**2))
        assert rel <= 2.5 * RMS_BOUND[qtype], (mag, rel)


@pytest.mark.parametrize("qtype", QUANT, ids=lambda t: t.name)
def test_quantize_zeros_and_constant_blocks(qtype):
    bs = F.get_format(qtype).block_size
    x = np.zeros((3, 2 * 256), dtype=np.float32)
    x[1, :bs] = 0.75
    x[2] = -2.0
    y = F.dequantize(F.quantize(x, qtype), qtype, x.shape)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_equal(y[0], 0.0)
    np.testing.assert_allclose(y, x, atol=0.02 * 2.0)


@pytest.mark.parametrize("qtype", GGUF_CAN_QUANTIZE, ids=lambda t: t.name)
def test_quantize_matches_gguf_quantizer(qtype):
    @SETTINGS
    @given(st.integers(0, 2**32 - 1), st.sampled_from([1e-3, 1.0, 50.0]))
    def check(seed, mag):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal((4, 256)) * mag).astype(np.float32)
        x[0, :7] = 0.0
        ours = F.quantize(x, qtype)
        ref = np.asarray(gq.quantize(x, qtype)).view(np.uint8).reshape(ours.shape)
        np.testing.assert_array_equal(ours, ref)

    check()


def test_bf16_rounds_to_nearest_even_and_quiets_nan():
    vals = np.array([1.0, 1.00390625, 1.01171875, -3.3e38, np.inf, np.nan], dtype=np.float32)
    q = F.quantize(vals.reshape(-1, 1).repeat(1, axis=1).reshape(1, -1), T.BF16)
    ref = gq.quantize(vals, T.BF16).view(np.uint8).reshape(q.shape)
    np.testing.assert_array_equal(q, ref)
    # 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0)
    assert q.view(np.uint16)[0, 1] == 0x3F80


def test_k_quantizers_beat_naive_rounding():
    # the scale search must not be worse than its own starting point (plain min/max grid)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 512), dtype=np.float32)
    for qtype, attr in ((T.Q4_K, "OFFSETS"), (T.Q5_K, "OFFSETS"), (T.Q6_K, "SEARCH")):
        fmt = F.get_format(qtype)
        searched = np.mean((F.dequantize(F.quantize(x, qtype), qtype, x.shape) - x) ** 2)
        saved = getattr(fmt, attr)
        try:
            setattr(fmt, attr, np.zeros(0, np.float32))
            naive = np.mean((F.dequantize(F.quantize(x, qtype), qtype, x.shape) - x) ** 2)
        finally:
            setattr(fmt, attr, saved)
        assert searched < naive, (qtype.name, searched, naive)


def test_registry_and_errors():
    lowbit = [T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.IQ3_S, T.IQ3_XXS]  # tests/engine/test_quant_lowbit.py
    assert set(F.supported_types()) == set(ALL) | set(lowbit)
    for t in ALL + lowbit:
        fmt = F.get_format(t)
        assert fmt.qtype == t and F.get_format(int(t)) is fmt and F.get_format(t.name) is fmt
    with pytest.raises(F.UnsupportedWeightType) as e:
        F.get_format(T.IQ2_XXS)
    assert "IQ2_XXS" in str(e.value) and "Q6_K" in str(e.value) and "Q2_K" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(F.UnsupportedWeightType, match="supported"):
        F.get_format(9999)
    with pytest.raises(ValueError, match="multiple of 256"):
        F.row_bytes(T.Q4_K, 1000)
    assert F.row_bytes(T.Q4_K, 1024) == 4 * 144
    assert F.row_bytes(T.Q8_0, 64) == 68
    assert F.row_bytes(T.F32, 3) == 12
    with pytest.raises(ValueError):
        F.quantize(np.zeros(256, np.float32), T.Q8_0)


def test_k_scale_packing_round_trip():
    rng = np.random.default_rng(5)
    sc = rng.integers(0, 64, (100, 8), dtype=np.uint8)
    m = rng.integers(0, 64, (100, 8), dtype=np.uint8)
    s2, m2 = F.unpack_scale_min_k4(F.pack_scale_min_k4(sc, m))
    np.testing.assert_array_equal(s2, sc)
    np.testing.assert_array_equal(m2, m)
