"""Hostile request bodies and event shapes (issue 18 item 1): each is a 400/413 OpenAI error that
names the field and the limit, answered in milliseconds, before the model is even needed (these
runtimes have no model: a request that got past the checks would be a 503, not a 4xx)."""
from __future__ import annotations

import json
import math
import os
import time

import pytest

from function import limits
from function.limits import Limits
from engine.jsonlog import emit
from function.runtime import Runtime
from function.settings import FunctionSettings

CHAT = "/v1/chat/completions"


def http(body: str | None, path: str = CHAT, method: str = "POST", **extra) -> dict:
    ev = {"version": "2.0", "rawPath": path, "headers": {"content-type": "application/json"},
          "requestContext": {"http": {"method": method, "path": path}, "timeEpoch": int(time.time() * 1000)},
          "body": body}
    ev.update(extra)
    return ev


def chat(**fields) -> str:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.fixture
def rt():
    return Runtime(FunctionSettings(model_path="/nonexistent/model.gguf"))


def answer(rt, ev) -> tuple[int, dict, float]:
    t = time.perf_counter()
    resp = rt.handle(ev)
    ms = (time.perf_counter() - t) * 1000
    if isinstance(resp, dict) and "statusCode" in resp:
        return resp["statusCode"], json.loads(resp["body"]), ms
    return (400 if "error" in resp else 200), resp, ms


def error(rt, ev, status=400):
    got, body, ms = answer(rt, ev)
    assert got == status, body
    assert ms < 500, ms          # milliseconds, not the seconds of rendering and tokenizing
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_deep_nesting_is_a_400_naming_the_field(rt):
    deep = '{"messages": ' + "[" * 1000 + "]" * 1000 + "}"      # was a RecursionError → 500
    err = error(rt, http(deep))
    assert err["param"] == "messages" and err["code"] == "too_deep" and "64" in err["message"]
    medium = json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": [[[[[[[[[[[]]]]]]]]]]]})
    err = error(rt, http(medium), 400)
    # not too deep for the default (64): the tools error is about the shape instead
    assert err["param"] == "tools[0]"
    tight = Runtime(FunctionSettings(model_path="/nonexistent/model.gguf", limits=Limits(max_json_depth=5)))
    err = error(tight, http(medium))
    assert err["code"] == "too_deep" and err["param"].startswith("tools[0][0]") and "(MAX_JSON_DEPTH)" in err["message"]


def test_deep_tool_call_arguments_are_a_400_naming_them(rt):
    args = "[" * 3000 + "]" * 3000
    body = json.dumps({"messages": [{"role": "assistant", "content": "",
                                     "tool_calls": [{"function": {"name": "f", "arguments": args}}]}]})
    err = error(rt, http(body))
    assert err["param"] == "messages[0].tool_calls[0].function.arguments" and err["code"] == "too_deep"


def test_long_integers_are_a_400_naming_the_field(rt):
    body = chat()[:-1] + ', "max_tokens": ' + "9" * 5000 + "}"   # past Python's 4,300-digit limit
    err = error(rt, http(body))
    assert err["param"] == "max_tokens" and err["code"] == "number_too_long" and "5000 digits" in err["message"]
    direct = {"messages": [{"role": "user", "content": "x"}], "seed": 10 ** 5000}
    err = error(rt, direct)
    assert err["param"] == "seed" and err["code"] == "number_too_long"
    err = error(rt, http(chat()[:-1] + ', "temperature": 0.' + "1" * 100 + "}"))
    assert err["param"] == "temperature"


def test_nan_and_infinity_are_not_json(rt):
    err = error(rt, http(chat()[:-1] + ', "temperature": NaN}'))
    assert err["code"] == "invalid_json" and "NaN" in err["message"]


def test_lone_surrogates_are_a_400_naming_the_field(rt):
    err = error(rt, http('{"messages":[{"role":"user","content":"ok \\ud800"}]}'))
    assert err["param"] == "messages[0].content" and err["code"] == "invalid_unicode"
    err = error(rt, http('{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"\\udfff":1}}'))
    assert err["param"] == "chat_template_kwargs" and err["code"] == "invalid_unicode"
    # a surrogate pair is valid Unicode (one astral character), not refused
    got, body, _ = answer(rt, http('{"messages":[{"role":"user","content":"\\ud83d\\ude00"}]}'))
    assert got == 503, body


def test_body_size_is_a_413_before_any_parsing(rt):
    big = json.dumps({"messages": [{"role": "user", "content": "a" * 6_000_000}]})
    err = error(rt, http(big), 413)
    assert err["code"] == "request_too_large" and str(Limits().max_body_bytes) in err["message"]
    assert "MAX_BODY_BYTES" in err["message"]


