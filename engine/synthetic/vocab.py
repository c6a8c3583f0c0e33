"""The model factory's vocabulary: a small byte-level BPE laid out like Qwen3.5's.

Test models need a tokenizer that behaves like the real one (same pre-tokenizer, byte-level
pieces, the same special and added tokens with the same token types, eos/pad conventions) but
is small enough to build in a fraction of a second. We train a BPE on ``corpus.txt`` (text
written for this purpose) with HuggingFace ``tokenizers``' trainer -- deterministic and fast,
where a Python trainer would take seconds -- and lay the result out as
``convert_hf_to_gguf.py`` writes a Qwen3.5 file:

    [0, 256)                     the 256 byte tokens, in byte order (NORMAL)
    [256, n_learned)             one token per learned merge, in merge order (NORMAL)
    [n_learned, n_learned + 33)  Qwen3.5's added tokens, in Qwen's order: ``<|...|>`` and
                                 the tts tokens are CONTROL, ``<tool_call>``, ``<think>``
                                 and friends are USER_DEFINED (non-special added tokens)
    [..., n_vocab)               ``[PAD{id}]`` fillers (UNUSED), as the converter pads up to
                                 the model's embedding size

eos = ``<|im_end|>`` and pad = ``<|endoftext|>`` (Qwen3.5's tokenizer_config: eos_token
``<|im_end|>``, pad_token ``<|endoftext|>``); bos = ``<|endoftext|>`` with
``add_bos_token = False``, so no BOS is ever added -- the same as Qwen's GGUFs.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, pre_tokenizers, trainers

from engine.tokenizer import BYTE_TO_UNICODE, PRE_TOKENIZER_PATTERNS, TokenType

__all__ = ["QWEN35_ADDED_TOKENS", "TEXT_MARKERS", "VocabSpec", "build_vocab", "LEARNED_VOCAB", "without_marker_tokens"]

_HERE = Path(__file__).resolve().parent
CORPUS_PATH = _HERE / "corpus.txt"
CHAT_TEMPLATE_PATH = _HERE / "qwen35_chat_template.jinja"

# Learned part (bytes + merges) for every n_vocab >= 2081 (corpus.txt yields ~2250 at most
# with min_frequency=2, so this size is always reached); smaller vocabularies learn
# fewer merges so that the added tokens still fit.
LEARNED_VOCAB = 2048

# Qwen3.5's added tokens (ids 248044..248076 in the real vocabulary), in order, with the
# type the converter gives them: special or "<|...|>"-looking -> CONTROL, else USER_DEFINED.
QWEN35_ADDED_TOKENS: tuple[tuple[str, int], ...] = (
    ("<|endoftext|>", TokenType.CONTROL),
    ("<|im_start|>", TokenType.CONTROL),
    ("<|im_end|>", TokenType.CONTROL),
    ("<|object_ref_start|>", TokenType.CONTROL),
    ("<|object_ref_end|>", TokenType.CONTROL),
    ("<|box_start|>", TokenType.CONTROL),
    ("<|box_end|>", TokenType.CONTROL),
    ("<|quad_start|>", TokenType.CONTROL),
    ("<|quad_end|>", TokenType.CONTROL),
    ("<|vision_start|>", TokenType.CONTROL),
    ("<|vision_end|>", TokenType.CONTROL),
    ("<|vision_pad|>", TokenType.CONTROL),
    ("<|image_pad|>", TokenType.CONTROL),
    ("<|video_pad|>", TokenType.CONTROL),
    ("<tool_call>", TokenType.USER_DEFINED),
    ("</tool_call>", TokenType.USER_DEFINED),
    ("<|fim_prefix|>", TokenType.CONTROL),
    ("<|fim_middle|>", TokenType.CONTROL),
    ("<|fim_suffix|>", TokenType.CONTROL),
    ("<|fim_pad|>", TokenType.CONTROL),
    ("<|repo_name|>", TokenType.CONTROL),
    ("<|file_sep|>", TokenType.CONTROL),
    ("<tool_response>", TokenType.USER_DEFINED),
    ("</tool_response>", TokenType.USER_DEFINED),
    ("<think>", TokenType.USER_DEFINED),
    ("</think>", TokenType.USER_DEFINED),
    ("<|audio_start|>", TokenType.CONTROL),
    ("<|audio_end|>", TokenType.CONTROL),
    ("<tts_pad>", TokenType.CONTROL),
    ("<tts_text_bos>", TokenType.CONTROL),
    ("<tts_text_eod>", TokenType.CONTROL),
    ("<tts_text_bos_single>", TokenType.CONTROL),
    ("<|audio_pad|>", TokenType.CONTROL),
)

_MIN_VOCAB = 256 + len(QWEN35_ADDED_TOKENS)


@dataclass(frozen=True)
class VocabSpec:
    """A complete GGUF tokenizer description. Sequences are tuples: the spec is cached and shared."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    eos_id: int
    pad_id: int
    pre: str
    chat_template: str
    bos_id: int | None = None
    add_bos: bool = False

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def metadata(self) -> dict[str, Any]:
        """The ``tokenizer.*`` GGUF keys, as fresh lists / ints / str / bool for GGUFWriter."""
        meta: dict[str, Any] = {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": self.pre,
            "tokenizer.ggml.tokens": list(self.tokens),
            "tokenizer.ggml.token_type": [int(t) for t in self.token_types],
            "tokenizer.ggml.merges": list(self.merges),
            "tokenizer.ggml.eos_token_id": int(self.eos_id),
            "tokenizer.ggml.padding_token_id": int(self.pad_id),
            "tokenizer.ggml.add_bos_token": bool(self.add_bos),
            "tokenizer.chat_template": self.chat_template,
        }
        if self.bos_id is not None:
            meta["tokenizer.ggml.bos_token_id"] = int(self.bos_id)
        return meta


