import numpy as np
import pytest

from engine import deltanet


def _inputs(T, H=3, d=16, seed=0):
    rng = np.random.default_rng(seed)
    q = deltanet.l2_normalize(rng.standard_normal((T, H, d)).astype(np.float32), 1e-6)
    k = deltanet.l2_normalize(rng.standard_normal((T, H, d)).astype(np.float32), 1e-6)
    v = rng.standard_normal((T, H, d)).astype(np.float32)
    g = -rng.uniform(0, 2, (T, H)).astype(np.float32)
    b = rng.uniform(0, 1, (T, H)).astype(np.float32)
    S0 = rng.standard_normal((H, d, d)).astype(np.float32)
    return q, k, v, g, b, S0


@pytest.mark.parametrize("T", [1, 5, 64, 65, 150])
def test_chunked_form_equals_the_recurrence(T):
    q, k, v, g, b, S0 = _inputs(T)
    o_chunk, S_chunk = deltanet.gated_delta_chunked(q, k, v, g, b, S0.copy())
    S = S0.copy()
    outs = []
    for t in range(T):
        o, S = deltanet.gated_delta_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], b[t:t + 1], S)
        outs.append(o[0])
    assert np.abs(o_chunk - np.stack(outs)).max() < 1e-4
    assert np.abs(S_chunk - S).max() < 1e-4


def test_chunked_form_does_not_modify_the_input_state():
    q, k, v, g, b, S0 = _inputs(10)
    before = S0.copy()
    deltanet.gated_delta_chunked(q, k, v, g, b, S0)
    assert np.array_equal(S0, before)


def test_causal_conv_carries_the_tail_across_calls():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 5)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    tail0 = np.zeros((3, 5), dtype=np.float32)
    y_all, tail_all = deltanet.causal_conv1d(x, tail0, w)
    y1, t1 = deltanet.causal_conv1d(x[:4], tail0, w)
    y2, t2 = deltanet.causal_conv1d(x[4:], t1, w)
    assert np.allclose(np.concatenate([y1, y2]), y_all, atol=1e-6)
    assert np.array_equal(t2, tail_all)
    # position 0 sees only itself (zero history) times the last kernel tap
    assert np.allclose(y_all[0], x[0] * w[:, 3], atol=1e-6)


def test_causal_conv_tail_does_not_keep_the_input_alive():
    # the tail is what the state carries between calls: it must own its (K-1, C) bytes, not be
    # a view into the (T + K - 1, C) padded input (measured: 217 MB held by a 0.8B model's state)
    x = np.ones((512, 64), np.float32)
    _, tail = deltanet.causal_conv1d(x, np.zeros((3, 64), np.float32), np.ones((64, 4), np.float32))
    assert tail.base is None and tail.nbytes == 3 * 64 * 4
