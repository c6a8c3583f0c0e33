import numpy as np

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
