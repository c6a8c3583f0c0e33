"""`python -m engine bench --model M -p 512 -n 128 --json`: our speed on one GGUF.

Measures in one process: load + kernel warm-up (cold start), pp (batched prefill of p tokens),
tg (n decode steps), time to first token for a 421-token prompt, token-by-token prefill rate,
and peak RSS. Speed is a benchmark, never a test: `make bench` runs this beside llama.cpp.

`--depth N` (llama-bench's ``-d N``): pp and tg run after N tokens of context already in the
session (an agent's long conversation): pp extends the context by p tokens, tg decodes n tokens
after it. The context is prefilled once, untimed, and each measurement continues from a copy
of its state.
"""
from __future__ import annotations

import resource
import time

import numpy as np

from engine.settings import Settings
from engine.generate import Engine
from engine.quant import paths
from engine.session import Session

AGENT_PROMPT_TOKENS = 421


def _ids(n: int, vocab: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, min(vocab, 4000), n).tolist()


def _continuing(base: Session) -> Session:
    """A session holding what `base` holds, on its own copy of the state."""
    s = Session(base.model, base.prefill_chunk)
    s.tokens, s.state, s.last_logits = list(base.tokens), base.state.copy(), base.last_logits
    return s


def rate(tokens: int, seconds: float) -> float:
    """Tokens per second, rounded as the receipts give them."""
    return round(tokens / seconds, 2)


def run(model: str, p: int = 512, n: int = 128, threads: int | None = None, tbt: int = 32,
        extra_pp: tuple[int, ...] = (), repeat: int = 2, settings: Settings | None = None,
        ttft: bool = True, depth: int = 0) -> dict:
    """`repeat`: the short measurements (pp, TTFT, token-by-token) take the best of this many
    runs; a single prefill on a shared 2-core machine varied by 10-15 % between runs.
    `ttft=False` and `tbt=0` leave out the TTFT and token-by-token figures (`make bench
    --large`: on a 9B file at 2 threads each is minutes). `depth`: pp and tg after that many
    tokens of context (module doc)."""
    if depth < 0:
        raise ValueError(f"--depth must be >= 0, got {depth}")
    t0 = time.perf_counter()
    eng = Engine.load(model, threads=threads, settings=settings)
    ready_ms = (time.perf_counter() - t0) * 1e3
    vocab = eng.model.config.n_vocab
    out: dict = {"model": model, "threads": eng.threads, "load_ms": round(eng.load_ms, 1),
                 "compile_ms": round(eng.compile_ms, 1), "ready_ms": round(ready_ms, 1),
                 "target": paths.summary(), "kernels": eng.kernel_paths}

    context: Session | None = None
    if depth:
        t = time.perf_counter()
        context = Session(eng.model)
        context.prefill(_ids(depth, vocab, 7))
        out["depth"] = depth
        out["depth_prefill_s"] = round(time.perf_counter() - t, 3)

    def prefill_tok_s(count: int, seed: int) -> float:
        if context is None:
            s = Session(eng.model)
            t = time.perf_counter()
            s.prefill(_ids(count, vocab, seed))
            return count / (time.perf_counter() - t)
        s = _continuing(context)
        t = time.perf_counter()
        res = s.prefill(context.tokens + _ids(count, vocab, seed))
        elapsed = time.perf_counter() - t
        assert (res.mode, res.prefilled_tokens) == ("extend", count), (res.mode, res.prefilled_tokens)
        return count / elapsed

    # warm-up at the measured length, as llama-bench does (bench/llama_bench.py the same): the
    # first p-token prefill of a process also pays first-touch pages of its buffers, and make
    # bench measures each side once per process (a 64-token warm-up left ours at 246-292 tok/s
    # in two receipts against 314-322 for a warm prefill of the same build)
    prefill_tok_s(p, 99)
    out["pp_tokens"] = p
    out["pp_tok_s"] = round(max(prefill_tok_s(p, 1) for _ in range(repeat)), 2)
    for extra in extra_pp:
        out[f"pp{extra}_tok_s"] = round(prefill_tok_s(extra, 2), 2)

    def ttft_ms() -> float:
        s = Session(eng.model)
        t = time.perf_counter()
        int(np.argmax(s.prefill(_ids(AGENT_PROMPT_TOKENS, vocab, 3)).logits))
        return (time.perf_counter() - t) * 1e3

    if ttft:
        out["ttft_ms"] = round(min(ttft_ms() for _ in range(repeat)), 1)

    if context is None:
        s = Session(eng.model)
        logits = s.prefill(_ids(8, vocab, 4)).logits
    else:
        s = _continuing(context)
        assert context.last_logits is not None
        logits = context.last_logits
    out["tg_context_tokens"] = len(s.tokens)     # what the decode starts from
    t = time.perf_counter()
    for _ in range(n):
        logits = s.step(int(np.argmax(logits)))
    elapsed = time.perf_counter() - t
    out["tg_tokens"] = n
    out["tg_s"] = round(elapsed, 4)
    out["tg_tok_s"] = rate(n, elapsed)

    def token_by_token_tok_s() -> float:
        s = Session(eng.model)
        t = time.perf_counter()
        for tok in _ids(tbt, vocab, 5):
            s.step(tok)
        return tbt / (time.perf_counter() - t)

    if tbt > 0:
        out["token_by_token_prefill_tok_s"] = round(max(token_by_token_tok_s() for _ in range(repeat)), 2)
        out["batched_over_token_by_token"] = round(out["pp_tok_s"] / out["token_by_token_prefill_tok_s"], 2)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out
