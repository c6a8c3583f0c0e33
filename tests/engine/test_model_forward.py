"""The Qwen3.5 forward: batched == token-by-token, state semantics, no single-token prefill."""
import hashlib
import platform

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from engine import deltanet, weights
from engine.gguf_file import GGUFFile
from engine.models.qwen35 import Qwen35
from engine.quant import kernels, traits
from engine.session import Session


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return Qwen35(GGUFFile(tiny_model_path))


def _ids(n, seed=0, vocab=2000):
    return np.random.default_rng(seed).integers(0, vocab, n)


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("T", [2, 17, 130])
def test_batched_equals_token_by_token(tiny, T):
    ids = _ids(T)
    batched = tiny.forward(ids, tiny.new_state(), logits="all")
    state = tiny.new_state()
    stepped = np.stack([tiny.forward(ids[i:i + 1], state, logits="last") for i in range(T)])
    assert batched.shape == (T, tiny.config.n_vocab)
    for t in range(T):
        assert cosine(batched[t], stepped[t]) >= 0.99999, t
    assert np.abs(batched - stepped).max() <= 1e-3 * np.abs(stepped).max()


def test_extend_equals_full_prefill_and_states_match(tiny):
    ids = _ids(90, seed=3)
    full_state = tiny.new_state()
    full = tiny.forward(ids, full_state)
    st = tiny.new_state()
    tiny.forward(ids[:50], st, logits="none")
    ext = tiny.forward(ids[50:], st)
    assert cosine(full, ext) >= 0.99999
    assert st.n_tokens == full_state.n_tokens == 90
    assert st.max_abs_diff(full_state, kv_ulps=1) < 1e-4


def test_state_copy_is_independent(tiny):
    st = tiny.new_state()
    tiny.forward(_ids(20), st)
    snap = st.copy()
    assert snap.max_abs_diff(st) == 0.0
    tiny.forward(_ids(3, seed=9), st)
    assert snap.n_tokens == 20 and st.n_tokens == 23
    assert snap.max_abs_diff(st) == float("inf")  # different lengths never compare equal
    # resuming from the copy gives the same logits as the original run did
    a = tiny.forward(_ids(3, seed=9), snap.copy())
    st2 = tiny.new_state()
    tiny.forward(_ids(20), st2)
    b = tiny.forward(_ids(3, seed=9), st2)
    assert np.allclose(a, b, atol=1e-5)


