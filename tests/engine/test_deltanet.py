import numpy as np
import pytest

from engine import deltanet


def _inputs(T, H=3, d=16, seed=0):
    rng = np.random.default_rng(seed)
    q = deltanet.l2_normalize(rng.standard_normal((T, H * d)).astype(np.float32), 1e-6, H, d)
    k = deltanet.l2_normalize(rng.standard_normal((T, H * d)).astype(np.float32), 1e-6, H, d)
    v = rng.standard_normal((T, H, d)).astype(np.float32)
    g = -rng.uniform(0, 2, (T, H)).astype(np.float32)
    b = rng.uniform(0, 1, (T, H)).astype(np.float32)
    S0 = rng.standard_normal((H, d, d)).astype(np.float32)
    return q, k, v, g, b, S0


def _stepped(q, k, v, g, b, S0):
    """Token by token: (outputs, the state after every token count 0..T)."""
    S = S0.copy()
    outs, states = [], [S0.copy()]
    for t in range(q.shape[0]):
        o, S = deltanet.gated_delta_step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], b[t:t + 1], S)
        outs.append(o[0])
        states.append(S.copy())
    return np.stack(outs), states


FORMS = {"chunked": deltanet.gated_delta_chunked, "recurrent": deltanet.gated_delta_recurrent,
         "prefill": deltanet.gated_delta_prefill}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("T", [1, 5, 64, 65, 150])
def test_multi_token_forms_equal_the_step_by_step_recurrence(T, form):
    q, k, v, g, b, S0 = _inputs(T)
    o_all, S_all, _ = FORMS[form](q, k, v, g, b, S0.copy())
    outs, states = _stepped(q, k, v, g, b, S0)
    assert np.abs(o_all - outs).max() < 1e-4
    assert np.abs(S_all - states[-1]).max() < 1e-4


@pytest.mark.parametrize("form", FORMS)
def test_states_captured_inside_one_pass_equal_the_stepped_states(form):
    # chunk boundaries (64, 128), inside chunks (1, 37, 100), the end (150), out of order
    T = 150
    q, k, v, g, b, S0 = _inputs(T, seed=3)
    capture = [100, 1, 64, 150, 37, 128]
    _, S_all, caps = FORMS[form](q, k, v, g, b, S0.copy(), capture=capture)
    _, states = _stepped(q, k, v, g, b, S0)
    assert len(caps) == len(capture)
    for r, S_r in zip(capture, caps):
        assert np.abs(S_r - states[r]).max() < 1e-4, r
        assert np.abs(S_r - states[r - 1]).max() > 1e-3, r  # one token off would be caught
    caps[-1][:] = 0  # independent copies: the returned state is untouched
    assert np.abs(S_all - states[-1]).max() < 1e-4


def test_prefill_picks_the_recurrence_for_short_inputs_and_chunks_for_long(monkeypatch):
    calls = []
    for name in ("gated_delta_recurrent", "gated_delta_chunked"):
        real = getattr(deltanet, name)
        monkeypatch.setattr(deltanet, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    for T in (2, deltanet.RECURRENT_MAX, deltanet.RECURRENT_MAX + 1):
        deltanet.gated_delta_prefill(*_inputs(T))
    assert calls == ["gated_delta_recurrent", "gated_delta_recurrent", "gated_delta_chunked"]


@pytest.mark.parametrize("form", FORMS)
def test_multi_token_forms_do_not_modify_the_input_state(form):
    q, k, v, g, b, S0 = _inputs(10)
    before = S0.copy()
    FORMS[form](q, k, v, g, b, S0)
    assert np.array_equal(S0, before)


def test_causal_conv_carries_the_tail_across_calls():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 5)).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    tail0 = np.zeros((3, 5), dtype=np.float32)
    y_all, tail_all, (t4, t9) = deltanet.causal_conv1d_silu(x, tail0, w, capture=[4, 9])
    y1, t1, _ = deltanet.causal_conv1d_silu(x[:4], tail0, w)
    y2, t2, _ = deltanet.causal_conv1d_silu(x[4:], t1, w)
    assert np.allclose(np.concatenate([y1, y2]), y_all, atol=1e-6)
    assert np.array_equal(t2, tail_all)
    assert np.array_equal(t4, t1) and np.array_equal(t9, tail_all)  # tails captured in one call
    # position 0 sees only itself (zero history) times the last kernel tap, then SiLU
    z = x[0] * w[:, 3]
    assert np.allclose(y_all[0], z / (1 + np.exp(-z)), atol=1e-6)
    # every position against the definition: conv over [tail; x], then SiLU
    xp = np.concatenate([tail0, x])
    ref = np.stack([(xp[t:t + 4] * w.T).sum(axis=0) for t in range(9)])
    assert np.allclose(y_all, ref / (1 + np.exp(-ref)), atol=1e-5)
    # a non-zero tail is read as the history of position 0
    tail1 = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    y, _, _ = deltanet.causal_conv1d_silu(x[:2], tail1, w)
    z = (np.concatenate([tail1, x[:2]])[1:5] * w.T).sum(axis=0)
    assert np.allclose(y[1], z / (1 + np.exp(-z)), atol=1e-5)


