import numpy as np
import pytest

from engine import attention


def _naive(q, k, v, start, scale):
    T, H, d = q.shape
    Hkv = k.shape[0]
    out = np.zeros_like(q)
    for h in range(H):
        kv = h // (H // Hkv)
        s = (q[:, h] @ k[kv].T) * scale
        for t in range(T):
            s[t, start + t + 1:] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p @ v[kv]
    return out


def test_blockwise_attention_equals_dense_softmax(monkeypatch):
    rng = np.random.default_rng(0)
    T, H, Hkv, d, start = 37, 4, 2, 8, 11
    q = rng.standard_normal((T, H, d)).astype(np.float32)
    k = rng.standard_normal((Hkv, start + T, d)).astype(np.float32)
    v = rng.standard_normal((Hkv, start + T, d)).astype(np.float32)
    want = _naive(q, k, v, start, 0.3)
    # force many small query blocks: the bounded-memory path must give the same answer
    monkeypatch.setattr(attention, "SCORE_BLOCK_FLOATS", 2 * (start + T) * 3)
    got = attention.causal_attention(q, k, v, start, 0.3)
    assert np.abs(got - want).max() < 1e-5


def test_rope_rotates_pairs_and_keeps_the_unrotated_tail():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 16)).astype(np.float32)
    cos, sin = attention.rope_angles(np.array([0, 1, 5]), 8, 10000.0, [2, 1, 1, 0])
    y = attention.apply_rope(x, cos, sin)
    assert np.allclose(y[0], x[0])  # position 0: identity
    assert np.array_equal(y[..., 8:], x[..., 8:])  # dims past n_rot untouched
    # rotation preserves the norm of each (i, i + n_rot/2) pair
    a = x[..., :4] ** 2 + x[..., 4:8] ** 2
    b = y[..., :4] ** 2 + y[..., 4:8] ** 2
    assert np.allclose(a, b, atol=1e-5)
    # pair 1 at position 5 rotates by 5 * base^(-2/8)
    theta = 5 * 10000.0 ** (-2 / 8)
    assert np.isclose(cos[2, 1], np.cos(theta), atol=1e-6)


@pytest.mark.parametrize("H,Hkv,n", [(8, 2, 1), (8, 2, 255), (8, 2, 257), (4, 4, 700), (6, 1, 1030)])
def test_decode_attention_over_a_half_cache_equals_dense_softmax(H, Hkv, n):
    """One position over the float16 cache (the decode kernel: keys in KEY_CHUNK pieces merged,
    each K/V row read once for its query heads) = the dense softmax over the same rounded K/V;
    the cache's spare capacity past n is never read (NaN there would show)."""
    rng = np.random.default_rng(n)
    d, cap = 32, n + 9
    q = rng.standard_normal((1, H, d)).astype(np.float32)
    k = np.full((Hkv, cap, d), np.nan, np.float16)
    v = np.full((Hkv, cap, d), np.nan, np.float16)
    k[:, :n] = 2 * rng.standard_normal((Hkv, n, d))
    v[:, :n] = rng.standard_normal((Hkv, n, d))
    want = _naive(q, k[:, :n].astype(np.float32), v[:, :n].astype(np.float32), n - 1, 0.25)
    got = attention.decode_attention(q, k, v, n, 0.25)
    assert np.abs(got - want).max() < 2e-5
    assert np.abs(attention.causal_attention(q, k[:, :n], v[:, :n], n - 1, 0.25) - want).max() < 2e-5


def test_the_cache_holds_float16_and_a_decode_step_reads_it_whole(model_factory):
    """The model's attention cache is float16 (state.KV_DTYPE, llama.cpp's default cache type),
    and a decode step takes the kernel over it, once per attention layer, over every position:
    its logits equal the same step's with BLAS over the converted cache."""
    from engine.generate import Engine
    from engine.state import KV_DTYPE, AttentionState

    m = Engine.load(str(model_factory("tiny", "Q8_0", 0))).model
    st = m.new_state()
    m.forward(np.arange(1, 300) % 2000, st, logits="none")
    caches = [l for l in st.layers if isinstance(l, AttentionState)]
    assert caches and all(l.k.dtype == KV_DTYPE == np.float16 and l.v.dtype == KV_DTYPE for l in caches)
    calls = []
    original = attention.decode_attention
    try:
        attention.decode_attention = lambda *a: calls.append(a[3]) or original(*a)
        stepped = m.forward(np.array([7]), st.copy(), logits="last")
        attention.decode_attention = lambda q, k, v, n, s: attention.causal_attention(q, k[:, :n], v[:, :n], n - 1, s)
        with_blas = m.forward(np.array([7]), st.copy(), logits="last")
    finally:
        attention.decode_attention = original
    assert calls == [300] * len(caches)
    assert np.abs(stepped - with_blas).max() <= 1e-5 * np.abs(with_blas).max()