def test_multi_token_prefill_never_runs_the_single_token_path(tiny, monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("prefill ran the single-token DeltaNet step")

    monkeypatch.setattr(deltanet, "gated_delta_step", forbidden)
    session = Session(tiny, prefill_chunk=512)
    res = session.prefill([int(t) for t in _ids(40)])
    assert res.mode == "batched" and res.prefilled_tokens == 40
    # an extend of more than one token is batched too
    res = session.prefill(session.tokens + [5, 6, 7])
    assert res.mode == "extend" and res.prefilled_tokens == 3


def test_session_modes(tiny):
    s = Session(tiny, prefill_chunk=16)
    ids = [int(t) for t in _ids(40)]
    a = s.prefill(ids)
    assert (a.mode, a.reused_tokens, a.prefilled_tokens) == ("batched", 0, 40)
    b = s.prefill(ids)
    assert (b.mode, b.reused_tokens, b.prefilled_tokens) == ("cached", 40, 0)
    assert np.array_equal(a.logits, b.logits)
    c = s.prefill(ids + [1, 2])
    assert (c.mode, c.reused_tokens, c.prefilled_tokens) == ("extend", 40, 2)
    d = s.prefill(ids[:10] + [3])
    assert d.mode == "batched" and d.prefilled_tokens == 11
    # chunked prefill (chunk 16 over 40 tokens) equals one big batch
    big = tiny.forward(np.array(ids), tiny.new_state())
    assert cosine(a.logits, big) >= 0.99999


def test_out_of_range_token_is_named(tiny):
    with pytest.raises(ValueError, match="token id 999999 is outside the vocabulary"):
        tiny.forward(np.array([1, 999999]), tiny.new_state())


def test_activations_stay_sane(tiny):
    logits = tiny.forward(_ids(64), tiny.new_state(), logits="all")
    assert np.isfinite(logits).all()
    assert 0.05 < float(logits.std()) < 50


def test_factory_is_deterministic_and_seeded(tmp_path):
    from engine.synthetic.factory import make_model

    a = make_model(tmp_path / "a.gguf", "tiny", "Q8_0", 1)
    b = make_model(tmp_path / "b.gguf", "tiny", "Q8_0", 1)
    c = make_model(tmp_path / "c.gguf", "tiny", "Q8_0", 2)
    def digest(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)


@pytest.mark.parametrize("weights", ["F32", "Q4_K_M"])
def test_factory_bytes_do_not_depend_on_numpy_simd_path(tmp_path, weights):
    """numpy picks its SIMD kernels per CPU (AVX2, AVX-512, NEON): the factory's bytes must not
    depend on which, or the llama.cpp fixtures recorded on one machine fail on the next (they
    did: vectorised f32 exp/log gave ssm_dt.bias one ulp apart on AVX-512 and AVX2 hosts).
    The same model built with every dispatched SIMD target of this CPU disabled is identical."""
    import os
    import subprocess
    import sys

    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    from engine.synthetic.factory import make_model

    found = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]
    if not found:
        pytest.skip("numpy dispatches no SIMD target beyond its baseline on this CPU")
    here = make_model(tmp_path / "here.gguf", "tiny", weights, 0)
    out = tmp_path / "baseline.gguf"
    r = subprocess.run([sys.executable, "-m", "engine", "make-model", "--preset", "tiny", "--weights", weights,
                        "--seed", "0", "--out", str(out)],
                       env={**os.environ, "NPY_DISABLE_CPU_FEATURES": " ".join(found)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    def digest(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()
    assert digest(out) == digest(here), f"bytes differ with numpy's {found} kernels disabled"


def test_tied_and_untied_heads(model_factory):
    untied = Qwen35(GGUFFile(model_factory("tiny", "F32", head="untied")))
    tied = Qwen35(GGUFFile(model_factory("tiny", "F32", head="tied")))
    assert not untied.tied_output and tied.tied_output
    assert not GGUFFile(model_factory("tiny", "F32", head="tied")).has_tensor("output.weight")


@pytest.mark.skipif(platform.machine() not in traits.INT8_MACHINES, reason="the int8 kernels run on x86_64")
@pytest.mark.parametrize("weights_type,n_tokens", [("Q4_K_M", 5), ("Q4_K_M", 101), ("Q8_0", 64)])
def test_batched_prefill_runs_the_int8_kernels(model_factory, monkeypatch, weights_type, n_tokens):
    # a chat turn's suffix (<= SHORT_PREFILL tokens) of a Q4_K_M or Q8_0 model, and a Q4_K_M
    # prefill of any length where the 512-bit tiles compile, never decodes a whole matrix to
    # f32, and gives what dequantize + BLAS gives
    q4_k_m = (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K)
    if n_tokens > weights.SHORT_PREFILL and not all(kernels.has_int8_prefill(q) for q in q4_k_m):
        pytest.skip("longer prompts take dequantize + BLAS for Q4_K or Q6_K on this level")
    path = model_factory("tiny", weights_type)
    ids = _ids(n_tokens, seed=4)
    monkeypatch.setattr(kernels, "has_multi_token_kernel", lambda qtype: False)
    via_blas = Qwen35(GGUFFile(path)).forward(ids, Qwen35(GGUFFile(path)).new_state(), logits="all")
    monkeypatch.undo()
    model = Qwen35(GGUFFile(path))

    def forbidden(*a, **k):
        raise AssertionError("a batched prefill dequantized a quantized matrix")

    monkeypatch.setattr(kernels, "dequantize_rows_into", forbidden)
    via_int8 = model.forward(ids, model.new_state(), logits="all")
    # integer sums with llama.cpp's float accumulation vs BLAS's float sums of the same rounded
    # activations: last-bit differences, which a later layer's activation rounding can turn into
    # one int8 step; on this random-weight model that compounds (seeds 4-11, worst position:
    # 0.9989-1.0; the per-block-reduction kernels before: 0.9994-0.99997). The bar is the
    # engine's llama.cpp parity bar for quantized models; a wrong scale or a lost min term
    # gives cosines far below it.
    for t in range(len(ids)):
        assert cosine(via_int8[t], via_blas[t]) >= 0.999, t
    # and token by token (batched and stepped hidden states differ in the last bits too)
    state = model.new_state()
    for t in range(len(ids)):
        assert cosine(via_int8[t], model.forward(ids[t:t + 1], state, logits="last")) >= 0.999, t
    if not kernels.has_int8_prefill(GGMLQuantizationType.Q4_K if weights_type == "Q4_K_M" else GGMLQuantizationType.Q8_0):
        with pytest.raises(AssertionError, match="dequantized"):  # longer prompts take BLAS
            model.forward(_ids(weights.SHORT_PREFILL + 1, seed=4), model.new_state(), logits="last")


@pytest.mark.parametrize("n_tokens", [40, 200])  # the recurrence and the chunked DeltaNet
def test_forward_capturing_returns_the_prefix_states_of_one_pass(model_factory, n_tokens):
    model = Qwen35(GGUFFile(model_factory("tiny", "F32")))
    ids = _ids(n_tokens, seed=11)
    head = 7
    state = model.new_state()
    model.forward(ids[:head], state, logits="none")  # positions are absolute: after a held prefix
    capture = [head + 1, 30, n_tokens]
    whole = model.new_state()
    model.forward(ids[:head], whole, logits="none")
    plain = model.forward(ids[head:], whole)
    logits, states = model.forward_capturing(ids[head:], state, capture)
    assert np.array_equal(logits, plain) and state.max_abs_diff(whole) == 0  # capturing changes nothing
    for p in capture:
        ref = model.new_state()
        model.forward(ids[:p], ref, logits="none")
        assert states[p].n_tokens == p and states[p].max_abs_diff(ref, kv_ulps=1) < 1e-4, p
        # continuing from the captured state gives what continuing the fresh prefix gives
        nxt = ids[p:p + 3] if p < n_tokens else _ids(3, seed=12)
        a = model.forward(nxt, states[p])
        b = model.forward(nxt, ref)
        assert cosine(a, b) > 0.99999, p
    states[30].layers[0].S[:] = 0  # independent copies
    assert state.max_abs_diff(whole) == 0
    with pytest.raises(ValueError, match="capture positions"):
        model.forward_capturing(ids[:3], model.new_state(), [4])


@pytest.mark.parametrize("weights_type", ["Q4_K_M", "Q8_0"])
def test_projections_of_one_input_round_it_once(model_factory, monkeypatch, weights_type):
    """A batched prefill rounds (dequantize + BLAS) or quantizes (the int8 tiles: Q8_K for the K
    formats, Q8_0 for Q8_0) each layer input once for all the matrices that read it (qkv,
    gate, beta, alpha / q, k, v / FFN gate, up) and once for each output projection: four per
    layer, not eight; and the logits are the same as preparing it per matrix."""
    from engine import weights

    model = Qwen35(GGUFFile(model_factory("tiny", weights_type)))
    ids = _ids(weights.SHORT_PREFILL + 36)
    k_tiles = [kernels.has_int8_prefill(q) for q in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K)]
    if weights_type == "Q4_K_M" and any(k_tiles) and not all(k_tiles):
        pytest.skip("Q4_K_M runs Q4_K in tiles and Q6_K in dequantize + BLAS here: an input read by both "
                    "is prepared both ways")
    if weights_type == "Q4_K_M":
        prepare = "quantize_q8_k_tokens" if all(k_tiles) else "round_activations"
    else:  # Q8_0: the x4 tiles at every length (AVX2) or dequantize + BLAS past SHORT_PREFILL
        prepare = "quantize_q8_0_tokens" if kernels.has_int8_prefill(GGMLQuantizationType.Q8_0) else "round_activations"
    calls = []
    real = getattr(weights, prepare)
    monkeypatch.setattr(weights, prepare, lambda x, *a: calls.append(x.shape) or real(x, *a))
    shared = model.forward(ids, model.new_state(), logits="last")
    assert len(calls) == 4 * model.config.n_layer, len(calls)
    assert model.scratch._prepared is None  # nothing held past the forward
    monkeypatch.setattr(weights.ScratchBuffer, "_memo", lambda self, x, key, make: make())
    calls.clear()
    each = model.forward(ids, model.new_state(), logits="last")
    assert len(calls) > 4 * model.config.n_layer, len(calls)
    np.testing.assert_array_equal(shared, each)

def _kernel_signatures() -> dict[str, int]:
    """How many signatures every numba kernel of the engine has compiled so far."""
    from numba.core.registry import CPUDispatcher

    from engine import attention, ops
    from engine.jit import Kernel
    from engine.quant import activations

    out = {}
    for mod in (attention, deltanet, ops, activations, kernels):
        for _name, obj in vars(mod).items():
            for d in (obj.parallel, obj.serial) if isinstance(obj, Kernel) else (obj,):
                if isinstance(d, CPUDispatcher):
                    out[f"{mod.__name__}.{d.py_func.__name__}"] = len(d.signatures)
    return out


@pytest.mark.parametrize("n_tokens", [1, 140])  # the serial and the parallel conv (140 x 512 channels)
def test_continuing_a_frozen_snapshot_compiles_nothing_new(model_factory, n_tokens):
    # numba types a read-only array apart from a writable one: a turn continuing from a state
    # restored from memory (frozen, State.fork) compiled its own copy of a kernel in the
    # middle of that turn (the conv with a frozen tail: 0.6 s of a 130 ms time to first token)
    model = Qwen35(GGUFFile(model_factory("tiny", "Q4_K_M")))
    ids = _ids(40 + n_tokens, seed=2)
    state = model.new_state()
    model.forward(ids[:40], state, logits="none")
    frozen = state.copy().freeze()
    live = state.copy()
    expected = model.forward(ids[40:], live, logits="last")  # compiles what a live state needs
    before = _kernel_signatures()
    assert sum(before.values()) > 0
    got = model.forward(ids[40:], frozen.fork(), logits="last")
    assert _kernel_signatures() == before
    np.testing.assert_array_equal(got, expected)
