"""Byte-level BPE tokenizer for Qwen3.5 GGUF files, with llama.cpp's semantics.

The vocabulary, merges and token types come from the GGUF metadata (``tokenizer.ggml.*``).
HuggingFace ``tokenizers`` pre-tokenizes (the split regex and the byte-level map, in Rust; they
need no vocabulary); the merges run over integer tables in numba (engine/bpe.py, HuggingFace's
algorithm), which build from the metadata in a fraction of the time ``tokenizers``' BPE model
takes (0.5-0.9 s for Qwen3.5's 248k tokens, on every cold start: issue 53). What we take from
llama.cpp (``src/llama-vocab.cpp``, ``src/unicode.cpp``) and reproduce here is the *semantics*:

- pre-tokenizer: the ``qwen35`` split regex (LLAMA_VOCAB_PRE_TYPE_QWEN35), then GPT-2's
  byte-to-unicode mapping; BPE merges applied by rank.
- special tokens: CONTROL and USER_DEFINED tokens are cut out of the text before BPE and kept
  whole. With ``parse_special=False`` CONTROL tokens are plain text but USER_DEFINED ones
  (``<think>``, ``<tool_call>`` ...) are still kept whole -- llama.cpp's rule.
- pieces: NORMAL tokens decode through the byte-level map; CONTROL / USER_DEFINED tokens are
  their text verbatim; UNUSED (``[PAD…]``) tokens decode to nothing.
- BOS is added only when ``tokenizer.ggml.add_bos_token`` is true (Qwen's files say false).
- end of generation: the eos token plus every token llama.cpp marks as EOG by its text.

One difference is known and accepted: llama.cpp partitions special tokens longest-first over
the whole text, we match leftmost-longest (as ``tokenizers`` does). They differ only when two
special tokens overlap in the text (one's suffix is another's prefix), which Qwen's set never
does in practice.
"""
from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import re

import numpy as np
from tokenizers import Regex, pre_tokenizers

from engine import tokenizer_cache
from engine.bpe import MergeTable, merge_words
from engine.history import Piece

__all__ = [
    "IncrementalDecoder",
    "PRE_TOKENIZER_PATTERNS",
    "TokenType",
    "Tokenizer",
]


class TokenType:
    """gguf.TokenType values (kept here so the engine does not import gguf for six ints)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# llama.cpp's adapted forms of the tokenizer.json regexes: the case-insensitive group
# (?i:'s|'t|...) is spelled out as '[sS]|'[tT]|... so Unicode case folding cannot match
# more than llama.cpp's custom splitter does (which lower-cases ASCII only).
PRE_TOKENIZER_PATTERNS: dict[str, str] = {
    # Qwen3.5: letter runs also take combining marks ([\p{L}\p{M}]+); one digit per piece.
    "qwen35": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
        r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
        r"|\p{N}"
        r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+"
        r"|\s+(?!\S)"
        r"|\s+"
    ),
    # Qwen2 / Qwen3: the same without \p{M}.
    "qwen2": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
        r"|[^\r\n\p{L}\p{N}]?\p{L}+"
        r"|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+"
        r"|\s+(?!\S)"
        r"|\s+"
    ),
}

# Texts llama.cpp treats as end-of-generation (llama-vocab.cpp, "special_eog_ids"), limited
# to the ones a Qwen-family vocabulary can contain, plus its FIM pad/repo/sep detection.
_EOG_TEXTS = frozenset({
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|fim_repo|>",
    "<|file_sep|>",
})


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by byte-level BPE."""
    visible = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in visible}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_TO_UNICODE: dict[int, str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_UNICODE.items()}
_CHAR_SPAN = 1 + max(ord(c) for c in BYTE_TO_UNICODE.values())   # the map's characters are below it


def _alternation(texts: list[str]) -> re.Pattern[str] | None:
    """A pattern matching any of ``texts``, the longest first where several start at one place."""
    if not texts:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(set(texts), key=len, reverse=True)))


def _byte_level_decode(text: str) -> bytes:
    """Bytes of a NORMAL token's text; a character outside the map is kept as UTF-8."""
    out = bytearray()
    for ch in text:
        b = UNICODE_TO_BYTE.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


def _require(meta: Mapping[str, Any], key: str) -> Any:
    if key not in meta:
        raise ValueError(f"GGUF metadata has no {key!r}; cannot build the tokenizer")
    return meta[key]


