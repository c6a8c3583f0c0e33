"""The acceptance fuzz suite of issue 18: hostile events and bodies of every kind against the
handler on the real engine (tiny factory model). Whatever arrives: no exception leaves the
handler, no 5xx, every 4xx is an OpenAI error object whose ``param`` names a field (unless the
error is about the whole request), and every answer comes within its time bound.

Bounded for ``make test``: a fixed number of examples per test, derandomized (the same examples
every run, so a failure reproduces), tight limits so oversized inputs are cheap to build."""
from __future__ import annotations

import base64
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from function.limits import Limits
from function.runtime import Runtime
from function.settings import FunctionSettings

# the engine flushes subnormal floats in this process (WARMLLM_SUBNORMALS): hypothesis cannot draw them
REPO = Path(__file__).resolve().parents[2]
# errors about the request as a whole: no one field to name
WHOLE_REQUEST = {"invalid_json", "request_too_large", "invalid_api_key", "not_found", "method_not_allowed",
                 "invalid_event", "model_not_found", "unsupported_value"}
API_DEADLINE_S = 0.6          # generation stops here: the fuzz stays fast
PARSE_BOUND_S = 1.0          # a 4xx decided before generation
LIMITS = Limits(max_body_bytes=64 * 1024, max_json_depth=16, max_number_digits=24, max_messages=12,
                max_prompt_chars=4096)
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


class Ctx:
    aws_request_id = "fuzz"

    def __init__(self) -> None:
        self._end = time.monotonic() + 10.0

    def get_remaining_time_in_millis(self) -> int:
        return int((self._end - time.monotonic()) * 1000)


@pytest.fixture(scope="module")
def rt(tiny_model_path):
    r = Runtime(FunctionSettings(model_path=str(tiny_model_path), api_deadline_s=API_DEADLINE_S,
                                 deadline_margin_s=0.1, init_budget_s=300, limits=LIMITS))
    r.start_init()
    assert r.engine is not None, r.error
    return r


# ----------------------------------------------------------------------------- strategies

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc80b"])
TEXT = st.one_of(st.text(max_size=40), SURROGATES, st.just("x" * 5000))
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.just(10 ** 60),
                   st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False), TEXT)
JSONISH = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                       max_leaves=12)
ANY = st.one_of(JSONISH, st.builds(lambda n: [[[]]] * 0 or _nest(n), st.integers(1, 40)))
ROLE = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), st.just("user"), ANY)
CONTENT = st.one_of(TEXT, TEXT, st.lists(st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
                                             ANY), max_size=3), ANY)
TOOL_CALL = st.fixed_dictionaries({"id": ANY, "function": st.one_of(
    st.fixed_dictionaries({"name": st.one_of(st.just("f"), ANY), "arguments": st.one_of(
        st.just('{"a": 1}'), st.builds(lambda n: "[" * n + "]" * n, st.integers(1, 30000)),
        st.just('{"n": ' + "9" * 5000 + "}"), st.just('"\\ud800"'), TEXT, ANY)}), ANY)})
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLE, "content": CONTENT},
                          optional={"tool_calls": st.one_of(st.lists(TOOL_CALL, max_size=2), ANY),
                                    "name": ANY, "tool_call_id": ANY, "reasoning_content": ANY}),
    ANY)
TOOL = st.one_of(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.one_of(st.just("get_weather"), ANY)},
    optional={"parameters": st.one_of(st.just({"type": "object"}), ANY), "description": ANY})}), ANY)
SMALL_INT = st.one_of(st.integers(-3, 12), st.just(2 ** 64 - 1), st.just(-(2 ** 63)), st.integers(-2 ** 80, 2 ** 80))
COMMON = {
    "model": st.one_of(st.just("tiny"), ANY), "max_tokens": st.one_of(SMALL_INT, SMALL_INT, ANY),
    "max_completion_tokens": st.one_of(SMALL_INT, ANY),
    "temperature": st.one_of(st.floats(-1, 3, allow_subnormal=False), st.just(0), ANY),
    "top_p": st.one_of(st.floats(0, 1, allow_subnormal=False), ANY),
    "top_k": st.one_of(SMALL_INT, ANY), "min_p": ANY, "seed": st.one_of(SMALL_INT, SMALL_INT, ANY),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=20), ANY), "stream": st.one_of(st.booleans(), ANY),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.one_of(st.booleans(), ANY)}), ANY),
    "n": st.one_of(SMALL_INT, ANY), "logprobs": ANY, "response_format": ANY, "user": ANY,
    "presence_penalty": ANY,
}
CHAT_BODY = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(MESSAGE, min_size=1, max_size=4), st.lists(MESSAGE, min_size=13, max_size=14),
                           ANY)},
    optional={**COMMON, "tools": st.one_of(st.lists(TOOL, max_size=2), ANY), "tool_choice": ANY,
              "chat_template_kwargs": st.one_of(st.fixed_dictionaries({}, optional={"enable_thinking": ANY}),
                                                ANY)})
