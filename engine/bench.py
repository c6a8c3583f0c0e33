"""`python -m engine bench --model M -p 512 -n 128 --json`: our speed on one GGUF.

Measures in one process: load + kernel warm-up (cold start), pp (batched prefill of p tokens),
tg (n decode steps), time to first token for a 421-token prompt, token-by-token prefill rate,
and peak RSS. Speed is a benchmark, never a test: `make bench` runs this beside llama.cpp.
"""
from __future__ import annotations

import resource
import time

import numpy as np

from engine.generate import Engine
from engine.session import Session

AGENT_PROMPT_TOKENS = 421


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, min(vocab, 4000), n).tolist()


def run(model: str, p: int = 512, n: int = 128, threads: int | None = None, tbt: int = 32,
        extra_pp: tuple[int, ...] = ()) -> dict:
    t0 = time.perf_counter()
    eng = Engine.load(model, threads=threads)
    ready_ms = (time.perf_counter() - t0) * 1e3
    vocab = eng.model.config.n_vocab
    out: dict = {"model": model, "threads": eng.threads, "load_ms": round(eng.load_ms, 1),
                 "compile_ms": round(eng.compile_ms, 1), "ready_ms": round(ready_ms, 1)}

    def prefill_tok_s(count: int, seed: int) -> float:
        s = Session(eng.model)
        t = time.perf_counter()
        s.prefill(_ids(count, vocab, seed))
        return count / (time.perf_counter() - t)

    prefill_tok_s(64, 99)  # warm caches and BLAS threads once
    out["pp_tokens"] = p
    out["pp_tok_s"] = round(prefill_tok_s(p, 1), 2)
    for extra in extra_pp:
        out[f"pp{extra}_tok_s"] = round(prefill_tok_s(extra, 2), 2)

    s = Session(eng.model)
    t = time.perf_counter()
    logits = s.prefill(_ids(AGENT_PROMPT_TOKENS, vocab, 3)).logits
    int(np.argmax(logits))
    out["ttft_ms"] = round((time.perf_counter() - t) * 1e3, 1)

    s = Session(eng.model)
    logits = s.prefill(_ids(8, vocab, 4)).logits
    t = time.perf_counter()
    for _ in range(n):
        logits = s.step(int(np.argmax(logits)))
    out["tg_tokens"] = n
    out["tg_tok_s"] = round(n / (time.perf_counter() - t), 2)

    s = Session(eng.model)
    ids = _ids(tbt, vocab, 5)
    t = time.perf_counter()
    for tok in ids:
        s.step(tok)
    out["token_by_token_prefill_tok_s"] = round(tbt / (time.perf_counter() - t), 2)
    out["batched_over_token_by_token"] = round(out["pp_tok_s"] / out["token_by_token_prefill_tok_s"], 2)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out