class Tokenizer:
    """A GGUF byte-level BPE vocabulary. Build it with :meth:`from_gguf_metadata`."""

    def __init__(
        self,
        *,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str] | MergeTable,
        pre: str,
        eos_id: int,
        bos_id: int | None = None,
        pad_id: int | None = None,
        add_bos: bool = False,
    ) -> None:
        n = len(tokens)
        if len(token_types) != n:
            raise ValueError(
                f"tokenizer.ggml.token_type has {len(token_types)} entries but "
                f"tokenizer.ggml.tokens has {n}"
            )
        if pre not in PRE_TOKENIZER_PATTERNS:
            raise ValueError(
                f"unsupported tokenizer.ggml.pre {pre!r}; supported: "
                f"{', '.join(sorted(PRE_TOKENIZER_PATTERNS))}"
            )
        for name, value in (("eos", eos_id), ("bos", bos_id), ("padding", pad_id)):
            if value is not None and not 0 <= int(value) < n:
                raise ValueError(f"tokenizer.ggml.{name}_token_id {value} is outside the vocabulary of {n}")

        self.cache_hit = False   # loaded from engine/tokenizer_cache.py (from_gguf_metadata sets it)
        self._tokens = tokens if isinstance(tokens, list) else list(tokens)
        self._types = token_types if isinstance(token_types, list) else list(token_types)
        self.pre = pre
        self.eos_id = int(eos_id)
        self.bos_id = None if bos_id is None else int(bos_id)
        self.pad_id = None if pad_id is None else int(pad_id)
        self.add_bos = bool(add_bos) and self.bos_id is not None
        self._piece_cache: dict[int, bytes] = {}
        self._marker_texts: tuple[str, ...] | None = None

        # Every token with its id (the last occurrence wins on a duplicate text, as in
        # llama.cpp's token_to_id); marker tokens found in a text take these ids.
        self._vocab: dict[str, int] = dict(zip(self._tokens, range(n)))
        self._merges = merges if isinstance(merges, MergeTable) else MergeTable.build(self._vocab, list(merges))
        # the id of each byte-level character (-1: the vocabulary has no such token)
        self._char_ids = np.full(_CHAR_SPAN, -1, dtype=np.int64)
        for ch in BYTE_TO_UNICODE.values():
            tid = self._vocab.get(ch)
            if tid is not None:
                self._char_ids[ord(ch)] = tid
        self._split = pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERNS[pre]), behavior="isolated")
        self._pre = pre_tokenizers.Sequence([
            self._split,
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        # Markers cut out of a text before BPE, leftmost then longest: CONTROL / UNKNOWN only when
        # specials are parsed, USER_DEFINED always (llama.cpp's rule)
        kinds = np.asarray(self._types)     # a few hundred markers among 248k: found in numpy
        control = [self._tokens[i] for i in np.flatnonzero((kinds == TokenType.CONTROL) | (kinds == TokenType.UNKNOWN))
                   if self._tokens[i]]
        user = [self._tokens[i] for i in np.flatnonzero(kinds == TokenType.USER_DEFINED) if self._tokens[i]]
        self._markers_re = _alternation(control + user)
        self._user_re = _alternation(user)

        # llama.cpp picks EOG tokens by their text whatever their stored type
        eog = {self.eos_id}
        for text in _EOG_TEXTS:
            tid = self._vocab.get(text)
            if tid is not None:
                eog.add(tid)
        self.eog_ids: frozenset[int] = frozenset(eog)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], cache_dir: str | None = None) -> Tokenizer:
        """Build from GGUF metadata (key -> value, as GGUFFile reads it or plain Python values).
        ``cache_dir``: load it from there when this vocabulary was built before, else build and
        store it (engine/tokenizer_cache.py)."""
        model = _require(meta, "tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(
                f"unsupported tokenizer.ggml.model {model!r}: warmllm supports only 'gpt2' "
                "(byte-level BPE, as Qwen3.5 uses)"
            )
        pre = meta.get("tokenizer.ggml.pre")
        if pre is None:
            raise ValueError(
                "GGUF metadata has no 'tokenizer.ggml.pre'; supported: "
                + ", ".join(sorted(PRE_TOKENIZER_PATTERNS))
            )
        fields = dict(pre=pre, eos_id=_require(meta, "tokenizer.ggml.eos_token_id"),
                      bos_id=meta.get("tokenizer.ggml.bos_token_id"),
                      pad_id=meta.get("tokenizer.ggml.padding_token_id"),
                      add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)))
        key = tokenizer_cache.cache_key(meta) if cache_dir else None
        state = tokenizer_cache.load(cache_dir, key) if cache_dir and key else None
        if state is not None:
            table = MergeTable(state["keys"], state["ranks"], state["new_ids"])
            tok = cls(tokens=state["tokens"], token_types=state["types"], merges=table, **fields)
            tok.cache_hit = True
            return tok
        tok = cls(tokens=_require(meta, "tokenizer.ggml.tokens"),
                  token_types=_require(meta, "tokenizer.ggml.token_type"),
                  merges=_require(meta, "tokenizer.ggml.merges"), **fields)
        if cache_dir and key:
            t = tok._merges
            tokenizer_cache.store(cache_dir, key, {"tokens": tok._tokens, "types": tok._types,
                                                   "keys": t.keys, "ranks": t.ranks, "new_ids": t.new_ids})
        return tok

    # -- vocabulary ---------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    @property
    def pieces(self) -> Sequence[str]:
        """Every token's text as stored, by id (read-only: bulk readers such as the grammar trie)."""
        return tuple(self._tokens) if not isinstance(self._tokens, tuple) else self._tokens

    @property
    def token_types(self) -> np.ndarray:
        """Every token's type, by id (a read-only copy)."""
        return np.asarray(self._types, dtype=np.int32)

    def token_id(self, piece: str) -> int | None:
        """Id of a token given its stored text (byte-level form for NORMAL tokens)."""
        return self._vocab.get(piece)

    def piece(self, id: int) -> str:
        """The token's text as stored in the GGUF file."""
        self._check_id(id)
        return self._tokens[id]

    def token_type(self, id: int) -> int:
        self._check_id(id)
        return self._types[id]

    def _check_id(self, id: int) -> None:
        if not 0 <= id < len(self._tokens):
            raise ValueError(f"token id {id} is out of range for a vocabulary of n_vocab={len(self._tokens)}")

    # -- encode / decode ----------------------------------------------------------------

    def encode(self, text: str, parse_special: bool = True, add_special: bool = True) -> list[int]:
        """Token ids of ``text``.

        ``parse_special``: CONTROL tokens written in the text become those tokens (True) or
        stay plain text (False); USER_DEFINED tokens are kept whole either way.
        ``add_special``: prepend BOS when the metadata asks for it (llama.cpp's add_special).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes str, not {type(text).__name__}")
        ids: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:  # add_bos implies a bos_id
            ids.append(self.bos_id)
        markers = self._markers_re if parse_special else self._user_re
        at = 0
        if markers is not None:
            for m in markers.finditer(text):
                ids += self.encode_text(text[at:m.start()])
                ids.append(self._vocab[m.group()])
                at = m.end()
        ids += self.encode_text(text[at:])
        return ids

    @property
    def marker_texts(self) -> tuple[str, ...]:
        """The texts this tokenizer splits out as one token when it parses specials (CONTROL,
        UNKNOWN and USER_DEFINED: ``<|im_start|>``, ``<think>``, ``<tool_call>`` ...): what a
        chat template writes and a client's text never becomes (engine/history.py)."""
        texts = self._marker_texts
        if texts is None:
            kinds = np.asarray(self._types)
            marks = np.flatnonzero(np.isin(kinds, (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED)))
            texts = tuple(sorted({self._tokens[i] for i in marks if self._tokens[i]}))
            self._marker_texts = texts
        return texts

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` with every character text: no special or marker token at all
        (not even USER_DEFINED ones like ``<think>``, which :meth:`encode` keeps whole in either
        mode, as llama.cpp does). What a chat prompt's fields are encoded with."""
        if not isinstance(text, str):
            raise TypeError(f"encode_text() takes str, not {type(text).__name__}")
        if not text:
            return []
        words = [w for w, _ in self._pre.pre_tokenize_str(text)]
        # each word's byte-level characters as code points (all below _CHAR_SPAN), one array
        chars = np.frombuffer("".join(words).encode("utf-32-le"), dtype=np.uint32)
        ends = np.cumsum(np.fromiter(map(len, words), dtype=np.int64, count=len(words)))
        t = self._merges
        return merge_words(self._char_ids[chars], ends, t.keys, t.ranks, t.new_ids).tolist()

    def encode_pieces(self, pieces: Sequence[Piece], add_special: bool = True) -> list[int]:
        """Token ids of a rendered chat prompt cut into pieces (engine/history.py): a marker
        piece is its token, a text piece :meth:`encode_text`."""
        ids: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            ids.append(self.bos_id)
        for p in pieces:
            if p.marker:
                tid = self._vocab.get(p.text)
                if tid is None:
                    raise ValueError(f"{p.text!r} is no token of this vocabulary")
                ids.append(tid)
            else:
                ids += self.encode_text(p.text)
        return ids

    def is_marker(self, id: int) -> bool:
        """Whether token `id` is one of :attr:`marker_texts`' tokens."""
        return self._types[id] in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED)

    def split_words(self, text: str) -> list[str]:
        """The pre-tokenizer's pieces of ``text`` (no special-token handling): for debugging
        a mismatch against llama.cpp, which splits with the same regex."""
        return [piece for piece, _ in self._split.pre_tokenize_str(text)]

    def token_bytes(self, id: int, special: bool = True) -> bytes:
        """The bytes one token stands for (llama.cpp's token_to_piece)."""
        cached = self._piece_cache.get(id)
        if cached is None:
            self._check_id(id)
            kind = self._types[id]
            text = self._tokens[id]
            if kind in (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN):
                cached = text.encode("utf-8")
            elif kind == TokenType.UNUSED:
                cached = b""
            elif kind == TokenType.BYTE and len(text) == 6 and text.startswith("<0x"):
                cached = bytes([int(text[3:5], 16)])
            else:
                cached = _byte_level_decode(text)
            self._piece_cache[id] = cached
        if not special and self._types[id] in (TokenType.CONTROL, TokenType.UNKNOWN):
            return b""
        return cached

    def decode_bytes(self, ids: Sequence[int], special: bool = True) -> bytes:
        """Concatenated bytes of ``ids``; ``special=False`` drops CONTROL tokens."""
        return b"".join(self.token_bytes(int(i), special) for i in ids)

    def decode(self, ids: Sequence[int], special: bool = True) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD (never raises for bad bytes)."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def incremental_decoder(self, special: bool = True) -> IncrementalDecoder:
        return IncrementalDecoder(self, special)

    def __repr__(self) -> str:
        return f"Tokenizer(pre={self.pre!r}, n_vocab={self.n_vocab}, eos_id={self.eos_id}, eog_ids={sorted(self.eog_ids)})"


def _incomplete_tail(buf: bytes | bytearray) -> int:
    """Length of a trailing UTF-8 sequence that is valid so far but not yet complete."""
    n = len(buf)
    for back in range(1, min(3, n) + 1):
        b = buf[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if b & 0xE0 == 0xC0:
            need = 2
        elif b & 0xF0 == 0xE0:
            need = 3
        elif b & 0xF8 == 0xF0:
            need = 4
        else:
            return 0  # ASCII or an invalid lead: nothing to wait for
        return back if back < need else 0
    return 0


class IncrementalDecoder:
    """Turns a stream of token ids into text, never splitting a UTF-8 character.

    ``feed`` returns the text completed by that token (possibly ""), holding back the bytes
    of a character whose remaining bytes may come with the next token. Bytes that can never
    become valid UTF-8 come out as U+FFFD, exactly as :meth:`Tokenizer.decode` would.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = True) -> None:
        self._tok = tokenizer
        self._special = special
        self._pending = bytearray()

    def feed(self, token_id: int) -> str:
        n = self._tok.n_vocab
        try:
            token_id = operator.index(token_id)
        except TypeError:
            raise ValueError(f"token id {token_id!r} is not an integer (n_vocab={n})") from None
        if not 0 <= token_id < n:
            raise ValueError(f"token id {token_id!r} is out of range for a vocabulary of n_vocab={n}")
        self._pending += self._tok.token_bytes(token_id, self._special)
        keep = _incomplete_tail(self._pending)
        cut = len(self._pending) - keep
        if cut == 0:
            return ""
        out = bytes(self._pending[:cut]).decode("utf-8", errors="replace")
        del self._pending[:cut]
        return out

    def flush(self) -> str:
        """Whatever is held back, with an unfinished character as U+FFFD."""
        out = bytes(self._pending).decode("utf-8", errors="replace")
        self._pending.clear()
        return out