def test_message_count_and_prompt_chars(rt):
    many = json.dumps({"messages": [{"role": "user", "content": "x"}] * 513})
    err = error(rt, http(many))
    assert err["param"] == "messages" and err["code"] == "too_many_messages" and "512" in err["message"]
    small = Runtime(FunctionSettings(model_path="/nonexistent/model.gguf", limits=Limits(max_prompt_chars=100)))
    err = error(small, http(json.dumps({"messages": [{"role": "user", "content": "y" * 101}]})), 413)
    assert err["param"] == "messages" and err["code"] == "prompt_too_long" and "100" in err["message"]
    tools = [{"type": "function", "function": {"name": "f", "description": "d" * 200}}]
    err = error(small, http(json.dumps({"messages": [{"role": "user", "content": "y"}], "tools": tools})), 413)
    assert err["param"] == "messages"
    comp = http(json.dumps({"prompt": "z" * 101}), path="/v1/completions")
    err = error(small, comp, 413)
    assert err["param"] == "prompt"
    # under every limit: the request reaches the model (none here: 503)
    assert answer(small, http(json.dumps({"messages": [{"role": "user", "content": "y" * 90}]})))[0] == 503


@pytest.mark.parametrize("ev,param", [
    (http(chat(), headers=["a", "b"]), "headers"),
    ({"version": "2.0", "requestContext": {"http": "POST"}}, "requestContext.http"),
    ({"httpMethod": "GET", "path": 5}, "path"),
    (http(chat(), requestContext={"http": {"method": "POST"}, "timeEpoch": math.inf}), "requestContext.timeEpoch"),
    (http(chat(), requestContext={"http": {"method": "POST"}, "timeEpoch": math.nan}), "requestContext.timeEpoch"),
    (http(chat(), requestContext={"http": {"method": 7}}), "requestContext.http.method"),
    (http(chat(), queryStringParameters=[1]), "queryStringParameters"),
    (http(chat(), isBase64Encoded="yes"), "isBase64Encoded"),
    (http(chat(), headers={"x": {"a": 1}}), "headers.x"),
    (http(chat(), headers={"authorization": "Bearer \ud800"}), "headers.authorization"),
    ({"httpMethod": "POST", "path": CHAT, "multiValueHeaders": {"a": "b"}}, "multiValueHeaders.a"),
    ({"httpMethod": "POST", "path": CHAT, "requestContext": {"identity": "me"}}, "requestContext.identity"),
    (http(5), "body"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {1: 2}}, "chat_template_kwargs"),
])
def test_odd_event_shapes_are_a_400_naming_the_field(rt, ev, param):
    err = error(rt, ev)
    assert err["param"] == param, err


def test_a_surrogate_in_the_path_is_a_400_and_the_log_line_is_written(rt, capsys):
    ev = http(chat(), path="/v1/\ud800")
    err = error(rt, ev)
    assert err["param"] == "rawPath"
    line = [json.loads(s) for s in capsys.readouterr().out.splitlines() if s.startswith("{")][-1]
    assert line["event"] == "request" and line["status"] == 400


def test_emit_never_raises(capsys):
    emit({"event": "x", "path": "/\ud800"})                        # was UnicodeEncodeError
    out = capsys.readouterr().out
    assert json.loads(out)["path"] == "/\ud800" and "\\ud800" in out
    loop: dict = {"event": "loop"}
    loop["self"] = loop
    emit(loop)                                                     # circular: a line that says so
    assert json.loads(capsys.readouterr().out)["log_error"].startswith("ValueError")


def test_negative_seed_is_taken_modulo_2_64():
    from function import openai_schema as oa
    assert oa.parse_chat(json.loads(chat(seed=-5))).sampling.seed == 2 ** 64 - 5
    assert oa.parse_chat(json.loads(chat(seed=7))).sampling.seed == 7
    with pytest.raises(Exception) as e:
        oa.parse_chat(json.loads(chat(seed=2 ** 64)))
    assert e.value.param == "seed"


def test_negative_seed_generates_like_its_unsigned_twin(tiny_model_path):
    r = Runtime.from_env({**os.environ, "MODEL_PATH": str(tiny_model_path)})
    r.start_init(budget_s=300)
    outs = []
    for seed in (-5, 2 ** 64 - 5):
        got, body, _ = answer(r, http(chat(seed=seed, temperature=1.0, max_tokens=8)))
        assert got == 200, body                       # -5 was a 400 that named 'messages'
        outs.append(body["choices"][0]["message"])
    assert outs[0] == outs[1]


def test_limits_from_env_name_the_variable():
    assert Limits.from_env({"MAX_BODY_BYTES": "2048", "MAX_MESSAGES": "3"}) == Limits(max_body_bytes=2048,
                                                                                      max_messages=3)
    with pytest.raises(ValueError, match="MAX_JSON_DEPTH"):
        Limits.from_env({"MAX_JSON_DEPTH": "0"})
    assert FunctionSettings.from_env({"MAX_PROMPT_CHARS": "10"}).limits.max_prompt_chars == 10


def test_loads_guards_are_linear():
    # a megabyte of flat numbers parses and walks in well under a second
    text = "[" + ",".join(["123456"] * 150_000) + "]"
    t = time.perf_counter()
    assert len(limits.loads(text, Limits(max_body_bytes=1 << 30))) == 150_000
    assert time.perf_counter() - t < 1.0
