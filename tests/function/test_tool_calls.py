"""Qwen3.5 XML tool calls and <think> reasoning → OpenAI message parts."""
from __future__ import annotations

import json

import pytest

from engine.conventions import ChatConventions
from engine.models.qwen35 import CONVENTIONS as QWEN35
from engine.reasoning import split_reasoning
from function.tool_calls import coerce, parse_output, parse_tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "lat": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"},
    "maybe": {"type": ["integer", "null"]}}}}},
    {"type": "function", "function": {"name": "noop"}}]


def call(name, **params):
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


def test_one_call_typed_by_schema():
    text = "Let me check.\n" + call("get_weather", city="Paris", days="3", metric="true", lat="48.85",
                                    tags='["a", "b"]', opts='{"x": 1}', maybe="null")
    content, calls = parse_tool_calls(text, TOOLS, QWEN35)
    assert content == "Let me check."
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    args = json.loads(calls[0]["function"]["arguments"])
    assert args == {"city": "Paris", "days": 3, "metric": True, "lat": 48.85, "tags": ["a", "b"], "opts": {"x": 1},
                    "maybe": None}
    assert isinstance(calls[0]["function"]["arguments"], str)


def test_string_values_stay_verbatim_even_if_they_look_like_json():
    _, calls = parse_tool_calls(call("get_weather", city="123"), TOOLS, QWEN35)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "123"}
    _, calls = parse_tool_calls(call("get_weather", city="two\nlines"), TOOLS, QWEN35)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "two\nlines"}


def test_parallel_calls_and_no_parameters():
    text = call("get_weather", city="A") + "\n" + call("noop")
    content, calls = parse_tool_calls(text, TOOLS, QWEN35)
    assert content == "" and [c["function"]["name"] for c in calls] == ["get_weather", "noop"]
    assert json.loads(calls[1]["function"]["arguments"]) == {}
    assert calls[0]["id"] != calls[1]["id"]


@pytest.mark.parametrize("text", [
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",           # cut off
    "<tool_call>\n<function=unknown_fn>\n</function>\n</tool_call>",                        # undeclared
    "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>",                                 # JSON form
    "<tool_call>\n<function=get_weather>\nstray<parameter=city>\nP\n</parameter>\n</function>\n</tool_call>",
])
def test_malformed_calls_stay_as_text(text):
    content, calls = parse_tool_calls(text, TOOLS, QWEN35)
    assert calls == [] and content == text


def test_wrongly_typed_values_fall_back_to_the_string():
    assert coerce("three", {"type": "integer"}) == "three"
    assert coerce("3.5", {"type": "integer"}) == "3.5"
    assert coerce("3.0", {"type": "integer"}) == 3
    assert coerce("[1]", None) == [1] and coerce("plain", None) == "plain"
    assert coerce("x", {"anyOf": [{"type": "integer"}, {"type": "string"}]}) == "x"
    assert coerce("5", {"anyOf": [{"type": "integer"}, {"type": "string"}]}) == 5


@pytest.mark.parametrize("text,opened,reasoning,rest,still_open", [
    ("<think>\nplan\n</think>\n\nAnswer", False, "plan", "Answer", False),
    ("\n<think>plan</think>Answer", False, "plan", "Answer", False),
    ("plan\n</think>\n\nAnswer", True, "plan", "Answer", False),
    ("still thinking", True, "still thinking", "", True),
    ("no tags", False, None, "no tags", False),
    ("<think>\n\n</think>\n\nAnswer", False, None, "Answer", False),
    ("<think>cut", False, "cut", "", True),
    # the model thinks inside the block the prompt opened: a <think> in it is reasoning text
    ("a\n<think>b</think>c", True, "a\n<think>b", "c", False),
    # no block opened by the prompt or at the reply's start: all of it is the answer (the mask
    # shaped it from its first token, so a marker inside it is text)
    ("plan\n</think>\n\nAnswer", False, None, "plan\n</think>\n\nAnswer", False),
    ('{"a": "</think>"}', False, None, '{"a": "</think>"}', False),
    ("Sure. <think>x</think> y", False, None, "Sure. <think>x</think> y", False),
])
def test_reasoning_split(text, opened, reasoning, rest, still_open):
    split = split_reasoning(text, QWEN35, opened)
    assert (split.reasoning, split.content, split.open) == (reasoning, rest, still_open)


def test_reasoning_then_tool_call():
    out = parse_output("<think>need weather</think>\n" + call("get_weather", city="Oslo"), tools=TOOLS, conventions=QWEN35)
    assert out.reasoning == "need weather" and out.content == ""
    assert json.loads(out.tool_calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    # tools not offered (tool_choice none): the XML stays as content
    out = parse_output(call("get_weather", city="Oslo"), tools=None, conventions=QWEN35)
    assert out.tool_calls == [] and "<tool_call>" in out.content


# ---- Hermes JSON tool calls and no reasoning (Qwen2.5's conventions) ----------------------------

HERMES = ChatConventions("test-hermes", "json", think_open=None, think_close=None)


def hermes(name, args, *, as_string=False):
    a = json.dumps(json.dumps(args)) if as_string else json.dumps(args)
    return f'<tool_call>\n{{"name": "{name}", "arguments": {a}}}\n</tool_call>'


def test_hermes_calls_parse_and_unknown_or_malformed_blocks_stay_text():
    text = "On it.\n" + hermes("get_weather", {"city": "Oslo", "days": 3}) + "\n" + \
        hermes("noop", {}, as_string=True)
    content, calls = parse_tool_calls(text, TOOLS, HERMES)
    assert content == "On it."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "noop"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 3}
    assert json.loads(calls[1]["function"]["arguments"]) == {}
    for bad in (hermes("launch", {"x": 1}),                                  # not declared
                '<tool_call>\n{"name": "noop", "arguments": [1]}\n</tool_call>',   # arguments not an object
                '<tool_call>\n{"name": "noop", "arguments": {}, "x": 1}\n</tool_call>',  # stray key
                '<tool_call>\n{"name": "noop", "arguments": {\n</tool_call>',    # not JSON
                '<tool_call>\n{"name": "noop", "arguments": {"a": 1e999}}\n</tool_call>'):  # not finite
        assert parse_tool_calls(bad, TOOLS, HERMES) == (bad, [])
    # the XML syntax is not read under the JSON conventions, nor JSON under the XML ones
    assert parse_tool_calls(call("noop"), TOOLS, HERMES)[1] == []
    assert parse_tool_calls(hermes("noop", {}), TOOLS, QWEN35)[1] == []


def test_a_family_without_reasoning_keeps_think_tags_as_content():
    out = parse_output("<think>x</think>\nAnswer", tools=None, conventions=HERMES, prompt_opens_think=True)
    assert out.reasoning is None and out.content == "<think>x</think>\nAnswer"
