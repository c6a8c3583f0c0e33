"""The cost of constrained decoding (issue 17): decode tok/s with a JSON schema vs unconstrained on
the same model and prompt, grammar compile time for a typical tool list, and the one-off build of
llguidance's token trie for the vocabulary.

    python -m bench.constrained --model models/0.8b-Q4_K_M-qwen35.gguf [--tokens 64] [--rounds 3]

Use a model built with the real vocabulary (``make-model --vocab qwen35``): the factory
vocabulary is 2k learned tokens and ~246k fillers, which would make the mask look free. Both runs
ban end-of-generation (logit_bias -100) so each decodes exactly ``--tokens`` tokens; the schema is
an array of many strings, so the grammar never completes first. With a family that reasons, a third
kind asks the same with thinking on (the reply reasons under the reasoning mask, at most half the
tokens, then answers under the schema's). Rounds alternate the kinds; the best round of each is
reported (the machine may be shared). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"},
                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                          "days": {"type": "integer", "minimum": 1, "maximum": 14}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_web", "description": "Search the web",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"},
                                          "top_k": {"type": "integer", "minimum": 1, "maximum": 20},
                                          "site": {"type": ["string", "null"]}},
                                          "required": ["query"]}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string", "pattern": "^/.*$"},
                                          "offset": {"type": "integer", "minimum": 0},
                                          "limit": {"type": "integer", "minimum": 1}},
                                          "required": ["path"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Write a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "content": {"type": "string"},
                                          "mode": {"enum": ["overwrite", "append"]}},
                                          "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "create_event", "description": "Add a calendar event",
                                      "parameters": {"type": "object", "properties": {
                                          "title": {"type": "string", "maxLength": 100},
                                          "start": {"type": "string", "format": "date-time"},
                                          "attendees": {"type": "array", "items": {"type": "string"}},
                                          "reminder": {"type": "object", "properties": {
                                              "minutes": {"type": "integer"}, "method": {"enum": ["email", "popup"]}}}},
                                          "required": ["title", "start"]}}},
]
SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 500}},
          "required": ["items"], "additionalProperties": False}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)

    from engine import constraints as C
    from engine.generate import Engine
    from engine.sampling import SamplingParams
    from engine.settings import Settings

    eng = Engine.load(a.model, threads=a.threads, settings=Settings.from_env(os.environ))
    tok = eng.tokenizer
    t0 = time.perf_counter()
    C.grammar_tokenizer(tok)
    trie_ms = (time.perf_counter() - t0) * 1e3

    spec = C.tool_call_grammar(TOOLS, eng.conventions)
    t0 = time.perf_counter()
    C.compile_grammar(spec, tok)
    tools_compile_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    C.compile_grammar(C.tool_call_grammar(TOOLS, eng.conventions), tok)
    tools_cached_ms = (time.perf_counter() - t0) * 1e3
    schema_spec = C.json_schema_grammar(SCHEMA)
    t0 = time.perf_counter()
    C.compile_grammar(schema_spec, tok)
    schema_compile_ms = (time.perf_counter() - t0) * 1e3

    no_eog = SamplingParams(temperature=0.0, logit_bias={int(i): -100.0 for i in tok.eog_ids})
    ask = [{"role": "user", "content": "List some fruits as JSON."}]
    prompts = {False: eng.chat_prompt(ask, enable_thinking=False)}
    # thinking on: the reply reasons (end-of-generation and the marker crossers masked, half the
    # tokens at most: engine/reasoning.py), then the schema's mask runs
    thinking = eng.conventions.reasons and eng.chat_prompt(ask).opens_reasoning
    if thinking:
        prompts[True] = eng.chat_prompt(ask)
    kinds = [("free", None, False), ("json_schema", schema_spec, False)]
    kinds += [("json_schema_thinking", schema_spec, True)] if thinking else []
    rounds: list[dict] = []
    for _ in range(a.rounds):
        for kind, grammar, think in kinds:
            prompt = prompts[think]
            eng.session.reset()
            r = eng.generate(prompt, max_tokens=a.tokens, sampling=no_eog, grammar=grammar)
            rounds.append({"kind": kind, "tokens": r.completion_tokens, "decode_ms": round(r.decode_ms, 2),
                           "tok_s": round(r.completion_tokens / r.decode_ms * 1e3, 3),
                           "mask_ms": round(r.grammar_timings.get("mask_ms", 0.0), 2),
                           "masked_steps": int(r.grammar_timings.get("masked_steps", 0))})
    best = {k: max((x for x in rounds if x["kind"] == k), key=lambda x: x["tok_s"]) for k, _, _ in kinds}
    out = {"model": a.model, "n_vocab": tok.n_vocab, "threads": eng.threads, "tokens": a.tokens,
           "trie_build_ms": round(trie_ms, 1), "tools": len(TOOLS), "tools_compile_ms": round(tools_compile_ms, 2),
           "tools_compile_cached_ms": round(tools_cached_ms, 3), "schema_compile_ms": round(schema_compile_ms, 2),
           "free_tok_s": best["free"]["tok_s"], "json_schema_tok_s": best["json_schema"]["tok_s"],
           "ratio": round(best["json_schema"]["tok_s"] / best["free"]["tok_s"], 3),
           "mask_ms_per_token": round(best["json_schema"]["mask_ms"] / max(1, best["json_schema"]["tokens"]), 3),
           "rounds": rounds}
    if thinking:
        out["json_schema_thinking_tok_s"] = best["json_schema_thinking"]["tok_s"]
        out["thinking_ratio"] = round(best["json_schema_thinking"]["tok_s"] / best["free"]["tok_s"], 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
