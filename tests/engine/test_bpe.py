"""Our merges (engine/bpe.py) against HuggingFace ``tokenizers``' BPE model, the tokenizer's engine
until issue 53: the same ids on the real Qwen3.5 vocabulary for any text, in every encode mode;
the corner cases of its merge rule (a repeated pair, a character with no token); and a hostile
word costing milliseconds, not the quadratic rescan's minutes."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HF

from engine.synthetic.qwen35_vocab import build_qwen35_vocab
from engine.tokenizer import PRE_TOKENIZER_PATTERNS, Tokenizer, TokenType


def reference(meta: dict) -> HF:
    """``tokenizers`` built as engine/tokenizer.py built it before (BPE model, split regex,
    byte-level map, CONTROL tokens special, USER_DEFINED ones not)."""
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    pairs = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    hf = HF(models.BPE(vocab=dict(zip(tokens, range(len(tokens)))), merges=pairs, ignore_merges=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS[meta["tokenizer.ggml.pre"]]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types)
               if k in (TokenType.CONTROL, TokenType.UNKNOWN)]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == TokenType.USER_DEFINED]
    hf.add_special_tokens(control)
    hf.add_tokens(user)
    return hf


def hf_encode(hf: HF, text: str, parse_special: bool) -> list[int]:
    hf.encode_special_tokens = not parse_special
    try:
        return hf.encode(text, add_special_tokens=False).ids
    finally:
        hf.encode_special_tokens = False


@pytest.fixture(scope="module")
def pair():
    meta = build_qwen35_vocab().metadata()
    return Tokenizer.from_gguf_metadata(meta), reference(meta)


MARKERS = st.sampled_from(["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "<|endoftext|>"])
TEXT = st.lists(st.one_of(st.text(max_size=40), MARKERS,
                          st.text(alphabet="ab 1é\n\t'sS日本語🙂", max_size=30),
                          st.sampled_from([" hello", " world", "don't", "  \n\n", "12345", "ümlaut", "aaaaaa"])),
                max_size=12).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT)
def test_the_same_ids_as_tokenizers_on_the_real_vocabulary(pair, text):
    ours, hf = pair
    assert ours.encode(text, parse_special=True, add_special=False) == hf_encode(hf, text, True)
    assert ours.encode(text, parse_special=False, add_special=False) == hf_encode(hf, text, False)
    plain = HF(hf.model)
    plain.pre_tokenizer = hf.pre_tokenizer
    assert ours.encode_text(text) == (plain.encode(text, add_special_tokens=False).ids if text else [])


def _tiny_meta(tokens: list[str], merges: list[str]) -> dict:
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [TokenType.NORMAL] * len(tokens), "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": 0}


def test_a_repeated_merge_takes_its_last_rank_and_a_character_without_a_token_is_dropped():
    # "b c" listed first and again last: tokenizers keeps the later rank, so "a b" wins in "abc";
    # "z" has no token and falls out of the word
    meta = _tiny_meta(["a", "b", "c", "ab", "bc", "abc"], ["b c", "a b", "ab c", "b c"])
    ours, hf = Tokenizer.from_gguf_metadata(meta), reference(meta)
    for text in ("abc", "bcab", "azbc", "zzz", "abcabc", "cba"):
        assert ours.encode_text(text) == hf_encode(hf, text, False), text


def test_a_hostile_word_costs_milliseconds(pair):
    ours, hf = pair
    word = "ab" * 50_000 + "é" * 20_000          # one pre-tokenizer piece of 120k letters
    t0 = time.process_time()
    ids = ours.encode_text(word)
    cpu = time.process_time() - t0
    assert ids == hf_encode(hf, word, False)
    assert cpu < 10.0, f"{cpu:.1f} s of CPU for one 120k-letter word"   # a quadratic rescan takes minutes
