"""Parity with llama.cpp for the smaller downloads' formats (Q2_K, Q3_K_S/M/L, IQ4_XS, IQ4_NL,
IQ3_S, IQ3_XXS) from committed fixtures (tests/oracle/record_fixtures.py; live in
tests/engine/test_lowbit_parity_with_live_llama_cpp.py): cosine ≥ 0.999 and argmax on ≥ 19/20 prompts for the 3+ bit
mixes, cosine ≥ 0.998 for Q2_K."""
import hashlib

import pytest

from engine.generate import Engine
from engine.synthetic.parity_cases import LOWBIT_PARITY, TOKENIZE_STRINGS, logit_prompts, lowbit_bounds
from tests.parity import check_logits, our_last_logits
from tests.engine.test_parity_with_recorded_llama_cpp import _fixture


@pytest.mark.parametrize("model", LOWBIT_PARITY, ids=lambda m: m[1])
def test_lowbit_logits_and_tokens_match_llama_cpp(model_factory, model):
    preset, weights, seed = model
    path = model_factory(preset, weights, seed)
    logits, _, meta = _fixture(preset, weights, seed)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == meta["sha256"], (
        "the factory now writes different bytes than the fixture was recorded on; "
        "re-record with `make oracle-fixtures`")
    eng = Engine.load(str(path), warm_up=False)
    assert [eng.tokenizer.encode(s) for s in TOKENIZE_STRINGS] == meta["tokens"]
    ours = [our_last_logits(eng, p) for p in logit_prompts()]
    cos, misses = lowbit_bounds(weights)
    assert check_logits(weights, ours, logits, min_cosine=cos, argmax_misses=misses) == []
