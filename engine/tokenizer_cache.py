"""A GGUF file's tokenizer as built, kept on disk: the next cold start loads it instead of decoding
the vocabulary and building the merge tables (issue 53: ~0.4 s of every start for Qwen3.5's 248k
tokens and merges, ~0.05 s loaded).

Keyed by what the tokenizer is made of -- the stored bytes of ``tokenizer.ggml.tokens``,
``token_type`` and ``merges`` and the scalar ``tokenizer.ggml.*`` fields -- and by the code that
builds it (engine/tokenizer.py, engine/bpe.py, this file), so a changed vocabulary or a changed
tokenizer never reads a stale entry. The directory is ``TOKENIZER_CACHE_DIR`` (engine/settings.py;
by default beside numba's kernel cache, whose directory is already versioned by the engine's
sources): on Lambda /tmp, shared across environments when set to an EFS path. An entry is a
pickle, like numba's own cache entries: the directory must be as trusted as the code. Written
atomically (temporary file, then rename), so concurrent writers on EFS never leave half a file;
an unreadable entry is a miss, rebuilt and rewritten.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from engine.gguf_file import StringArray

__all__ = ["cache_key", "load", "store"]

FORMAT = 1
_SCALARS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token")


@cache
def _code_digest() -> bytes:
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("tokenizer.py", "bpe.py", "tokenizer_cache.py"):
        h.update((here / name).read_bytes())
    return h.digest()


def cache_key(meta: Any) -> str | None:
    """The entry name for this metadata's tokenizer; None when its arrays are not the file's
    stored bytes (metadata built in memory: nothing cheap to key it by)."""
    tokens, merges = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.merges")
    if not isinstance(tokens, StringArray) or not isinstance(merges, StringArray):
        return None
    h = hashlib.sha256(f"warmllm-tokenizer-{FORMAT}".encode())
    h.update(_code_digest())
    for k in _SCALARS:
        h.update(repr((k, meta.get(k))).encode())
    h.update(tokens.raw())
    h.update(np.asarray(meta.get("tokenizer.ggml.token_type", ()), dtype=np.int64).tobytes())
    h.update(merges.raw())
    return h.hexdigest()[:40]


def load(directory: str, key: str) -> dict | None:
    """The stored state, or None (no entry, or one that cannot be read)."""
    try:
        with open(os.path.join(directory, key + ".pkl"), "rb") as f:
            state = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError):
        return None
    return state if isinstance(state, dict) and state.get("format") == FORMAT else None


def store(directory: str, key: str, state: dict) -> bool:
    """Write the entry (atomically); False when the directory cannot take it."""
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=key, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump({**state, "format": FORMAT}, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, os.path.join(directory, key + ".pkl"))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        return False
    return True
