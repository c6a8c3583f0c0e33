"""Byte-level BPE merges over arrays: the part of tokenization that needs the vocabulary.

HuggingFace ``tokenizers`` builds its BPE model from 248k tokens and 248k merges in 0.5-0.9 s,
holding the GIL, on every cold start (issue 53); the tables here are three integer arrays, built
from the same lists once and loadable from a cache in milliseconds. The pre-tokenizer (the split
regex, the byte-to-unicode map) stays ``tokenizers``' (engine/tokenizer.py): it needs no
vocabulary.

The merge loop is HuggingFace's (``tokenizers`` ``models/bpe/word.rs``, ``merge_all``): a heap of
candidate merges ordered by rank then position; the lowest is applied if the pair it was made for
is still there, and the new symbol's pairs with its neighbours go on the heap. O(n log n) in a
word's length, so a hostile 100k-letter word costs milliseconds, not the O(n²) of a rescan.
Ranks follow HuggingFace where the merges list repeats a pair: the last occurrence wins (its map
is built by inserting in order).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = ["MergeTable", "merge_word", "merge_words"]


@dataclass(frozen=True)
class MergeTable:
    """``keys``: ``left << 32 | right`` token-id pairs, sorted; ``ranks`` and ``new_ids`` beside
    them (the merge's position in the list, the id of the merged token)."""

    keys: np.ndarray      # int64, sorted, unique
    ranks: np.ndarray     # int64
    new_ids: np.ndarray   # int64

    @classmethod
    def build(cls, vocab: dict[str, int], merges: list[str]) -> MergeTable:
        """From the vocabulary (text -> id) and the merges (``"left right"``, rank order). A merge
        whose parts or result are not tokens is an error, as it is to ``tokenizers``."""
        n = len(merges)
        # map() over the lists keeps the 750k lookups in C: ~0.1 s for Qwen3.5's merges where a
        # Python loop took 0.3 s
        parts = [m.partition(" ") for m in merges]
        lefts = [p[0] for p in parts]
        rights = [p[2] for p in parts]
        cols = [list(map(vocab.get, lefts)), list(map(vocab.get, rights)),
                list(map(vocab.get, map(operator.add, lefts, rights)))]
        if any(None in col for col in cols) or any(not p[1] for p in parts):
            for i, (a, sep, b) in enumerate(parts):
                if not sep:
                    raise ValueError(f"tokenizer.ggml.merges[{i}] = {merges[i]!r} is not 'left right'")
                missing = next((t for t in (a, b, a + b) if t not in vocab), None)
                if missing is not None:
                    raise ValueError(f"tokenizer.ggml.merges[{i}] = {merges[i]!r}: {missing!r} is not in the vocabulary")
        left, right, new = (np.array(col, dtype=np.int64) if n else np.empty(0, dtype=np.int64) for col in cols)
        keys = (left << 32) | right
        ranks = np.arange(n, dtype=np.int64)
        # the last occurrence of a repeated pair wins: stable sort, then keep each key's last entry
        order = np.argsort(keys, kind="stable")
        keys, ranks, new = keys[order], ranks[order], new[order]
        last = np.ones(n, dtype=bool)
        if n:
            last[:-1] = keys[1:] != keys[:-1]
        return cls(np.ascontiguousarray(keys[last]), np.ascontiguousarray(ranks[last]),
                   np.ascontiguousarray(new[last]))


@njit(cache=True, nogil=True)
def _lookup(keys: np.ndarray, a: int, b: int) -> int:
    """Index of the pair (a, b) in ``keys``, or -1."""
    k = (np.int64(a) << 32) | np.int64(b)
    i = np.searchsorted(keys, k)
    if i < keys.size and keys[i] == k:
        return int(i)
    return -1


@njit(cache=True, nogil=True)
def _heap_push(heap: np.ndarray, size: int, item: np.int64) -> int:
    i = size
    heap[i] = item
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= heap[i]:
            break
        heap[parent], heap[i] = heap[i], heap[parent]
        i = parent
    return size + 1


@njit(cache=True, nogil=True)
def _heap_pop(heap: np.ndarray, size: int) -> int:
    """Move the smallest item out to heap[size - 1]; returns the new size."""
    size -= 1
    heap[0], heap[size] = heap[size], heap[0]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and heap[left + 1] < heap[left]:
            child = left + 1
        if heap[i] <= heap[child]:
            break
        heap[i], heap[child] = heap[child], heap[i]
        i = child
    return size


@njit(cache=True, nogil=True)
def merge_word(symbols: np.ndarray, keys: np.ndarray, ranks: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """The token ids of one pre-tokenized word, given the ids of its characters (``symbols``)."""
    n = symbols.size
    if n < 2:
        return symbols.copy()
    c = symbols.copy()
    nxt = np.arange(1, n + 1)
    prv = np.arange(-1, n - 1)
    nxt[n - 1] = -1
    gone = np.zeros(n, dtype=np.bool_)
    # a heap item is rank << 32 | position: the lowest rank first, then the leftmost
    heap = np.empty(3 * n, dtype=np.int64)
    size = 0
    for i in range(n - 1):
        j = _lookup(keys, c[i], c[i + 1])
        if j >= 0:
            size = _heap_push(heap, size, (ranks[j] << 32) | i)
    while size > 0:
        size = _heap_pop(heap, size)
        top = heap[size]
        rank = top >> 32
        pos = top & 0xFFFFFFFF
        if gone[pos] or nxt[pos] < 0:
            continue
        right = nxt[pos]
        j = _lookup(keys, c[pos], c[right])
        if j < 0 or ranks[j] != rank:      # the pair it was made for has changed
            continue
        c[pos] = new_ids[j]
        gone[right] = True
        nxt[pos] = nxt[right]
        if nxt[pos] >= 0:
            prv[nxt[pos]] = pos
        if size + 2 > heap.size:           # never for a valid table: each merge adds at most 2
            grown = np.empty(2 * heap.size + 2, dtype=np.int64)
            grown[:size] = heap[:size]
            heap = grown
        p = prv[pos]
        if p >= 0:
            jp = _lookup(keys, c[p], c[pos])
            if jp >= 0:
                size = _heap_push(heap, size, (ranks[jp] << 32) | p)
        q = nxt[pos]
        if q >= 0:
            jq = _lookup(keys, c[pos], c[q])
            if jq >= 0:
                size = _heap_push(heap, size, (ranks[jq] << 32) | pos)
    out = np.empty(n, dtype=np.int64)
    m = 0
    i = 0
    while i >= 0:
        out[m] = c[i]
        m += 1
        i = nxt[i]
    return out[:m]


@njit(cache=True, nogil=True)
def merge_words(symbols: np.ndarray, ends: np.ndarray, keys: np.ndarray, ranks: np.ndarray,
                new_ids: np.ndarray) -> np.ndarray:
    """The token ids of many words at once: ``symbols`` holds their characters' ids one word after
    another, word w ending before ``ends[w]``. A character with no token (-1) is dropped, as
    ``tokenizers`` drops it when the vocabulary has no unknown token."""
    out = np.empty(symbols.size, dtype=np.int64)
    m = 0
    start = 0
    for w in range(ends.size):
        word = symbols[start:ends[w]]
        start = ends[w]
        kept = word[word >= 0]
        ids = merge_word(kept, keys, ranks, new_ids)
        out[m:m + ids.size] = ids
        m += ids.size
    return out[:m]
