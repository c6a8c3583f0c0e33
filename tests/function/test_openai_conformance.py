"""Issue 52 (5): the OpenAI conformance suite, with the official ``openai`` client.

Against ``make serve`` (``python -m function.serve`` in a process of its own) and the same server
around a warm Runtime in this process, on three models: the factory's tiny model, the tiny shape
with Qwen3.5's real 248k vocabulary, and the real trained model when ``make real-model`` has
fetched it. Each checks what an OpenAI client relies on: chat and its stream saying the same thing
(reasoning apart), a strict ``json_schema`` answer with thinking on and off, tool calls with
``tool_choice`` auto / required / named / none, ``parallel_tool_calls`` on and off, streamed as
``delta.tool_calls[i]`` pieces. Random weights mean noise picks every free token: what comes back
valid comes back valid because of the mask."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.function.test_real_model import REAL
from tests.function.warm import start_serve, stop_serve, warm_runtime

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 12},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 10}},
          "required": ["answer", "score"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "minLength": 1, "maxLength": 16},
                                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "integer", "minimum": -99, "maximum": 99},
                                          "b": {"type": "integer", "minimum": -99, "maximum": 99}},
                                          "required": ["a", "b"]}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Oslo, and what is 2 + 3?"}]
THINK = {"on": {}, "off": {"reasoning_effort": "none"}}


# ----------------------------------------------------------------------------- the servers

def _in_process(path: Path) -> Iterator[str]:
    from function.serve import serve_in_thread

    rt = warm_runtime(path)
    with serve_in_thread(rt) as (url, _):
        yield url


def _make_serve(path: Path) -> Iterator[str]:
    proc, url = start_serve(path)
    try:
        if url is None:
            pytest.fail("serve did not start: " + (proc.stderr.read() if proc.stderr else ""))
        yield url
    finally:
        stop_serve(proc)


TARGETS = [("tiny", "make serve"), ("tiny", "in process"), ("real vocabulary", "in process"),
           ("real model", "in process")]


@pytest.fixture(scope="module", params=TARGETS, ids=[f"{m}, {s}" for m, s in TARGETS])
def target(request, model_factory):
    model, server = request.param
    if model == "real model":
        if not REAL.is_file():
            pytest.skip("the real model is absent: `make real-model` fetches it")
        path = REAL
    else:
        path = model_factory("tiny", "F32", 0, vocab="qwen35" if model == "real vocabulary" else "factory")
    gen = _make_serve(path) if server == "make serve" else _in_process(path)
    url = next(gen)
    yield model, openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300), path
    gen.close()


def chat(client, stream=False, **kw):
    kw.setdefault("messages", ASK)
    kw.setdefault("temperature", 0.8)
    kw.setdefault("seed", 11)
    return client.chat.completions.create(model="warmllm", stream=stream, **kw)


def collect(stream) -> dict:
    """A stream joined as OpenAI's clients join it: content, reasoning, calls by index."""
    out: dict = {"content": "", "reasoning": "", "calls": {}, "finish": None, "first": {}}
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        d = c.delta
        out["content"] += d.content or ""
        out["reasoning"] += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            call = out["calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            out["first"].setdefault(tc.index, tc)
            call["id"] = call["id"] or tc.id
            call["name"] += (tc.function.name or "") if tc.function else ""
            call["arguments"] += (tc.function.arguments or "") if tc.function else ""
        out["finish"] = c.finish_reason or out["finish"]
    return out


def valid_call(name: str, arguments: str) -> None:
    args = json.loads(arguments)
    jsonschema.validate(args, PARAMS[name])


# ----------------------------------------------------------------------------- the suite

@pytest.mark.parametrize("think", ["on", "off"])
def test_chat_and_its_stream_say_the_same(target, think):
    _, client, _ = target
    kw = dict(messages=[{"role": "user", "content": "Say something short."}], max_tokens=24, temperature=0,
              **THINK[think])
    plain = chat(client, **kw)
    msg = plain.choices[0].message
    assert plain.object == "chat.completion" and plain.choices[0].finish_reason in ("stop", "length")
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    s = collect(chat(client, stream=True, stream_options={"include_usage": True}, **kw))
    assert s["content"] == (msg.content or "")
    assert s["reasoning"] == ((msg.model_extra or {}).get("reasoning_content") or "")
    assert s["finish"] == plain.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("think", ["on", "off"])
def test_a_strict_json_schema_answer(target, think, stream):
    _, client, _ = target
    kw = dict(response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}},
              max_tokens=200, **THINK[think])
    if stream:
        s = collect(chat(client, stream=True, **kw))
        content, finish = s["content"], s["finish"]
    else:
        r = chat(client, **kw)
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop", content
    jsonschema.validate(json.loads(content), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice,parallel", [("required", True), ("required", False), ("named", False),
                                             ("named", True)])
def test_forced_tool_calls(target, choice, parallel, stream):
    _, client, _ = target
    tool_choice = {"type": "function", "function": {"name": "add"}} if choice == "named" else "required"
    kw = dict(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel, max_tokens=160)
    if stream:
        s = collect(chat(client, stream=True, **kw))
        calls = [(c["id"], c["name"], c["arguments"]) for _, c in sorted(s["calls"].items())]
        finish = s["finish"]
        for first in s["first"].values():               # id, type and name first, then the arguments
            assert first.id and first.type == "function" and first.function.name and not first.function.arguments
    else:
        r = chat(client, **kw)
        calls = [(c.id, c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls or []]
        finish = r.choices[0].finish_reason
    # parallel calls may run on to max_tokens (the real 0.5B model repeats them): then `length`,
    # and in a stream the last call may be the cut one
    assert finish in ("tool_calls", "length") and calls
    assert parallel or (len(calls) == 1 and finish == "tool_calls")
    assert len({i for i, _, _ in calls}) == len(calls)               # each call its own id
    complete = calls[:-1] if finish == "length" and stream else calls
    assert complete
    for _, name, arguments in complete:
        assert choice == "required" or name == "add"
        valid_call(name, arguments)


def test_auto_and_none(target):
    model, client, path = target
    # auto: the model chooses; a call it opens is constrained. Noise rarely opens one, so the random
    # models are nudged toward the marker's token (logit_bias)
    bias = {}
    if model != "real model":
        from engine.gguf_file import GGUFFile

        bias = {"logit_bias": {str(GGUFFile(path).require("tokenizer.ggml.tokens").index("<tool_call>")): 30}}
    r = chat(client, tools=TOOLS, tool_choice="auto", max_tokens=160, reasoning_effort="none", **bias)
    calls = r.choices[0].message.tool_calls or []
    finish = r.choices[0].finish_reason
    assert finish == ("tool_calls" if calls else "stop") or finish == "length"   # parallel calls may run on
    for c in calls:
        valid_call(c.function.name, c.function.arguments)
    r = chat(client, tools=TOOLS, tool_choice="none", max_tokens=24, reasoning_effort="none")
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length")