@functools.lru_cache(maxsize=8)
def _learned(n_learned: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tokens, merges) of a byte-level BPE with ``n_learned`` entries trained on corpus.txt."""
    alphabet = [BYTE_TO_UNICODE[b] for b in range(256)]
    merges: list[str] = []
    if n_learned > 256:
        hf = _HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS["qwen35"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        trainer = trainers.BpeTrainer(
            vocab_size=n_learned,
            min_frequency=2,
            show_progress=False,
            initial_alphabet=alphabet,
            special_tokens=[],
        )
        hf.train_from_iterator([CORPUS_PATH.read_text(encoding="utf-8")], trainer)
        for pair in json.loads(hf.to_str())["model"]["merges"]:
            left, right = pair if isinstance(pair, list) else pair.split(" ", 1)
            merges.append(f"{left} {right}")
    tokens = list(alphabet)
    seen = set(tokens)
    for m in merges:
        left, right = m.split(" ", 1)
        tok = left + right
        if tok in seen:  # cannot happen with tokenizers' trainer; keep the layout honest anyway
            raise RuntimeError(f"BPE trainer produced a duplicate token {tok!r}")
        seen.add(tok)
        tokens.append(tok)
    return tuple(tokens), tuple(merges)


# The markers a chat template writes around tool calls, tool results and reasoning, which
# Qwen's tokenizers add as tokens of their own and a tokenizer that never added them spells in
# text pieces.
TEXT_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")


def without_marker_tokens(spec: VocabSpec) -> VocabSpec:
    """``spec`` with no token for any of :data:`TEXT_MARKERS` (each slot an unused filler, so ids
    and size stay): what llama.cpp's converter makes of a tokenizer that never added them. The
    template writes the same markers; they are text there."""
    tokens, types = list(spec.tokens), list(spec.token_types)
    for i, t in enumerate(tokens):
        if t in TEXT_MARKERS:
            tokens[i], types[i] = f"[PAD{i}]", TokenType.UNUSED
    return replace(spec, tokens=tuple(tokens), token_types=tuple(types))


@functools.lru_cache(maxsize=8)
def build_vocab(n_vocab: int) -> VocabSpec:
    """The factory vocabulary of exactly ``n_vocab`` tokens (deterministic, cached)."""
    if n_vocab < _MIN_VOCAB:
        raise ValueError(
            f"n_vocab={n_vocab} is too small: the 256 byte tokens and Qwen3.5's "
            f"{len(QWEN35_ADDED_TOKENS)} added tokens need at least {_MIN_VOCAB}"
        )
    n_learned = min(LEARNED_VOCAB, n_vocab - len(QWEN35_ADDED_TOKENS))
    learned_tokens, merges = _learned(n_learned)
    tokens = list(learned_tokens)
    types = [TokenType.NORMAL] * len(tokens)
    for text, kind in QWEN35_ADDED_TOKENS:
        tokens.append(text)
        types.append(kind)
    tokens.extend(f"[PAD{i}]" for i in range(len(tokens), n_vocab))
    types.extend([TokenType.UNUSED] * (n_vocab - len(types)))
    index = {t: i for i, t in enumerate(tokens[len(learned_tokens):], len(learned_tokens))}
    return VocabSpec(
        tokens=tuple(tokens),
        token_types=tuple(types),
        merges=merges,
        eos_id=index["<|im_end|>"],
        pad_id=index["<|endoftext|>"],
        bos_id=index["<|endoftext|>"],
        add_bos=False,
        pre="qwen35",
        chat_template=CHAT_TEMPLATE_PATH.read_text(encoding="utf-8"),
    )