def test_causal_conv_tail_does_not_keep_the_input_alive():
    # the tail is what the state carries between calls: it must own its (K-1, C) bytes, not be
    # a view into the (T + K - 1, C) padded input (measured: 217 MB held by a 0.8B model's state)
    x = np.ones((512, 64), np.float32)
    _, tail, (at_9,) = deltanet.causal_conv1d_silu(x, np.zeros((3, 64), np.float32), np.ones((64, 4), np.float32), [9])
    assert tail.base is None and tail.nbytes == 3 * 64 * 4
    assert at_9.base is None and at_9.nbytes == 3 * 64 * 4


def test_l2_normalize_reads_heads_from_matrix_columns():
    rng = np.random.default_rng(4)
    conv = rng.standard_normal((7, 3 * 2 * 8)).astype(np.float32)  # q | k | v, 2 heads of 8
    ref = conv[:, 16:32].reshape(7, 2, 8)
    ref = 0.5 * ref / np.sqrt((ref.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)
    got = deltanet.l2_normalize(conv, 1e-6, 2, 8, col0=16, scale=0.5)
    assert got.shape == (7, 2, 8) and np.abs(got - ref).max() < 1e-6


def _layer_inputs(H, hk, d, K=4, seed=0):
    rng = np.random.default_rng(seed)
    C = 2 * hk * d + H * d
    return dict(
        qkv=rng.standard_normal((1, C)).astype(np.float32), z=rng.standard_normal((1, H * d)).astype(np.float32),
        beta=rng.standard_normal((1, H)).astype(np.float32), alpha=3 * rng.standard_normal((1, H)).astype(np.float32),
        tail=rng.standard_normal((K - 1, C)).astype(np.float32),
        conv_w=np.asfortranarray(rng.standard_normal((C, K)).astype(np.float32)),
        dt_bias=rng.standard_normal(H).astype(np.float32), a=-np.exp(rng.standard_normal(H)).astype(np.float32),
        norm_w=rng.standard_normal(d).astype(np.float32), S=(0.1 * rng.standard_normal((H, d, d))).astype(np.float32))


@pytest.mark.parametrize("H,hk,d", [(4, 2, 16), (16, 16, 128), (6, 3, 32)])
def test_decode_token_equals_the_layers_ops_one_by_one(H, hk, d):
    """The fused decode step (deltanet.decode_token) against what the model's multi-token path
    runs for one token: sigmoid, softplus, the conv + SiLU, the L2 norms, the key heads tiled to
    the value heads, the recurrence, the gated RMS norm; the tail and S advanced in place."""
    import math

    from engine import ops

    x, eps = _layer_inputs(H, hk, d), 1e-6
    kd = hk * d
    b = ops.sigmoid(x["beta"])
    g = ops.softplus(x["alpha"] + x["dt_bias"]) * x["a"]
    conv, tail, _ = deltanet.causal_conv1d_silu(x["qkv"], x["tail"], x["conv_w"])
    q = np.tile(deltanet.l2_normalize(conv, eps, hk, d, col0=0, scale=1.0 / math.sqrt(d)), (1, H // hk, 1))
    k = np.tile(deltanet.l2_normalize(conv, eps, hk, d, col0=kd), (1, H // hk, 1))
    o, S = deltanet.gated_delta_step(q, k, conv[:, 2 * kd:].reshape(1, H, d), g, b, x["S"].copy())
    want = (ops.rms_norm(o, x["norm_w"], eps) * ops.silu(x["z"].reshape(1, H, d))).reshape(-1)

    S_fused, tail_fused = x["S"].copy(), x["tail"].copy()
    got = deltanet.decode_token(x["qkv"], x["z"], x["beta"], x["alpha"], tail_fused, x["conv_w"], x["dt_bias"],
                                x["a"], x["norm_w"], eps, hk, S_fused)
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.abs(S_fused - S).max() <= 1e-5
    assert np.array_equal(tail_fused, tail)


def test_a_decode_step_leaves_a_frozen_states_arrays_alone(model_factory):
    """The fused step advances the state in place, so a state forked from a frozen snapshot must
    get arrays of its own: the snapshot's conv tail and S stay as they were, and the fork's
    next step equals the step of an independent copy."""
    from engine.generate import Engine

    m = Engine.load(str(model_factory("tiny", "Q8_0", 0))).model
    ids = np.arange(1, 9)
    snap = m.new_state()
    m.forward(ids, snap, logits="none")
    before = snap.copy()
    snap.freeze()
    fork, copy = snap.fork(), snap.copy()
    a = m.forward(np.array([9]), fork, logits="last")
    b = m.forward(np.array([9]), copy, logits="last")
    assert snap.max_abs_diff(before) == 0.0
    assert np.array_equal(a, b) and fork.max_abs_diff(copy) == 0.0
    assert fork.max_abs_diff(before) > 0.0
