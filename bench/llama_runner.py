"""Runs llama.cpp (llama-cpp-python) on a GGUF: the correctness oracle. Imported only when
`llama_cpp` is installed (make test-oracle / the fixture recorder)."""
from __future__ import annotations

import numpy as np


def open_llama(path: str, n_ctx: int = 1024, threads: int = 2, logits_all: bool = False):
    """`logits_all`: keep every position's logits (`llm.scores`), for perplexity and KL."""
    from llama_cpp import Llama

    kwargs = dict(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                  n_threads_batch=threads, verbose=False, logits_all=logits_all)
    # f32 KV cache: llama.cpp's default f16 cache would add its own rounding to the comparison
    for extra in ({"type_k": 0, "type_v": 0, "flash_attn": False}, {"type_k": 0, "type_v": 0}, {}):
        try:
            return Llama(**kwargs, **extra)
        except TypeError:
            continue
    raise RuntimeError("could not construct llama_cpp.Llama")


def tokenize(llm, texts: list[str]) -> list[list[int]]:
    return [llm.tokenize(t.encode("utf-8"), add_bos=True, special=True) for t in texts]


def logits_of(llm) -> np.ndarray:
    # With logits_all=False llama.cpp keeps only the last position's row; llama-cpp-python no
    # longer copies it into `scores`, so read it from the context.
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float32)


def last_logits(llm, prompt: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(prompt)
    return logits_of(llm)


def greedy(llm, prompt: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(prompt)
    return greedy_from_here(llm, n)


def greedy_from_here(llm, n: int) -> list[int]:
    """n greedy tokens from the context's current state (its last row of logits)."""
    out = []
    for _ in range(n):
        tok = int(np.argmax(logits_of(llm)))
        out.append(tok)
        llm.eval([tok])
    return out
