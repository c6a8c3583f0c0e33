"""The response-streaming runtime loop (function/stream_runtime.py) against a local Runtime API
server on real sockets: it parses the chunked POST as it arrives and stamps each chunk with
``time.monotonic()`` (same process, same clock as the engine's decode steps, which the test
records by wrapping ``Session.step``). Checks the wire format byte for byte (headers, prelude,
the 8 NUL delimiter, the trailers), that content reaches the wire while decoding goes on, one log
line per invocation, keep-alive comments during a slow prefill, mid-stream errors as trailers,
buffered events posted whole, and init errors."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from function import stream_runtime as sr
from function import streaming as sse_mod
from tests.function.warm import warm_runtime
from tests.function.runtime_api_fake import FakeRuntimeAPI

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
PREFIX = "/2018-06-01/runtime"


def event(name: str, **body_changes) -> dict:
    ev = json.loads((EVENTS / name).read_text())
    if body_changes:
        body = json.loads(ev["body"])
        body.update(body_changes)
        ev["body"] = json.dumps(body)
    return ev


@pytest.fixture(scope="module")
def rt(tiny_model_path):
    return warm_runtime(tiny_model_path, STREAM_KEEPALIVE_S="0.2")


def drive(rt, events: list[tuple[str, dict]]) -> FakeRuntimeAPI:
    api = FakeRuntimeAPI(events)
    try:
        client = sr.RuntimeAPIClient(api.address)
        sr.run(client, rt.handle, rt.handle_stream, frozenset(sr.DEFAULT_STREAM_KINDS), os.environ,
               max_invocations=len(events))
    finally:
        api.close()
    return api


def split_prelude(body: bytes) -> tuple[dict, bytes]:
    meta, delim, rest = body.partition(sr.DELIMITER)
    assert delim == sr.DELIMITER
    return json.loads(meta), rest


def sse_events(payload: bytes) -> list[str]:
    return [blk for blk in payload.decode().split("\n\n") if blk]


def request_lines(capsys, rid: str) -> list[dict]:
    out = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    return [x for x in out if x.get("event") == "request" and x.get("request_id") == rid]


def test_function_url_stream_reaches_the_wire_while_decoding(rt, capsys, monkeypatch):
    eng = rt.engine
    monkeypatch.setattr(eng.tokenizer, "eog_ids", frozenset())    # 64 tokens, no early end
    steps: list[float] = []
    real_step = eng.session.step

    def timed_step(tok):
        out = real_step(tok)
        steps.append(time.monotonic())      # token k+1 decoded at steps[k] (token 1 came from the prefill)
        return out

    monkeypatch.setattr(eng.session, "step", timed_step)
    ev = event("chat_function_url.json", stream=True, max_tokens=64, temperature=1.0, seed=7,
               stream_options={"include_usage": True})
    capsys.readouterr()
    api = drive(rt, [("rid-url-1", ev)])
    post = api.posts["rid-url-1"]
    h = post["headers"]
    assert post["kind"] == "response" and post["path"] == f"{PREFIX}/invocation/rid-url-1/response"
    assert h["lambda-runtime-function-response-mode"] == "streaming"
    assert h["transfer-encoding"] == "chunked"
    assert h["content-type"] == "application/vnd.awslambda.http-integration-response"
    assert h["trailer"] == "Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body"
    assert "content-length" not in h
    # the prelude is the first chunk, byte for byte
    expected = (b'{"statusCode":200,"headers":{"content-type":"text/event-stream; charset=utf-8",'
                b'"cache-control":"no-cache","x-request-id":"rid-url-1"},"cookies":[]}' + b"\x00" * 8)
    assert post["chunks"][0][1] == expected
    meta, payload = split_prelude(post["body"])
    assert meta["statusCode"] == 200
    evs = sse_events(payload)
    assert evs[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in evs if e.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 64
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    # text chunks went out one by one as the tokens decoded, not after the generation (the factory
    # template opens <think> in the generation prompt: the random model's text is reasoning)
    content_times = [t for t, data in post["chunks"][1:]
                     if b'"delta":{"content":"' in data or b'"delta":{"reasoning_content":"' in data]
    assert len(steps) == 63 and len(content_times) >= 10
    assert content_times[0] < steps[8], "the first content chunk must arrive before the 10th token is decoded"
    assert content_times[0] < steps[-1]
    lines = request_lines(capsys, "rid-url-1")
    assert len(lines) == 1 and lines[0]["stream"] is True and lines[0]["tokens_out"] == 64
    assert lines[0]["ttft_ms"] is not None and lines[0]["ttft_ms"] <= lines[0]["total_ms"]


def test_rest_prelude_buffered_json_and_http_api(rt, capsys):
    rest = event("chat_rest_api.json", max_tokens=4)
    http = event("chat_http_api.json", max_tokens=4)
    capsys.readouterr()
    api = drive(rt, [("rid-rest", rest), ("rid-http", http)])
    out = capsys.readouterr().out
    # REST through the streaming integration, stream false: the JSON answer behind the same prelude
    post = api.posts["rid-rest"]
    assert post["headers"]["lambda-runtime-function-response-mode"] == "streaming"
    meta, payload = split_prelude(post["body"])
    assert post["chunks"][0][1].endswith(b'"cookies":[]}' + b"\x00" * 8)
    assert meta["statusCode"] == 200 and meta["headers"]["content-type"] == "application/json"
    assert json.loads(payload)["object"] == "chat.completion"
    # the HTTP API buffers: posted whole, the proxy response object, no streaming headers
    post = api.posts["rid-http"]
    assert "lambda-runtime-function-response-mode" not in post["headers"]
    resp = json.loads(post["body"])
    assert resp["statusCode"] == 200 and json.loads(resp["body"])["object"] == "chat.completion"
    lines = [json.loads(x) for x in out.splitlines() if x.startswith('{"event":"request"')]
    assert [x["request_id"] for x in lines] == ["rid-rest", "rid-http"]


def test_error_before_the_stream_keeps_its_status(rt, capsys):
    ev = event("chat_function_url.json", stream=True, max_tokens=10 ** 6)     # 413: context overflow
    api = drive(rt, [("rid-413", ev)])
    meta, payload = split_prelude(api.posts["rid-413"]["body"])
    assert meta["statusCode"] == 413 and json.loads(payload)["error"]["code"] == "context_length_exceeded"
    assert api.posts["rid-413"]["trailers"] == {}


def test_keepalive_during_a_slow_prefill(rt, capsys, monkeypatch):
    eng = rt.engine
    real_run = eng.session._run

    def slow_run(*a, **kw):
        time.sleep(1.0)                      # a long prefill: keep-alive every 0.2 s meanwhile
        return real_run(*a, **kw)

    monkeypatch.setattr(eng.session, "_run", slow_run)
    eng.session.reset()
    ev = event("chat_function_url.json", stream=True, max_tokens=3,
               messages=[{"role": "user", "content": "a new conversation to prefill"}])
    api = drive(rt, [("rid-ka", ev)])
    datas = [d for _, d in api.posts["rid-ka"]["chunks"][1:]]
    first_data = next(i for i, d in enumerate(datas) if d.startswith(b"data: ") and b'"role"' not in d)
    keepalives = [d for d in datas[:first_data] if d == sse_mod.KEEPALIVE]
    assert datas[0].startswith(b"data: ") and b'"role":"assistant"' in datas[0]   # first bytes at once
    assert len(keepalives) >= 2, datas[:first_data]


def test_mid_stream_bug_ends_with_the_error_trailers(rt, capsys, monkeypatch):
    calls = {"n": 0}
    real_feed = sse_mod.ChatStream.feed

    def broken_feed(self, piece):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("planted mid-stream bug")
        return real_feed(self, piece)

    monkeypatch.setattr(sse_mod.ChatStream, "feed", broken_feed)
    monkeypatch.setattr(rt.engine.tokenizer, "eog_ids", frozenset())
    ev = event("chat_function_url.json", stream=True, max_tokens=8)
    capsys.readouterr()
    api = drive(rt, [("rid-bug", ev)])
    post = api.posts["rid-bug"]
    meta, payload = split_prelude(post["body"])
    assert meta["statusCode"] == 200                        # sent before the bug: cannot change
    assert post["trailers"]["lambda-runtime-function-error-type"] == "Function.InternalError"
    err = json.loads(base64.b64decode(post["trailers"]["lambda-runtime-function-error-body"]))
    assert err["code"] == "internal_error" and "rid-bug" in err["message"]
    assert b'"error"' in payload
    lines = request_lines(capsys, "rid-bug")
    assert len(lines) == 1 and lines[0]["error_code"] == "internal_error"


def test_init_error_is_posted(tmp_path):
    api = FakeRuntimeAPI([])
    try:
        env = {**os.environ, "AWS_LAMBDA_RUNTIME_API": api.address, "STREAM_EVENT_KINDS": "bogus",
               "PYTHONPATH": str(ROOT)}
        r = subprocess.run([sys.executable, "-m", "function.stream_runtime"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    finally:
        api.close()
    assert r.returncode == 1
    assert api.init_error is not None
    assert api.init_error["headers"]["lambda-runtime-function-error-type"] == "Runtime.InitError"
    body = json.loads(api.init_error["body"])
    assert body["errorType"] == "ValueError" and "STREAM_EVENT_KINDS" in body["errorMessage"]


def test_prelude_limit():
    assert sr.prelude(201, {"a": "b"}, ["c=d"]) == b'{"statusCode":201,"headers":{"a":"b"},"cookies":["c=d"]}' + \
        b"\x00" * 8
    with pytest.raises(ValueError, match="16384"):
        sr.prelude(200, {"x": "y" * 20000})


def test_iam_function_url_skips_the_bearer_check_only_there(rt, capsys, monkeypatch):
    import dataclasses
    monkeypatch.setattr(rt, "api_key", "sekrit")
    signed = event("chat_function_url.json", max_tokens=2)
    signed["headers"]["authorization"] = "AWS4-HMAC-SHA256 Credential=AKIA.../lambda/aws4_request, Signature=00"
    monkeypatch.setattr(rt, "settings", dataclasses.replace(rt.settings, function_url_iam=False))
    assert rt.handle(signed, None)["statusCode"] == 401
    monkeypatch.setattr(rt, "settings", dataclasses.replace(rt.settings, function_url_iam=True))
    assert rt.handle(signed, None)["statusCode"] == 200           # Lambda verified the signature
    rest = event("chat_rest_api.json", max_tokens=2)
    rest["headers"]["authorization"] = signed["headers"]["authorization"]
    assert rt.handle(rest, None)["statusCode"] == 401              # the REST API still needs the key
    capsys.readouterr()


def test_zip_bootstrap_runs_the_streaming_loop(tiny_model_path):
    """`bootstrap` (the zip's AWS_LAMBDA_EXEC_WRAPPER) started as the managed runtime would start
    it, with the runtime's own command line as arguments: it runs our loop, which streams a
    Function URL event and posts an HTTP API event whole."""
    url = event("chat_function_url.json", stream=True, max_tokens=3)
    http = event("health.json")
    api = FakeRuntimeAPI([("rid-boot-1", url), ("rid-boot-2", http)])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(AWS_LAMBDA_RUNTIME_API=api.address, LAMBDA_TASK_ROOT=str(ROOT), MODEL_PATH=str(tiny_model_path),
               INIT_BUDGET_S="120", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    proc = subprocess.Popen(["sh", str(ROOT / "bootstrap"), "/var/lang/bin/python3.12", "/var/runtime/bootstrap.py"],
                            cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(api.posts) < 2 and proc.poll() is None:
            time.sleep(0.2)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        api.close()
    assert len(api.posts) == 2, out[-3000:]
    streamed = api.posts["rid-boot-1"]
    assert streamed["headers"]["lambda-runtime-function-response-mode"] == "streaming"
    meta, payload = split_prelude(streamed["body"])
    assert meta["statusCode"] == 200 and sse_events(payload)[-1] == "data: [DONE]"
    assert json.loads(api.posts["rid-boot-2"]["body"])["statusCode"] == 200
    assert api.restores == 0                                     # not a SnapStart init: no snapshot


class Hangs:
    """A client that reads three writes and disconnects."""

    def __init__(self):
        self.writes = 0

    def start(self, status, headers):
        pass

    def write(self, data):
        self.writes += 1
        if self.writes > 3:
            raise BrokenPipeError(32, "Broken pipe")

    def end(self, error_type=None, error=None):
        raise BrokenPipeError(32, "Broken pipe")


def test_client_gone_mid_stream_stops_the_generation(rt, capsys, monkeypatch):
    monkeypatch.setattr(rt.engine.tokenizer, "eog_ids", frozenset())
    steps = []
    real = rt.engine.session.step
    monkeypatch.setattr(rt.engine.session, "step", lambda tok: steps.append(1) or real(tok))
    ev = event("chat_function_url.json", stream=True, max_tokens=60)
    capsys.readouterr()
    rt.handle_stream(ev, None, Hangs())           # returns: the warm process is not taken down
    assert len(steps) < 10                        # stopped at the disconnect, not after 60 tokens
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"event":"request"')]
    assert len(lines) == 1 and lines[0]["error_code"] == "stream_closed"
    assert rt.handle(event("chat_http_api.json", max_tokens=2), None)["statusCode"] == 200   # still serving


def test_rest_stream_prelude_is_byte_exact(rt, capsys):
    api = drive(rt, [("rid-rest-s", event("chat_rest_api.json", stream=True, max_tokens=3))])
    post = api.posts["rid-rest-s"]
    assert post["chunks"][0][1] == (
        b'{"statusCode":200,"headers":{"content-type":"text/event-stream; charset=utf-8",'
        b'"cache-control":"no-cache","x-request-id":"rid-rest-s"},"cookies":[]}' + b"\x00" * 8)
    _, payload = split_prelude(post["body"])
    assert sse_events(payload)[-1] == "data: [DONE]"
    capsys.readouterr()