COMPLETION_BODY = st.fixed_dictionaries(
    {"prompt": st.one_of(TEXT, st.lists(st.integers(-5, 3000), max_size=8), st.lists(TEXT, max_size=3), ANY)},
    optional={**COMMON, "echo": ANY, "best_of": ANY, "suffix": ANY})


def _nest(n: int) -> object:
    v: object = []
    for _ in range(n):
        v = [v]
    return v


def _raw(body: object) -> str:
    """The body as wire text, with what json.dumps cannot write spliced in: deep nesting, long
    integers, NaN."""
    try:
        return json.dumps(body, allow_nan=True)
    except (ValueError, TypeError, RecursionError):
        return "{}"


def _IDENTITY(t: str) -> str:
    return t


RAW_MUTATIONS = st.sampled_from([
    _IDENTITY,
    lambda t: t[:-1] + ', "max_tokens": ' + "9" * 5000 + "}" if t.endswith("}") else t,
    # deeper than any recursion limit (hypothesis raises Python's while a test runs)
    lambda t: t[:-1] + ', "x": ' + "[" * 30000 + "]" * 30000 + "}" if t.endswith("}") else t,
    lambda t: t[:-1] + ', "messages": [{"role": "user", "content": "\\ud800"}]}' if t.endswith("}") else t,
    lambda t: t[: len(t) // 2],
    lambda t: t + " " * (70 * 1024),
    lambda t: t.replace('"', "'", 1),
    lambda t: "[" + t + "]",
    lambda t: "",
])
PATHS = st.one_of(st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                   "/v1/models/tiny", "/", "/prod/v1/chat/completions", "/v1/chat/completions/"]),
                  TEXT, ANY)
METHODS = st.one_of(st.sampled_from(["POST", "GET", "HEAD", "PUT", "post"]), ANY)
HEADERS = st.one_of(st.dictionaries(st.one_of(st.text(max_size=10), st.just("authorization")),
                                    st.one_of(TEXT, ANY), max_size=3), ANY)
EPOCH = st.one_of(st.none(), st.just(int(time.time() * 1000)), st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False),
                  st.integers(-2 ** 70, 2 ** 70), TEXT)


# where an event may be corrupted: (container path, key); each drawn event has 0-2 of them
CORRUPTIBLE = [((), "headers"), ((), "body"), ((), "isBase64Encoded"), ((), "queryStringParameters"),
               ((), "requestContext"), ((), "rawPath"), ((), "path"), ((), "httpMethod"), ((), "multiValueHeaders"),
               (("requestContext",), "http"), (("requestContext",), "timeEpoch"), (("requestContext",), "stage"),
               (("requestContext",), "requestTimeEpoch"), (("requestContext",), "identity"),
               (("requestContext", "http"), "method"), (("requestContext", "http"), "path"),
               (("requestContext", "http"), "sourceIp")]


@st.composite
def http_events(draw) -> dict:
    body = draw(st.one_of(CHAT_BODY, CHAT_BODY, COMPLETION_BODY, ANY))
    raw = draw(RAW_MUTATIONS)(_raw(body))
    b64 = draw(st.booleans())
    body_field = base64.b64encode(raw.encode("utf-8", "surrogatepass")).decode() if b64 else raw
    kind = draw(st.sampled_from(["v2", "url", "rest"]))
    path = draw(st.sampled_from(["/v1/chat/completions"] * 3 + ["/v1/completions"] * 2 + [
        "/v1/models", "/health", "/v1/models/tiny-F32-0-None", "/", "/prod/v1/chat/completions", "/v1/x"]))
    headers = {"content-type": "application/json"}
    if kind == "rest":
        ev = {"httpMethod": "POST", "path": path, "headers": headers, "multiValueHeaders": {"accept": ["*/*"]},
              "queryStringParameters": None,
              "requestContext": {"requestTimeEpoch": int(time.time() * 1000), "identity": {"sourceIp": "1.2.3.4"}},
              "body": body_field, "isBase64Encoded": b64}
    else:
        rc = {"http": {"method": "POST", "path": path, "sourceIp": "1.2.3.4"}, "timeEpoch": int(time.time() * 1000),
              "stage": "$default"}
        if kind == "url":
            rc["domainName"] = "abc.lambda-url.us-east-1.on.aws"
        ev = {"version": "2.0", "rawPath": path, "headers": headers, "requestContext": rc,
              "queryStringParameters": None, "body": body_field, "isBase64Encoded": b64}
    for where, key in draw(st.lists(st.sampled_from(CORRUPTIBLE), max_size=2)):
        node = ev
        for part in where:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        gen = {"headers": HEADERS, "httpMethod": METHODS, "method": METHODS, "path": PATHS, "rawPath": PATHS,
               "timeEpoch": EPOCH, "requestTimeEpoch": EPOCH}.get(key, ANY)
        if draw(st.booleans()):
            node[key] = draw(gen)
        else:
            node.pop(key, None)                                # any field may be missing
    return ev


DIRECT = st.one_of(CHAT_BODY, COMPLETION_BODY, ANY, st.just({}), st.just({"source": "aws.events"}),
                   st.builds(lambda b, k: {**b, k: 1}, CHAT_BODY, st.integers()))  # a non-string key


# ----------------------------------------------------------------------------- the properties

