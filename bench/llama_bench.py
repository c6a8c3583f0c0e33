"""llama.cpp's figures on the same GGUF and thread count, measured like engine.bench.

    python -m bench.llama_bench --model M --threads 2 -p 512 -n 128 --json
"""
from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from bench.llama_runner import logits_of

AGENT_PROMPT_TOKENS = 421


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, min(vocab, 4000), n).tolist()


def run(model: str, threads: int, p: int, n: int, extra_pp: tuple[int, ...], tbt: int = 32,
        repeat: int = 2, ttft: bool = True) -> dict:
    """The same measurements as `engine.bench.run`, best of `repeat` where it takes the best
    (`ttft=False`, `tbt=0`: without the TTFT and token-by-token figures, as there)."""
    from llama_cpp import Llama

    t0 = time.perf_counter()
    n_ctx = max((p, AGENT_PROMPT_TOKENS + 8, 8 + n, *extra_pp)) + 16
    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    out: dict = {"model": model, "threads": threads, "ready_ms": round((time.perf_counter() - t0) * 1e3, 1)}
    vocab = llm.n_vocab()

    def pp(count: int, seed: int) -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(_ids(count, seed, vocab))
        return count / (time.perf_counter() - t)

    pp(p, 99)  # warm-up at the measured length, as llama-bench does (and engine.bench)
    out["pp_tokens"] = p
    out["pp_tok_s"] = round(max(pp(p, 1) for _ in range(repeat)), 2)
    for extra in extra_pp:
        out[f"pp{extra}_tok_s"] = round(pp(extra, 2), 2)

    def ttft_ms() -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(_ids(AGENT_PROMPT_TOKENS, 3, vocab))
        int(np.argmax(logits_of(llm)))
        return (time.perf_counter() - t) * 1e3

    if ttft:
        out["ttft_ms"] = round(min(ttft_ms() for _ in range(repeat)), 1)

    llm.reset()
    llm.eval(_ids(8, 4, vocab))
    t = time.perf_counter()
    for _ in range(n):
        llm.eval([int(np.argmax(logits_of(llm)))])
    out["tg_tokens"] = n
    out["tg_tok_s"] = round(n / (time.perf_counter() - t), 2)

    def token_by_token_tok_s() -> float:
        llm.reset()
        t = time.perf_counter()
        for tok in _ids(tbt, 5, vocab):
            llm.eval([tok])
        return tbt / (time.perf_counter() - t)

    if tbt > 0:
        out["token_by_token_prefill_tok_s"] = round(max(token_by_token_tok_s() for _ in range(repeat)), 2)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--extra-pp", default="")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--tbt", type=int, default=32, help="token-by-token prefill tokens (0: skip)")
    ap.add_argument("--no-ttft", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    extra = tuple(int(x) for x in a.extra_pp.split(",") if x)
    print(json.dumps(run(a.model, a.threads, a.p, a.n, extra, tbt=a.tbt, repeat=a.repeat, ttft=not a.no_ttft)))


if __name__ == "__main__":
    main()
