"""A marker the model writes as text (``</think>``, ``<tool_call>``): the tokens that would finish
it with more text after it in the same token.

A constraint that starts where a marker ends (engine/constraints.py, engine/reasoning.py) must see
the marker end on a token boundary: what a token carries past the marker would slip past the
grammar. :func:`marker_crossers` lists, for each k, the tokens that complete the marker when the
text so far ends with its first k characters and carry text after it; :func:`forbidden_after`
picks the lists that apply to a text. Built once per tokenizer and marker, from the few tokens
that hold the marker's last character (~50 ms for Qwen3.5's 248,320 tokens).
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from engine.tokenizer import Tokenizer

__all__ = ["forbidden_after", "marker_crossers"]

_TABLES: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[str, bool], list[np.ndarray]]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def marker_crossers(tok: Tokenizer, marker: str, blank_ok: bool) -> list[np.ndarray]:
    """For k in 0..len(marker)-1: the ids of tokens that, after a text ending in ``marker[:k]``,
    complete ``marker`` and carry text past it (``blank_ok``: text other than blank space)."""
    with _LOCK:
        hit = _TABLES.setdefault(tok, {}).get((marker, blank_ok))
    if hit is not None:
        return hit
    last = marker[-1]
    # a token completes the marker only if it holds its last character; the stored text keeps
    # printable ASCII as itself (byte-level BPE), so that filter is a cheap first pass
    candidates = [i for i in range(tok.n_vocab) if last in tok.piece(i)]
    out: list[list[int]] = [[] for _ in marker]
    for i in candidates:
        t = tok.token_bytes(i).decode("utf-8", errors="replace")
        for k in range(len(marker)):
            s = marker[:k] + t
            at = s.find(marker)
            if at < 0:
                continue
            past = s[at + len(marker):]
            if past.strip() if blank_ok else past:
                out[k].append(i)
    tables = [np.asarray(ids, dtype=np.int64) for ids in out]
    with _LOCK:
        _TABLES.setdefault(tok, {})[(marker, blank_ok)] = tables
    return tables


def forbidden_after(text: str, tok: Tokenizer, marker: str, blank_ok: bool) -> np.ndarray:
    """The tokens that may not follow ``text`` (which does not hold ``marker`` yet)."""
    tables = marker_crossers(tok, marker, blank_ok)
    return np.concatenate([tables[k] for k in range(len(marker)) if text.endswith(marker[:k])])
