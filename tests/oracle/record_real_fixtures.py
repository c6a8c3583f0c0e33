"""Record llama.cpp on the real model (make real-model) as committed fixtures, and print the full
fidelity figures.

    .venv/bin/python -m tests.oracle.record_real_fixtures [--figures | --figures-only]   (needs llama_cpp)

Writes tests/fixtures/oracle/real-qwen2.5-coder-0.5b.npz: for each text of REAL_TEXTS, the first
SLICE_CHUNKS chunks of SLICE_CTX tokens as llama-perplexity cuts them (engine/perplexity.py), per
scored position llama.cpp's top-TOP_K logits and their ids, its log-sum-exp and the log-probability
of the token that follows; and for each of GREEDY_QUESTIONS, the chat prompt's token ids and
llama.cpp's greedy GREEDY_TOKENS-token continuation. Full rows are 151,936 floats: top-k plus the
log-sum-exp keeps a few hundred KB.

`--figures` also computes, on the whole texts at ctx 512, llama.cpp's and our perplexity, the
mean KL divergence (llama.cpp ‖ ours, full rows) and the greedy agreement: the numbers
docs/formats.md quotes.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from bench import llama_runner
from engine.perplexity import chunk_nll, chunks_of, log_softmax_at
from function.real_model import DEFAULT_OUT, SHA256

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "oracle" / "real-qwen2.5-coder-0.5b.npz"
TEXTS = ROOT / "tests" / "fixtures" / "text"
# English prose (the Apache License 2.0, the upstream model's licence) and Python source (two of
# our own modules as they were when recorded)
REAL_TEXTS = {"prose": "apache-2.0.txt", "python": "python-source.txt"}
SLICE_CTX, SLICE_CHUNKS, TOP_K = 256, 2, 64
GREEDY_TOKENS = 64
GREEDY_QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What does the `yield` keyword do in Python? Answer in two sentences.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a SQL query that returns the ten most recent orders from a table named orders.",
    "How do I reverse a linked list? Give the idea, then code in C.",
    "What is the time complexity of binary search, and why?",
    "Write a bash one-liner that counts the lines of every .py file in a directory.",
    "Explain what a race condition is with a short example.",
    "Write a JavaScript function that debounces another function.",
    "What is the capital of France, and what river runs through it?",
]


def text_ids(tok, name: str) -> list[int]:
    """The text tokenized as llama-perplexity does it (engine/perplexity.py, step 1)."""
    text = (TEXTS / name).read_text(encoding="utf-8")
    return tok.encode(text, parse_special=False, add_special=True)


def question_ids(eng, question: str) -> list[int]:
    return eng.chat_prompt([{"role": "user", "content": question}]).ids


def llama_rows(llm, chunk: np.ndarray) -> np.ndarray:
    """llama.cpp's logits of every position of one chunk, from an empty KV cache."""
    llm.reset()
    llm.eval(chunk.tolist())
    return np.array(llm.scores[:chunk.size], dtype=np.float32)


def top_k(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, values, log-sum-exp) of each row's k largest logits."""
    ids = np.argpartition(-rows, k, axis=1)[:, :k]
    vals = np.take_along_axis(rows, ids, axis=1)
    order = np.argsort(-vals, axis=1)
    ids, vals = np.take_along_axis(ids, order, axis=1), np.take_along_axis(vals, order, axis=1)
    r64 = rows.astype(np.float64)
    m = r64.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(r64 - m).sum(axis=1))
    return ids.astype(np.int32), vals.astype(np.float32), lse


def kl_full(p_rows: np.ndarray, q_rows: np.ndarray) -> np.ndarray:
    """KL(p ‖ q) per row from full logit rows (float64)."""
    out = np.empty(p_rows.shape[0])
    for i in range(p_rows.shape[0]):
        lp = p_rows[i].astype(np.float64)
        lq = q_rows[i].astype(np.float64)
        lp = lp - (lp.max() + np.log(np.exp(lp - lp.max()).sum()))
        lq = lq - (lq.max() + np.log(np.exp(lq - lq.max()).sum()))
        out[i] = float(np.sum(np.exp(lp) * (lp - lq)))
    return out


def llama_rows_one_by_one(llm, chunk: np.ndarray) -> np.ndarray:
    """llama.cpp's logits of one chunk run a token at a time (its decode path): how far llama.cpp
    is from itself, the floor any other implementation is measured against."""
    llm.reset()
    for t in chunk.tolist():
        llm.eval([t])
    return np.array(llm.scores[:chunk.size], dtype=np.float32)


def greedy_one_by_one(llm, prompt: list[int], n: int) -> list[int]:
    """llama.cpp's greedy continuation after a prompt fed a token at a time."""
    llm.reset()
    for t in prompt:
        llm.eval([t])
    return llama_runner.greedy_from_here(llm, n)


