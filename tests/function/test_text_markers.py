"""Issue 52 (2): a GGUF whose vocabulary has no token for ``<tool_call>`` or ``</think>`` (the
factory's ``text-markers`` vocabulary, as llama.cpp's converter makes of a tokenizer that never
added them). Its template writes the same markers as text; forced and auto tool calls and
thinking-on schemas are enforced as text, never a 400 for an unknown special token."""
from __future__ import annotations

import json

import jsonschema
import pytest

from engine import markers

from tests.function.test_constrained_outputs import TOOLS, ask, tool_answer
from tests.function.warm import warm_runtime


@pytest.fixture(scope="module")
def rt(model_factory):
    return warm_runtime(model_factory("tiny", "F32", 0, vocab="text-markers"))


def test_the_marker_tables_are_built_before_the_first_request(model_factory):
    # a fresh runtime, no request yet: its init built the grammar trie and the tables the mask
    # reads for text markers (~50 ms each on Qwen3.5's vocabulary, else paid by a first request)
    fresh = warm_runtime(model_factory("tiny", "F32", 0, vocab="text-markers"))
    tables = markers._TABLES.get(fresh.engine.tokenizer, {})
    assert ("</think>", True) in tables and ("<tool_call>", False) in tables, sorted(tables)


def test_the_vocabulary_has_no_marker_tokens(rt):
    tok = rt.engine.tokenizer
    assert all(tok.token_id(m) is None for m in ("<tool_call>", "</tool_call>", "<think>", "</think>"))
    assert rt.engine.conventions.reasons            # the template still reasons, in text
    assert rt.engine.chat_prompt([{"role": "user", "content": "hi"}]).opens_reasoning


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice,thinking", [("required", False), ("named", False), ("named", True)])
def test_forced_tool_calls_are_enforced_as_text(rt, choice, thinking, stream):
    tool_choice = {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else "required"
    b = ask(rt, tools=TOOLS, tool_choice=tool_choice, max_tokens=240, stream=stream, parallel_tool_calls=False,
            **({} if thinking else {"reasoning_effort": "none"}))
    assert not (isinstance(b, dict) and "error" in b), b
    _, calls, finish = tool_answer(b, stream)
    assert calls and finish == "tool_calls", b
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in calls:
        assert choice == "required" or c["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])


def test_a_json_schema_after_text_reasoning(rt):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for seed in range(3):
        b = ask(rt, response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
                max_tokens=60, seed=seed)
        msg = b["choices"][0]["message"]
        assert b["choices"][0]["finish_reason"] == "stop"
        assert json.loads(msg["content"]) in ({"ok": True}, {"ok": False}), msg
