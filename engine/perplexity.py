"""Perplexity computed the way llama.cpp's `llama-perplexity` computes it.

    python -m engine perplexity --model M --file TEXT --ctx 512 [--json]

The method (llama.cpp tools/perplexity, `perplexity()`):
1. The whole text is tokenized once, special-token text left as text, BOS prepended only when
   the vocabulary adds one (`tokenizer.ggml.add_bos_token`; Qwen's files do not).
2. It is cut into n_chunk = n_tokens // ctx chunks of ctx tokens; the tail is dropped. At least
   2·ctx tokens are needed (llama-perplexity's rule). With BOS on, each chunk's first token is
   replaced by BOS.
3. Each chunk runs from an empty state as one batch, every position's logits kept.
4. Only the second half is scored, so every scored token has at least ctx/2 tokens of context:
   positions first = ctx/2 … ctx-2 predict the token after them, contributing
   -log softmax(logits)[next] (log-sum-exp in float64). count = n_chunk · (ctx - 1 - first).
5. ppl = exp(Σ nll / count).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from engine.models import LanguageModel

__all__ = ["PerplexityResult", "chunk_nll", "log_softmax_at", "perplexity"]


@dataclass(frozen=True)
class PerplexityResult:
    ppl: float
    nll: float        # mean negative log-likelihood of the scored tokens, nats
    tokens: int       # tokens of the text
    scored: int       # tokens scored (count)
    chunks: int
    ctx: int
    seconds: float

    def to_json(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def log_softmax_at(logits: np.ndarray, targets: np.ndarray, block: int = 32) -> np.ndarray:
    """log p(target) under softmax(logits) per row: logits (T, V), targets (T,); float64, in
    blocks of rows (a 152k vocabulary is 1.2 MB a row in float64)."""
    out = np.empty(logits.shape[0], dtype=np.float64)
    for r in range(0, logits.shape[0], block):
        rows = logits[r:r + block].astype(np.float64)
        m = rows.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(rows - m).sum(axis=1))
        out[r:r + block] = rows[np.arange(rows.shape[0]), targets[r:r + block]] - lse
    return out


def chunks_of(ids: Sequence[int], ctx: int, bos_id: int | None) -> list[np.ndarray]:
    """The chunks llama-perplexity scores (step 2 above)."""
    if ctx < 4:
        raise ValueError(f"--ctx {ctx}: give at least 4 tokens of context")
    if len(ids) < 2 * ctx:
        raise ValueError(f"the text has {len(ids)} tokens; perplexity with a context of {ctx} needs at least "
                         f"{2 * ctx} (llama-perplexity's rule): give a longer --file or a smaller --ctx")
    out = []
    for c in range(len(ids) // ctx):
        chunk = np.asarray(ids[c * ctx:(c + 1) * ctx], dtype=np.int64).copy()
        if bos_id is not None:
            chunk[0] = bos_id
        out.append(chunk)
    return out


def chunk_nll(logits: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """-log p of each scored token of one chunk from its (ctx, V) logits (step 4)."""
    ctx = chunk.size
    first = ctx // 2
    return -log_softmax_at(logits[first:ctx - 1], chunk[first + 1:ctx])


def perplexity(model: LanguageModel, ids: Sequence[int], ctx: int, *, bos_id: int | None = None,
               progress: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """Perplexity of the token ids `ids` (the whole text, tokenized as step 1 says) over chunks
    of `ctx` tokens. `progress(chunk, n_chunk, running ppl)` after each chunk."""
    t0 = time.perf_counter()
    chunks = chunks_of(ids, ctx, bos_id)
    total, count = 0.0, 0
    for i, chunk in enumerate(chunks):
        logits = model.forward(chunk, model.new_state(), logits="all")
        assert logits is not None
        nll = chunk_nll(logits, chunk)
        total += float(nll.sum())
        count += nll.size
        if progress is not None:
            progress(i + 1, len(chunks), math.exp(total / count))
    mean = total / count
    return PerplexityResult(math.exp(mean), mean, len(ids), count, len(chunks), ctx, time.perf_counter() - t0)