def prefix_agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Tokens before the first difference, over all tokens (greedy continuations part for good
    at the first one)."""
    same = sum(next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), len(p)) for p, q in zip(a, b))
    return same / sum(len(p) for p in a)


def record(llm, llm_all, eng) -> Path:
    tok = eng.tokenizer
    data: dict[str, np.ndarray] = {}
    for key, name in REAL_TEXTS.items():
        chunks = chunks_of(text_ids(tok, name), SLICE_CTX, None)[:SLICE_CHUNKS]
        ids, vals, lses, target_lp, targets, self_kl, self_lp = [], [], [], [], [], [], []
        for chunk in chunks:
            rows = llama_rows(llm_all, chunk)
            first = SLICE_CTX // 2
            scored = rows[first:SLICE_CTX - 1]
            nxt = chunk[first + 1:SLICE_CTX]
            one = llama_rows_one_by_one(llm_all, chunk)[first:SLICE_CTX - 1]
            self_kl.append(kl_full(scored, one))
            self_lp.append(log_softmax_at(one, nxt))
            i, v, lse = top_k(scored, TOP_K)
            ids.append(i)
            vals.append(v)
            lses.append(lse)
            target_lp.append(log_softmax_at(scored, nxt))
            targets.append(nxt)
        data[f"{key}_chunks"] = np.stack(chunks).astype(np.int32)
        data[f"{key}_topk_ids"] = np.concatenate(ids)
        data[f"{key}_topk_logits"] = np.concatenate(vals)
        data[f"{key}_lse"] = np.concatenate(lses)
        data[f"{key}_target_logp"] = np.concatenate(target_lp)
        # llama.cpp against itself (decode path vs batched prefill) on the same positions
        data[f"{key}_self_kl"] = np.concatenate(self_kl)
        data[f"{key}_self_target_logp"] = np.concatenate(self_lp)
    prompts = [question_ids(eng, q) for q in GREEDY_QUESTIONS]
    greedy = [llama_runner.greedy(llm, p, GREEDY_TOKENS) for p in prompts]
    data["greedy_prompts"] = np.array(json.dumps(prompts))
    data["greedy"] = np.array(greedy, dtype=np.int32)
    data["greedy_self"] = np.array([greedy_one_by_one(llm, p, GREEDY_TOKENS) for p in prompts], dtype=np.int32)
    data["meta"] = np.array(json.dumps({"model_sha256": SHA256, "slice_ctx": SLICE_CTX, "top_k": TOP_K,
                                        "texts": {k: hashlib.sha256((TEXTS / n).read_bytes()).hexdigest()
                                                  for k, n in REAL_TEXTS.items()}}))
    np.savez_compressed(OUT, **data)
    return OUT


def figures(llm, llm_all, eng, ctx: int = 512) -> dict:
    """Whole-text perplexity both ways, mean KL(llama.cpp ‖ ours), greedy agreement."""
    out: dict = {}
    for key, name in REAL_TEXTS.items():
        theirs_nll, ours_nll, kls = [], [], []
        chunks = chunks_of(text_ids(eng.tokenizer, name), ctx, None)
        for chunk in chunks:
            theirs = llama_rows(llm_all, chunk)
            ours = eng.model.forward(chunk, eng.model.new_state(), logits="all")
            theirs_nll.append(chunk_nll(theirs, chunk))
            ours_nll.append(chunk_nll(ours, chunk))
            first = ctx // 2
            kls.append(kl_full(theirs[first:ctx - 1], ours[first:ctx - 1]))
        t, o, k = np.concatenate(theirs_nll), np.concatenate(ours_nll), np.concatenate(kls)
        out[key] = {"chunks": len(chunks), "scored": int(t.size), "ppl_llama_cpp": float(np.exp(t.mean())),
                    "ppl_ours": float(np.exp(o.mean())),
                    "ppl_rel_diff": float(abs(np.exp(o.mean()) - np.exp(t.mean())) / np.exp(t.mean())),
                    "kl_mean": float(k.mean()), "kl_max": float(k.max())}
    from tests.parity import our_greedy

    prompts = [question_ids(eng, q) for q in GREEDY_QUESTIONS]
    theirs = [llama_runner.greedy(llm, p, GREEDY_TOKENS) for p in prompts]
    out["greedy_prefix_agreement"] = prefix_agreement(theirs, [our_greedy(eng, p, GREEDY_TOKENS) for p in prompts])
    out["greedy_llama_cpp_self_agreement"] = prefix_agreement(
        theirs, [greedy_one_by_one(llm, p, GREEDY_TOKENS) for p in prompts])
    return out


def self_figures(llm_all, eng, ctx: int = 512) -> dict:
    """llama.cpp against itself on the whole texts: its decode path (a token at a time) vs its
    batched prefill, perplexity and mean KL: the floor any other implementation meets."""
    out: dict = {}
    for key, name in REAL_TEXTS.items():
        batch_nll, one_nll, kls = [], [], []
        for chunk in chunks_of(text_ids(eng.tokenizer, name), ctx, None):
            batch = llama_rows(llm_all, chunk)
            one = llama_rows_one_by_one(llm_all, chunk)
            batch_nll.append(chunk_nll(batch, chunk))
            one_nll.append(chunk_nll(one, chunk))
            kls.append(kl_full(batch[ctx // 2:ctx - 1], one[ctx // 2:ctx - 1]))
        b, o = np.exp(np.concatenate(batch_nll).mean()), np.exp(np.concatenate(one_nll).mean())
        out[key] = {"ppl_batch": float(b), "ppl_one_by_one": float(o), "ppl_rel_diff": float(abs(o - b) / b),
                    "kl_mean": float(np.concatenate(kls).mean())}
    return out


def main(argv: list[str]) -> int:
    from engine.generate import Engine

    eng = Engine.load(DEFAULT_OUT, warm_up=False)
    # two contexts: llama_runner.greedy reads the last row of a context that keeps one
    llm = llama_runner.open_llama(DEFAULT_OUT, n_ctx=1024)
    llm_all = llama_runner.open_llama(DEFAULT_OUT, n_ctx=512, logits_all=True)
    if "--figures-only" not in argv:
        print(record(llm, llm_all, eng), file=sys.stderr)
    if "--figures" in argv or "--figures-only" in argv:
        print(json.dumps({"ours_vs_llama_cpp": figures(llm, llm_all, eng),
                          "llama_cpp_vs_itself": self_figures(llm_all, eng)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
