"""The deadline bounds every stage. A delay is planted in one stage at a time (template, each
prefill chunk, each decode step, the snapshot restore); the answer comes back within the deadline
plus one chunk of that work, with the right status and ``deadline_hit``; a prompt the measured
prefill rate cannot finish is refused before any prefill; a stream that runs out of time ends with
``finish_reason: "length"``, a final chunk and ``[DONE]``. Stage fields sum to ``total_ms`` on each
path, snapshot restores included (restore_ms used to be counted inside prefill_ms as well)."""
from __future__ import annotations

import json
import time

import pytest

from function.admission import PrefillRate
from function.request_log import STAGES, TOLERANCE_FRAC, TOLERANCE_MS
from tests.function.warm import warm_runtime

from .test_handler import Ctx, body_of, call, with_body

MARGIN_S = 0.5          # DEADLINE_MARGIN_S default: the deadline is remaining - 0.5 s
SLACK_S = 0.6           # building and writing the answer, the test's own overhead on a loaded host (load ~15 here)


@pytest.fixture(scope="module")
def rt(tiny_model_path):
    return warm_runtime(tiny_model_path, STREAM_KEEPALIVE_S="0")


@pytest.fixture(autouse=True)
def fresh(rt, monkeypatch):
    rt.prefill_rate = PrefillRate()              # no estimate: nothing refused unless a test measures one
    rt.engine.session.reset()
    monkeypatch.setattr(rt.engine.session, "prefill_chunk", 8)
    yield
    rt.engine.session.reset()


def assert_stages_sum(line):
    tol = TOLERANCE_MS + TOLERANCE_FRAC * line["total_ms"]
    assert abs(sum(line[s] for s in STAGES) - line["total_ms"]) <= tol, {s: line[s] for s in STAGES + ("total_ms",)}


def long_messages(n_words: int = 60) -> list[dict]:
    return [{"role": "user", "content": " ".join(f"word{i}" for i in range(n_words))}]


def timed(rt, ev, capsys, remaining_s: float):
    t = time.monotonic()
    resp, line = call(rt, ev, capsys, ctx=Ctx(remaining_ms=int(remaining_s * 1000)))
    return resp, line, time.monotonic() - t


def test_slow_template(rt, capsys, monkeypatch):
    real = rt.engine.chat_prompt

    def slow(*a, **kw):
        time.sleep(1.0)
        return real(*a, **kw)

    monkeypatch.setattr(rt.engine, "chat_prompt", slow)
    resp, line, took = timed(rt, with_body("chat_http_api.json", max_tokens=50, messages=long_messages()), capsys,
                             remaining_s=1.3)               # deadline at 0.8 s: inside the template
    b = body_of(resp)
    assert resp["statusCode"] == 200 and b["choices"][0]["finish_reason"] == "length"
    assert line["deadline_hit"] is True and b["usage"]["completion_tokens"] == 0
    assert line["prefilled_tokens"] == 0                    # the prefill never started
    assert took < 1.0 + SLACK_S                             # the template's own time, nothing more
    assert_stages_sum(line)


def test_slow_prefill_stops_between_chunks(rt, capsys, monkeypatch):
    model = rt.engine.model
    real = model.forward_capturing
    calls = []

    def slow(tokens, *a, **kw):
        calls.append(len(tokens))
        time.sleep(0.25)
        return real(tokens, *a, **kw)

    monkeypatch.setattr(model, "forward_capturing", slow)
    deadline_s = 1.0
    resp, line, took = timed(rt, with_body("chat_http_api.json", max_tokens=20, messages=long_messages(80)), capsys,
                             remaining_s=deadline_s + MARGIN_S)
    b = body_of(resp)
    assert resp["statusCode"] == 200 and b["choices"][0]["finish_reason"] == "length"
    assert line["deadline_hit"] is True and 0 < line["prefilled_tokens"] < line["prompt_tokens"]
    assert line["prefilled_tokens"] == sum(calls) and max(calls) <= 8
    assert took < deadline_s + 0.25 + SLACK_S               # the deadline plus one chunk of prefill
    assert_stages_sum(line)


def slow_decode(rt, monkeypatch, seconds: float = 0.1):
    """Each decode step takes `seconds` longer, no end-of-generation token ends it early, and the
    prompt is prefilled in one pass: the decode is what runs into the deadline."""
    monkeypatch.setattr(rt.engine.session, "prefill_chunk", 512)
    monkeypatch.setattr(rt.engine.tokenizer, "eog_ids", frozenset())
    real = rt.engine.session.step

    def slow(tok):
        time.sleep(seconds)
        return real(tok)

    monkeypatch.setattr(rt.engine.session, "step", slow)


def test_slow_decode(rt, capsys, monkeypatch):
    slow_decode(rt, monkeypatch)
    deadline_s = 2.0          # room for the prefill on a loaded host; 100 steps would take 10 s
    resp, line, took = timed(rt, with_body("chat_http_api.json", max_tokens=100), capsys,
                             remaining_s=deadline_s + MARGIN_S)
    b = body_of(resp)
    assert resp["statusCode"] == 200 and b["choices"][0]["finish_reason"] == "length"
    assert line["deadline_hit"] is True and 0 < b["usage"]["completion_tokens"] < 100
    assert took < deadline_s + 0.1 + SLACK_S
    assert_stages_sum(line)


SYSTEM = {"role": "system", "content": "You are a careful assistant who answers in one short sentence. " * 3}


