"""Hostile constraint input through the handler (issue 45, part 3): schemas and grammars with no
finite answer and ambiguous or oversized tool lists are a 400 naming the field before any
decoding; a constraint that fails mid-decode is an error the client sees (an OpenAI error object;
in a stream, an error event before [DONE]), never `stop` with part of an answer."""
from __future__ import annotations

import json
import time

import pytest

from engine import constraints as C
from tests.function.test_streaming import FakeHttp
from tests.function.warm import Ctx, warm_runtime

CYCLE = {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                   "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}},
         "$ref": "#/$defs/a"}
TREE = {"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"},
                                                                 "maxItems": 2}}, "required": ["kids"]}},
        "$ref": "#/$defs/n"}


@pytest.fixture(scope="module")
def rt(tiny_model_path):
    return warm_runtime(tiny_model_path)


def ask(rt, **body):
    body.setdefault("messages", [{"role": "user", "content": "Answer please."}])
    body.setdefault("reasoning_effort", "none")
    body.setdefault("max_tokens", 40)
    return rt.handle(body, Ctx())


def error_of(b):
    body = json.loads(b["body"]) if isinstance(b, dict) and "body" in b else b
    assert "choices" not in body, body
    return body["error"]


def _tool(name, params=None):
    return {"type": "function", "function": {"name": name, "parameters": params or {
        "type": "object", "properties": {"q": {"type": "string", "maxLength": 4}}, "required": ["q"]}}}


def _not_decoded(rt, monkeypatch):
    """Fails the test if the request reaches the model's prefill."""
    def refuse(*a, **k):
        raise AssertionError("the request reached the prefill")
    monkeypatch.setattr(rt.engine.session, "prefill", refuse)


@pytest.mark.parametrize("field,value,param", [
    ("response_format", {"type": "json_schema", "json_schema": {"name": "c", "schema": CYCLE}},
     "response_format.json_schema.schema"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]}}},
     "response_format.json_schema.schema"),
    ("grammar", "start: start start", "grammar"),
    ("grammar", 'start: "a" b\nb: b "x"', "grammar"),
    ("grammar", "root ::= \"a\" root", "grammar"),                        # GBNF, converted
    ("grammar", "start: A\nA: /a/ & /b/", "grammar"),                      # an empty language
])
def test_a_constraint_with_no_finite_answer_is_a_400_before_decoding(rt, monkeypatch, field, value, param):
    _not_decoded(rt, monkeypatch)
    err = error_of(ask(rt, **{field: value}))
    assert err["param"] == param and err["code"] == "unsupported_schema", err
    assert "finite" in err["message"] or "no output" in err["message"], err


def test_a_recursive_schema_with_a_base_case_still_works(rt):
    b = ask(rt, response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": TREE}},
            max_tokens=200)
    assert b["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_tool_parameter_with_a_ref_cycle_is_named(rt, monkeypatch):
    _not_decoded(rt, monkeypatch)
    tool = _tool("loop", {"type": "object", "properties": {"x": CYCLE["$defs"]["a"]}, "required": ["x"],
                          "$defs": CYCLE["$defs"]})
    err = error_of(ask(rt, tools=[tool], tool_choice="required"))
    assert err["param"] == "tools[0].function.parameters.properties.x", err


def test_duplicate_tool_names_are_refused(rt, monkeypatch):
    _not_decoded(rt, monkeypatch)
    err = error_of(ask(rt, tools=[_tool("f"), _tool("g"), _tool("f")]))
    assert err["param"] == "tools[2].function.name" and err["code"] == "duplicate_tool_name", err
    assert "tools[0]" in err["message"]


def test_more_tools_than_the_limit_are_refused_fast(rt, monkeypatch):
    """500 small tools with tool_choice required used to pass every limit (24,693 prompt tokens,
    15 s, +690 MB); OpenAI allows 128."""
    _not_decoded(rt, monkeypatch)
    t0 = time.process_time()
    err = error_of(ask(rt, tools=[_tool(f"t{i}") for i in range(500)], tool_choice="required"))
    assert err["param"] == "tools" and err["code"] == "too_many_tools" and "128" in err["message"], err
    assert time.process_time() - t0 < 5.0              # CPU time: refused before any real work
    monkeypatch.undo()
    b = ask(rt, tools=[_tool(f"t{i}") for i in range(128)], tool_choice="none", max_tokens=1)
    assert "choices" in b, b


def _failing_after(n: int):
    """Constraint.accept that gives up like llguidance did ("Too many items ...") after `n` tokens."""
    real = C.Constraint.accept

    def accept(self, token):
        real(self, token)
        if self.active and not self.finished:
            self.seen = getattr(self, "seen", 0) + 1
            if self.seen >= n:
                self.error = "Too many items (limit 50000; ff_tokens)"
                self.finished = True
    return accept


SCHEMA = {"type": "json_schema", "json_schema": {"name": "o", "schema": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 30}}, "required": ["name"]}}}


def test_a_constraint_failing_mid_decode_is_an_error_not_a_stop(rt, monkeypatch, capsys):
    monkeypatch.setattr(C.Constraint, "accept", _failing_after(3))
    capsys.readouterr()
    err = error_of(ask(rt, response_format=SCHEMA))
    assert err["code"] == "constraint_failed" and err["param"] == "response_format.json_schema.schema", err
    assert "Too many items" in err["message"]
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    why = [x for x in lines if x.get("event") == "grammar_error"]
    assert len(why) == 1 and why[0]["field"] == "response_format.json_schema.schema", lines
    request = [x for x in lines if x.get("event") == "request"]
    assert request and request[-1].get("error_code") == "constraint_failed", request


def test_a_constraint_failing_mid_stream_ends_with_an_error_event(rt, monkeypatch):
    monkeypatch.setattr(C.Constraint, "accept", _failing_after(3))
    http = FakeHttp()
    body = {"messages": [{"role": "user", "content": "Answer please."}], "reasoning_effort": "none",
            "max_tokens": 40, "response_format": SCHEMA, "stream": True}
    assert rt.handle(body, Ctx(), stream=http) is None
    events = [e[6:] for e in b"".join(d for _, d in http.writes).decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert error["error"]["code"] == "constraint_failed", events
    finishes = [json.loads(e)["choices"][0].get("finish_reason") for e in events[:-2]
                if json.loads(e).get("choices")]
    assert "stop" not in finishes, events
