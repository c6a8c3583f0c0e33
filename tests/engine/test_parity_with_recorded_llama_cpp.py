"""Parity with llama.cpp from committed fixtures (recorded by tests/oracle/record_fixtures.py).

Runs in `make test` without compiling llama.cpp. The fixture stores the sha256 of the model
file it was recorded on, so a change to the factory that alters the bytes fails loudly here
(re-record with `make oracle-fixtures`) instead of comparing against a different model.
"""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from engine.generate import Engine
from engine.synthetic.parity_cases import (GREEDY_TOKENS, PARITY_MODELS, TOKENIZE_STRINGS, greedy_prompts,
                                         logit_prompts)
from tests.parity import check_logits, our_greedy, our_last_logits

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oracle"


def _fixture(preset, weights, seed):
    path = FIXTURES / f"{preset}-{weights}-{seed}.npz"
    if not path.exists():
        pytest.fail(f"missing oracle fixture {path.name}: run `make oracle-fixtures` with llama_cpp installed")
    data = np.load(path)
    return data["logits"], data["greedy"], json.loads(str(data["meta"]))


@pytest.fixture(scope="module", params=PARITY_MODELS, ids=lambda m: f"{m[0]}-{m[1]}")
def case(request, model_factory):
    preset, weights, seed = request.param
    path = model_factory(preset, weights, seed)
    logits, greedy, meta = _fixture(preset, weights, seed)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == meta["sha256"], (
        "the factory now writes different bytes than the fixture was recorded on; "
        "re-record with `make oracle-fixtures`")
    return weights, Engine.load(str(path), warm_up=False), logits, greedy, meta


def test_token_ids_match_llama_cpp(case):
    weights, eng, _, _, meta = case
    assert len(TOKENIZE_STRINGS) >= 30
    mismatches = [(s, eng.tokenizer.encode(s), want) for s, want in zip(TOKENIZE_STRINGS, meta["tokens"])
                  if eng.tokenizer.encode(s) != want]
    assert not mismatches, mismatches[:3]


def test_last_position_logits_match_llama_cpp(case):
    weights, eng, logits, _, _ = case
    ours = [our_last_logits(eng, p) for p in logit_prompts()]
    assert len(ours) == 20 and max(len(p) for p in logit_prompts()) == 300
    assert check_logits(weights, ours, logits) == []


@pytest.mark.parametrize("preset", sorted({p for p, w, _ in PARITY_MODELS if w == "F32"}))
def test_greedy_continuations_match_llama_cpp(model_factory, preset):
    """The acceptance asks greedy equality on the F32 model of each family."""
    _, greedy, _ = _fixture(preset, "F32", 0)
    eng = Engine.load(str(model_factory(preset, "F32", 0)), warm_up=False)
    prompts = greedy_prompts()
    equal = sum(our_greedy(eng, p, GREEDY_TOKENS) == list(g) for p, g in zip(prompts, greedy))
    assert equal >= len(prompts) - 1, f"{equal}/{len(prompts)} greedy continuations equal"
