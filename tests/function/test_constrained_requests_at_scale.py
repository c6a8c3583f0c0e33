"""Issue 52's goal as a test: seeded constrained requests through the handler, thinking on and off,
10 schemas and 6 tool sets, streamed and not, and not one invalid ``content`` or ``arguments``.

``make test`` runs ``WARMLLM_CONSTRAINED_REQUESTS`` of them (default 48); the issue's full count is
``WARMLLM_CONSTRAINED_REQUESTS=500 pytest tests/function/test_constrained_requests_at_scale.py``.
The tiny model's weights are random: every answer that validates does so because of the mask, and
every reply must end by the grammar (``stop`` / ``tool_calls``), never ``length``: the reasoning
budget leaves the answer room."""
from __future__ import annotations

import json
import os
import random

import jsonschema
import pytest

from tests.function.test_constrained_outputs import tool_answer
from tests.function.warm import Ctx, warm_runtime
from tests.strict_json import integers_stay_integers, strict_loads

N_REQUESTS = int(os.environ.get("WARMLLM_CONSTRAINED_REQUESTS", "48"))


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


SMALL = {"type": "string", "maxLength": 8}
SCHEMAS = [
    _obj({"ok": {"type": "boolean"}}),
    _obj({"n": {"type": "integer", "minimum": -5, "maximum": 5}, "name": SMALL}),
    _obj({"x": {"type": "number", "minimum": 0, "maximum": 1}}, []),
    _obj({"tags": {"type": "array", "items": SMALL, "maxItems": 3}}),
    _obj({"color": {"enum": ["red", "green", "blue"]}, "n": {"type": ["integer", "null"], "minimum": 0, "maximum": 9}}),
    _obj({"inner": _obj({"a": {"type": "integer", "minimum": 0, "maximum": 3}, "b": SMALL}, ["a"])}),
    _obj({"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}}),
    _obj({"when": {"type": "string", "format": "date"}}),
    _obj({"items": {"type": "array", "items": _obj({"id": {"type": "integer", "minimum": 1, "maximum": 99}}),
                    "maxItems": 2}}),
    _obj({"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, SMALL]}}),
]


def _tool(name: str, params: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": params}}


TOOL_SETS = [
    [_tool("get_weather", _obj({"city": {"type": "string", "minLength": 1, "maxLength": 12},
                                "days": {"type": "integer", "minimum": 1, "maximum": 7}}, ["city"]))],
    [_tool("add", _obj({"a": {"type": "integer", "minimum": -9, "maximum": 9},
                        "b": {"type": "integer", "minimum": -9, "maximum": 9}})),
     _tool("neg", _obj({"a": {"type": "integer", "minimum": -9, "maximum": 9}}))],
    [_tool("search", _obj({"q": SMALL, "top": {"type": "integer", "minimum": 1, "maximum": 3}}, ["q"])),
     _tool("open", _obj({"id": {"type": "integer", "minimum": 0, "maximum": 99}}))],
    [_tool("set_flag", _obj({"on": {"type": "boolean"}, "why": {"type": ["string", "null"], "maxLength": 8}}, ["on"]))],
    [_tool("plot", _obj({"xs": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 9},
                                "maxItems": 3}, "kind": {"enum": ["line", "bar"]}}))],
    [_tool("noop", {"type": "object", "properties": {}}),
     _tool("echo", _obj({"text": SMALL}))],
]


@pytest.fixture(scope="module")
def rt(tiny_model_path):
    return warm_runtime(tiny_model_path)


def _request(i: int, tool_call_id: int) -> tuple[dict, str, object]:
    rng = random.Random(i)
    body: dict = {"messages": [{"role": "user", "content": f"Request {i}: answer."}], "temperature": 1.0,
                  "seed": i, "max_tokens": 320, "stream": rng.random() < 0.3}
    if rng.random() < 0.5:
        body["reasoning_effort"] = "none"
    if i % 2 == 0:
        schema = SCHEMAS[rng.randrange(len(SCHEMAS))]
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
        return body, "schema", schema
    tools = TOOL_SETS[rng.randrange(len(TOOL_SETS))]
    kind = rng.choice(["required", "named", "auto"])
    body["tools"] = tools
    body["parallel_tool_calls"] = rng.random() < 0.5
    if kind == "named":
        body["tool_choice"] = {"type": "function", "function": {"name": rng.choice(tools)["function"]["name"]}}
    elif kind == "required":
        body["tool_choice"] = "required"
    else:
        body["tool_choice"] = "auto"
        body["logit_bias"] = {str(tool_call_id): 20}     # noise seldom opens a call by itself
    return body, kind, tools


def test_no_constrained_request_comes_back_invalid(rt):
    tool_call_id = rt.engine.tokenizer.token_id("<tool_call>")
    bad: list[tuple[int, str]] = []
    for i in range(N_REQUESTS):
        body, kind, spec = _request(i, tool_call_id)
        resp = rt.handle(json.loads(json.dumps(body)), Ctx())
        if isinstance(resp, dict) and "error" in resp:
            bad.append((i, f"error {resp['error']}"))
            continue
        content, calls, finish = tool_answer(resp, body["stream"])
        try:
            if kind == "schema":
                assert finish == "stop", finish
                value = strict_loads(content)
                jsonschema.validate(value, spec)
                integers_stay_integers(value, spec)
                continue
            params = {t["function"]["name"]: t["function"]["parameters"] for t in spec}
            if kind != "auto":
                assert calls, (finish, content)
            # parallel calls may run on to max_tokens: `length`, and a stream's last call may be the cut one
            if calls:
                assert finish == "tool_calls" or (finish == "length" and body["parallel_tool_calls"]), finish
            else:                                        # auto answered in free text, which may be cut
                assert finish in ("stop", "length"), finish
            assert body["parallel_tool_calls"] or len(calls) <= 1
            for c in (calls[:-1] if finish == "length" and body["stream"] else calls):
                fn = c["function"]
                assert kind != "named" or fn["name"] == body["tool_choice"]["function"]["name"]
                args = strict_loads(fn["arguments"])
                jsonschema.validate(args, params[fn["name"]])
                integers_stay_integers(args, params[fn["name"]])
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            bad.append((i, f"{kind} {'thinking' if 'reasoning_effort' not in body else 'no thinking'}: {exc!r}"[:300]))
    assert not bad, f"{len(bad)} of {N_REQUESTS} invalid: {bad[:5]}"
