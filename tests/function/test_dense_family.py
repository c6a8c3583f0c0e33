"""The dense Qwen2 / Qwen3 family through the engine and the handler (engine/models/qwen2.py),
on the factory's random tiny-qwen2 model: its chat conventions come from its file (Hermes JSON tool
calls, no reasoning block: its template never closes one), its history renders with tool calls and
results, forced and auto tool calls come back as OpenAI tool_calls, the warm session extends
turn 1 for turn 2, and the request log names the prefill path as for the hybrid."""
from __future__ import annotations

import json

import jsonschema
import pytest

from engine.generate import Engine
from tests.function.test_constrained_outputs import TOOLS, ask, tool_answer
from tests.function.warm import warm_runtime


@pytest.fixture(scope="module")
def dense_path(model_factory):
    return model_factory("tiny-qwen2", "Q4_K_M", 0)


@pytest.fixture(scope="module")
def rt(dense_path):
    return warm_runtime(dense_path)


def test_conventions_come_from_the_file(dense_path, model_factory):
    eng = Engine.load(str(dense_path), warm_up=False)
    c = eng.conventions
    assert (c.tool_syntax, c.tool_call_open, c.reasons) == ("json", "<tool_call>", False)
    hybrid = Engine.load(str(model_factory("tiny", "F32", 0)), warm_up=False).conventions
    assert (hybrid.tool_syntax, hybrid.think_close) == ("xml", "</think>")


def test_history_with_tool_calls_renders_hermes_json(rt):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Oslo", "days": 2}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny, 3 C"},
            {"role": "user", "content": "Thanks <think>x</think>"}]
    p = rt.engine.chat_prompt(msgs, tools=TOOLS)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>' in p.text
    assert "<tool_response>\nsunny, 3 C\n</tool_response>" in p.text
    assert p.text.endswith("<|im_start|>assistant\n") and not p.opens_reasoning
    # the user's <think> stays text: no marker token for it in the ids
    think = rt.engine.tokenizer.token_id("<think>")
    assert think is not None and think not in p.ids


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_come_back_as_tool_calls(rt, stream):
    # one call (parallel off): parallel calls of a random model may run on to max_tokens (`length`)
    b = ask(rt, tools=TOOLS, tool_choice="required", max_tokens=160, stream=stream, parallel_tool_calls=False)
    _, calls, finish = tool_answer(b, stream)
    if not stream:
        assert b["choices"][0]["message"].get("reasoning_content") is None
    assert calls and finish == "tool_calls"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for c in calls:
        jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])


def test_auto_tool_choice_constrains_a_call_the_model_opens(rt):
    open_id = rt.engine.tokenizer.token_id("<tool_call>")
    b = ask(rt, tools=TOOLS, tool_choice="auto", max_tokens=160, logit_bias={str(open_id): 100},
            parallel_tool_calls=False)
    calls = b["choices"][0]["message"].get("tool_calls")
    assert calls and b["choices"][0]["finish_reason"] == "tool_calls", b["choices"][0]["message"]


def test_turn_two_extends_turn_one(rt):
    turn1 = [{"role": "user", "content": "Say something."}]
    b1 = ask(rt, messages=turn1, max_tokens=6, temperature=0)
    reply = b1["choices"][0]["message"]["content"]
    p1 = rt.engine.session.tokens[:]
    turn2 = turn1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "More."}]
    prompt2 = rt.engine.chat_prompt(turn2)
    r = rt.engine.session.prefill(prompt2.ids, prompt2.boundaries)
    # the held prompt and reply tokens are spliced in (engine/generate.py), so the whole of them is reused
    assert (r.mode, r.reused_tokens, prompt2.spliced_tokens) == ("extend", len(p1), len(p1))
    assert r.prefilled_tokens == len(prompt2.ids) - len(p1)
