"""Continuous batching's model step (issue 55): `decode_batch` runs one token for each of B
sequences, each on its own state, through every layer together. With `exact`, row b's logits and
state are bit for bit what sequence b's own decode gives; by default (all rows in one product)
they are that up to rounding, and greedy picks the same tokens -- for prompts of different
lengths, a state forked from a frozen snapshot, and greedy runs continued for several steps."""
from __future__ import annotations

import numpy as np
import pytest

from engine.gguf_file import GGUFFile
from engine.models import load_model

PROMPTS = ([5, 17, 99], [3] * 7, list(range(40, 52)), [7, 300, 11, 2, 9] * 4)


def prefilled(model, prompts):
    out = []
    for p in prompts:
        st = model.new_state()
        model.forward(np.asarray(p, dtype=np.int64), st, logits="none")
        out.append(st)
    return out


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("preset,weights", [("tiny", "Q4_K_M"), ("tiny", "Q8_0"), ("tiny", "F32"),
                                            ("tiny-qwen2", "Q4_K_M")])
def test_a_batched_step_is_each_sequences_own_step(model_factory, preset, weights, exact):
    model = load_model(GGUFFile(model_factory(preset, weights, 0)))
    together, alone = prefilled(model, PROMPTS), prefilled(model, PROMPTS)
    frozen = together[1].copy().freeze()           # a snapshot many sessions continue from
    together[1], alone[1] = frozen.fork(), frozen.copy()
    nxt = [int(p[-1]) for p in PROMPTS]
    # greedy, several steps: states must stay equal too (by default, one: a rounding apart in the
    # f16 K/V cache compounds over the random model's steps)
    for step in range(6 if exact else 1):
        logits = model.decode_batch(nxt, together, exact=exact)
        own = np.stack([model.forward(np.asarray([t], dtype=np.int64), st) for t, st in zip(nxt, alone)])
        assert logits.shape == (len(PROMPTS), model.config.n_vocab)
        if exact:
            assert np.array_equal(logits, own), (step, float(np.abs(logits - own).max()))
        else:       # the products' rounding only: far below the logits' spread
            assert np.abs(logits - own).max() <= 1e-4 * np.abs(own).max(), (step, float(np.abs(logits - own).max()))
        assert (logits.argmax(axis=1) == own.argmax(axis=1)).all()
        for a, b in zip(together, alone):
            # (K/V are f16: a rounding apart there is up to an f16 ulp of the value)
            assert a.n_tokens == b.n_tokens and a.max_abs_diff(b) <= (0.0 if exact else 1e-2)
        nxt = [int(i) for i in logits.argmax(axis=1)]
    assert frozen.n_tokens == len(PROMPTS[1])      # the snapshot itself never moved


def test_a_batch_refuses_mismatched_inputs(model_factory):
    model = load_model(GGUFFile(model_factory("tiny", "Q4_K_M", 0)))
    with pytest.raises(ValueError, match="2 tokens for 1 states"):
        model.decode_batch([1, 2], [model.new_state()])
    with pytest.raises(ValueError):
        model.decode_batch([model.config.n_vocab], [model.new_state()])