def check(rt, event) -> None:
    t, cpu = time.perf_counter(), time.thread_time()
    resp = rt.handle(event, Ctx())             # an exception here fails the test: none may escape
    elapsed = time.perf_counter() - t
    # a refusal is decided on this thread: its CPU time is what hostile input can cost, and unlike
    # the wall clock it holds on a loaded 2-core CI machine (a too_deep refusal measured 1.13 s of
    # wall time there, beside a parallel job)
    cpu = time.thread_time() - cpu
    if isinstance(resp, dict) and "statusCode" in resp:
        status = resp["statusCode"]
        assert isinstance(resp["body"], str)
        resp["body"].encode("utf-8")               # Lambda must be able to send it
        if resp["headers"]["content-type"].startswith("text/event-stream"):
            assert status == 200 and resp["body"].endswith("data: [DONE]\n\n")
            body = None
        else:
            body = json.loads(resp["body"])
    else:                                           # a direct invoke: the body itself
        body = resp
        status = 200 if "error" not in body else None
    assert isinstance(body, dict) or body is None
    if body is not None and "error" in body:
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["code"], err
        if status is None:
            status = 400 if err["type"] == "invalid_request_error" else 503
        assert err["param"] is not None or err["code"] in WHOLE_REQUEST, err
        assert status < 500 or err["code"] == "model_not_loaded", err    # no 5xx: never a bug
        assert cpu < PARSE_BOUND_S + (API_DEADLINE_S if status == 413 else 0), (cpu, elapsed, err)
    else:
        assert status == 200, body
        assert elapsed < API_DEADLINE_S + 1.0, elapsed


@FUZZ
@given(ev=http_events())
def test_http_events(rt, ev):
    check(rt, ev)


@FUZZ
@given(body=st.one_of(CHAT_BODY, COMPLETION_BODY), mutation=RAW_MUTATIONS.filter(lambda m: m is not _IDENTITY),
       b64=st.booleans())
def test_hostile_bodies(rt, body, mutation, b64):
    # every hostile rewrite of the wire text, on a well-formed event of a generation route
    raw = mutation(_raw(body))
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    check(rt, {"version": "2.0", "rawPath": path, "headers": {}, "requestContext": {"http": {"method": "POST"}},
               "body": base64.b64encode(raw.encode("utf-8", "surrogatepass")).decode() if b64 else raw,
               "isBase64Encoded": b64})


@FUZZ
@given(ev=DIRECT)
def test_direct_invokes(rt, ev):
    check(rt, ev)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=CHAT_BODY, auth=st.one_of(st.just("Bearer k"), st.just("Bearer x"), TEXT, ANY))
def test_with_an_api_key(rt, body, auth):
    keyed = Runtime(FunctionSettings(model_path=rt.settings.model_path, api_key="k", limits=LIMITS,
                                     api_deadline_s=API_DEADLINE_S))
    keyed.engine, keyed._thread = rt.engine, rt._thread
    check(keyed, {"version": "2.0", "rawPath": "/v1/chat/completions", "headers": {"authorization": auth},
                  "requestContext": {"http": {"method": "POST"}}, "body": _raw(body)})


def test_the_fuzz_reaches_generation(rt):
    # the strategies are not all refusals: a plain request through the same check generates
    ev = {"version": "2.0", "rawPath": "/v1/chat/completions", "requestContext": {"http": {"method": "POST"}},
          "body": json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": -1})}
    check(rt, ev)
    assert json.loads(rt.handle(ev, Ctx())["body"])["usage"]["completion_tokens"] >= 1
    assert math.isfinite(API_DEADLINE_S)


# ----------------------------------------------------------------------------- peak memory

PEAK_SCRIPT = r"""
import json, resource, sys, time
from function.runtime import Runtime
from function.settings import FunctionSettings
from function.limits import Limits
rt = Runtime(FunctionSettings(model_path=sys.argv[1], init_budget_s=300, limits=Limits(**json.loads(sys.argv[2]))))
rt.start_init()
assert rt.engine is not None, rt.error
warm = {"version": "2.0", "rawPath": "/v1/chat/completions", "requestContext": {"http": {"method": "POST"}},
        "body": json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})}
assert rt.handle(warm)["statusCode"] == 200
body = json.dumps({"messages": [{"role": "user", "content": "word " * 1_200_000}]})     # 6 MB
ev = {"version": "2.0", "rawPath": "/v1/chat/completions", "requestContext": {"http": {"method": "POST"}},
      "body": body}
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
resp = rt.handle(ev)
ms = (time.perf_counter() - t) * 1000
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"status": resp["statusCode"], "grew_kb": peak - base, "ms": ms, "body": len(body)}))
"""


def _peak(model: Path, limits: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(model), json.dumps(limits)], capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_6mb_body_is_refused_in_milliseconds_with_bounded_memory(tiny_model_path):
    got = _peak(tiny_model_path, {})
    assert got["body"] > 6_000_000 and got["status"] == 413
    assert got["ms"] < 500, got                    # was 10 s
    assert got["grew_kb"] < 48 * 1024, got         # was 1.6 GB: the body's own copies only
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