def warm_snapshot(rt, capsys):
    """A first conversation leaves the system block's checkpoint in the memory tier."""
    call(rt, with_body("chat_http_api.json", max_tokens=2, messages=[SYSTEM, {"role": "user", "content": "First."}]),
         capsys)


def slow_fork(monkeypatch, seconds: float):
    from engine.state import State
    real = State.fork

    def slow(self):
        time.sleep(seconds)
        return real(self)

    monkeypatch.setattr(State, "fork", slow)


def test_snapshot_restore_is_counted_once(rt, capsys, monkeypatch):
    monkeypatch.setattr(rt.engine.session, "prefill_chunk", 512)
    warm_snapshot(rt, capsys)
    slow_fork(monkeypatch, 0.6)
    other = with_body("chat_http_api.json", max_tokens=2,
                      messages=[SYSTEM, {"role": "user", "content": "Another conversation entirely."}])
    _, line = call(rt, other, capsys)
    assert line["prefill_mode"] == "snapshot_memory"
    assert line["restore_ms"] >= 600
    # counted once: inside prefill_ms as well, the stages would sum to total_ms + 600 ms
    assert_stages_sum(line)


def test_slow_snapshot_restore_then_deadline(rt, capsys, monkeypatch):
    warm_snapshot(rt, capsys)
    slow_fork(monkeypatch, 1.0)
    other = with_body("chat_http_api.json", max_tokens=20,
                      messages=[SYSTEM, {"role": "user", "content": "Yet another conversation. " * 10}])
    resp, line, took = timed(rt, other, capsys, remaining_s=0.8 + MARGIN_S)
    b = body_of(resp)
    assert resp["statusCode"] == 200 and line["deadline_hit"] is True
    assert b["choices"][0]["finish_reason"] == "length" and b["usage"]["completion_tokens"] == 0
    assert line["prefill_mode"] == "snapshot_memory" and line["restore_ms"] >= 1000
    assert took < 1.0 + SLACK_S
    assert_stages_sum(line)


def test_a_chat_prompts_tokenizer_time_is_tokenize_ms(rt, capsys, monkeypatch):
    # issue 52: chat tokenize_ms read ~0 while the tokenizer's time sat inside template_ms
    tok = rt.engine.tokenizer
    real = tok.encode_text

    def slow(text):
        time.sleep(0.2)
        return real(text)

    monkeypatch.setattr(tok, "encode_text", slow)
    _, line = call(rt, with_body("chat_http_api.json", max_tokens=1), capsys)
    assert line["tokenize_ms"] >= 200 > line["template_ms"], line
    assert_stages_sum(line)


def test_prompt_that_cannot_fit_is_refused_before_any_prefill(rt, capsys, monkeypatch):
    # measure the rate for real: one prefill of a long prompt
    _, first = call(rt, with_body("chat_http_api.json", max_tokens=1, messages=long_messages(120)), capsys)
    assert first["prefilled_tokens"] >= 32 and rt.prefill_rate.tokens_per_s is not None
    rt.engine.session.reset()
    model = rt.engine.model
    calls = []
    real = model.forward_capturing
    monkeypatch.setattr(model, "forward_capturing", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    # a rate it cannot meet in the 50 ms left (tokens_within is rate * 0.9 * seconds)
    rt.prefill_rate.tokens_per_s = 100.0
    ev = with_body("chat_http_api.json", max_tokens=5, messages=long_messages(200))
    resp, line = call(rt, ev, capsys, ctx=Ctx(remaining_ms=int((0.05 + MARGIN_S) * 1000)))
    err = body_of(resp)["error"]
    assert resp["statusCode"] == 413 and err["code"] == "prompt_exceeds_deadline" and err["param"] == "messages"
    assert "tokens fit" in err["message"] and "100 tokens/s" in err["message"]
    assert calls == []                                   # no prefill time was burnt
    assert line["error_code"] == "prompt_exceeds_deadline"
    # tokenizing the 200 words happened before the refusal: counted, not lost between stages
    # (CI under load: 16 ms in no stage, total 20.6 ms against stages summing to 4.7)
    assert line["tokenize_ms"] > 0
    assert_stages_sum(line)
    # with time to spare the same request is served
    resp, _ = call(rt, ev, capsys, ctx=Ctx(remaining_ms=60_000))
    assert resp["statusCode"] == 200 and calls


class Collect:
    def __init__(self):
        self.status = None
        self.data = b""
        self.ended = None

    def start(self, status, headers):
        self.status = status

    def write(self, data):
        self.data += data

    def end(self, error_type=None, error=None):
        self.ended = error_type


def test_stream_that_hits_its_deadline_ends_with_a_final_chunk(rt, capsys, monkeypatch):
    slow_decode(rt, monkeypatch)
    ev = with_body("chat_function_url.json", stream=True, max_tokens=200)
    out = Collect()
    capsys.readouterr()
    t = time.monotonic()
    rt.handle_stream(ev, Ctx(remaining_ms=int((1.0 + MARGIN_S) * 1000)), out)
    took = time.monotonic() - t
    events = [e for e in out.data.decode().split("\n\n") if e]
    assert out.status == 200 and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["choices"][0]["delta"] == {}
    assert took < 1.0 + 0.1 + SLACK_S
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith('{"event":"request"')]
    assert len(lines) == 1 and lines[0]["deadline_hit"] is True and lines[0]["tokens_out"] < 200
