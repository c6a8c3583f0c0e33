"""function/streaming.py without a model: the chunks a ChatStream / CompletionStream makes from text
fed a character at a time say exactly what the buffered answer (tool_calls.parse_output) says, no
tag is ever streamed as text, and the writer's keep-alive comments run while nothing else is sent."""
from __future__ import annotations

import json
import time

import pytest

from engine.conventions import ChatConventions
from engine.models.qwen35 import CONVENTIONS as QWEN35
from function import streaming as sse_mod
from function.tool_calls import parse_output

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>")


class Recorder:
    def __init__(self):
        self.chunks: list = []
        self.when: list[int] = []     # how many characters had been fed when each chunk was made
        self.fed = 0

    def send(self, chunk):
        self.chunks.append(chunk)
        self.when.append(self.fed)


def run_chat(text: str, *, tools=None, opens_think=False, finish="stop", include_usage=False, conventions=QWEN35):
    rec = Recorder()
    s = sse_mod.ChatStream(rec, "chatcmpl-1", 1, "m", tools=tools, conventions=conventions, opens_think=opens_think,
                           include_usage=include_usage)
    for ch in text:
        rec.fed += 1
        s.feed(ch)
    sent_finish = s.finish(finish, usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})
    return rec, sent_finish


def joined(rec, key):
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in rec.chunks
                   if isinstance(c, dict) and c["choices"])


CASES = [
    ("Hello, warm Lambda!", None, False),
    ("  leading and trailing  \n", None, False),
    ("<think>\nLet me see.\n</think>\n\nThe answer is 4.", None, False),
    ("I think about it.\n</think>\n\nDone.", None, True),                  # the template opened <think>
    ("Checking the weather.\n\n" + CALL, TOOLS, False),
    ("<think>\nNeed weather.\n</think>\n\n" + CALL, TOOLS, False),
    ("<tool_call>\n<function=unknown>\n</function>\n</tool_call> kept as text", TOOLS, False),
    ("a < b and <thin ice>", None, False),
]


# Hermes JSON calls and no reasoning block (Qwen2.5's conventions): <think> is plain content there
HERMES = ChatConventions("test-hermes", "json", think_open=None, think_close=None)
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
HERMES_CASES = [
    ("Checking the weather.\n\n" + HERMES_CALL, TOOLS, False),
    ("<think>\nnot a marker here\n</think>\n\nThe answer is 4.", None, True),
    (HERMES_CALL + "\n" + CALL, TOOLS, False),      # the XML call is text under these conventions
]


@pytest.mark.parametrize("text,tools,opens,conv", [(*c, QWEN35) for c in CASES] + [(*c, HERMES) for c in HERMES_CASES])
def test_chat_deltas_say_what_the_buffered_answer_says(text, tools, opens, conv):
    rec, finish = run_chat(text, tools=tools, opens_think=opens, conventions=conv)
    parsed = parse_output(text, tools=tools, conventions=conv, prompt_opens_think=opens)
    if conv is HERMES:
        assert parsed.reasoning is None and (tools is None or len(parsed.tool_calls) == 1), parsed
    assert rec.chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert rec.chunks[-1] == "[DONE]"
    assert joined(rec, "content") == (parsed.content or "")
    assert joined(rec, "reasoning_content") == (parsed.reasoning or "")
    assert finish == ("tool_calls" if parsed.tool_calls else "stop")
    finals = [c["choices"][0]["finish_reason"] for c in rec.chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert finals == [finish]
    for c in rec.chunks[1:-1]:
        d = c["choices"][0]["delta"]
        for tag in ("<think>", "</think>", "<tool_call>"):
            assert tag not in (d.get("content") or "") or not parsed.tool_calls and tag == "<tool_call>" \
                or not conv.reasons
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in rec.chunks[1:-1] if "tool_calls" in c["choices"][0]["delta"]]
    if parsed.tool_calls:
        assert calls[0]["id"].startswith("call_") and calls[0]["function"] == {"name": "get_weather", "arguments": ""}
        assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris", "days": 3}
        assert all(c["index"] == 0 for c in calls)
    else:
        assert calls == []


def test_text_streams_before_the_end():
    text = "<think>\nplanning the answer carefully\n</think>\n\nHere is a long answer in many words."
    rec, _ = run_chat(text)
    reasoning_at = [w for c, w in zip(rec.chunks, rec.when) if isinstance(c, dict) and c["choices"]
                    and c["choices"][0]["delta"].get("reasoning_content")]
    content_at = [w for c, w in zip(rec.chunks, rec.when) if isinstance(c, dict) and c["choices"]
                  and c["choices"][0]["delta"].get("content")]
    assert reasoning_at[0] < text.index("</think>")          # reasoning streamed while thinking
    assert content_at[0] < len(text) - 10                    # content streamed before the end
    assert len(content_at) > 10


TWO_TOOLS = TOOLS + [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "opts": {"type": "object"}}}}}]
SEARCH = ('<tool_call>\n<function=search>\n<parameter=q>\nwarm "lambdas"\n</parameter>\n<parameter=opts>\n'
          '{"top": 2}\n</parameter>\n</function>\n</tool_call>')
HERMES_SEARCH = '<tool_call>\n{"name": "search", "arguments": {"q": "warm", "opts": {"top": 2}}}\n</tool_call>'


def _tool_deltas(rec):
    return [(c["choices"][0]["delta"]["tool_calls"][0], w) for c, w in zip(rec.chunks, rec.when)
            if isinstance(c, dict) and c["choices"] and "tool_calls" in c["choices"][0]["delta"]]


@pytest.mark.parametrize("text,conv", [
    ("<think>\nTwo lookups.\n</think>\n\n" + CALL + "\n" + SEARCH, QWEN35),
    ("Checking.\n" + HERMES_CALL + "\n" + HERMES_SEARCH, HERMES),
])
def test_tool_calls_stream_as_openai_deltas_while_they_decode(text, conv):
    # issue 52: tool calls were sent whole at the end; OpenAI streams delta.tool_calls[i]: id, type
    # and name first, then pieces of function.arguments, each call under its own index and id
    rec, finish = run_chat(text, tools=TWO_TOOLS, opens_think=False, conventions=conv)
    parsed = parse_output(text, tools=TWO_TOOLS, conventions=conv)
    assert finish == "tool_calls" and len(parsed.tool_calls) == 2
    deltas = _tool_deltas(rec)
    for i, want in enumerate(parsed.tool_calls):
        mine = [d for d, _ in deltas if d["index"] == i]
        assert mine[0]["id"].startswith("call_") and mine[0]["type"] == "function"
        assert mine[0]["function"] == {"name": want["function"]["name"], "arguments": ""}
        assert all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in mine[1:])
        # the pieces add up to exactly the buffered answer's arguments
        assert "".join(d["function"]["arguments"] for d in mine) == want["function"]["arguments"]
    assert len({d["id"] for d, _ in deltas if "id" in d}) == 2
    # the first call is out, whole, before the second one is written
    first_close = text.index("</tool_call>") + len("</tool_call>")
    assert all(w <= first_close for d, w in deltas if d["index"] == 0)
    if conv is QWEN35:                                   # XML: a piece per parameter as it closes
        assert len([d for d, _ in deltas if d["index"] == 0]) == 4
        assert next(w for d, w in deltas if d["index"] == 0) < text.index("Paris")   # the name comes first


def test_calls_cut_by_the_token_limit_finish_length():
    # parallel calls that run on to max_tokens: the first parsed, the second cut. The reply was cut,
    # so `length`, as the buffered answer says too (tool_calls.finish_reason)
    rec, finish = run_chat(CALL + "\n" + CALL[:60], tools=TOOLS, finish="length")
    assert finish == "length"
    rec, finish = run_chat(CALL, tools=TOOLS, finish="stop")
    assert finish == "tool_calls"


def test_usage_chunk_and_nulls():
    rec, _ = run_chat("hi", include_usage=True)
    assert all(c["usage"] is None for c in rec.chunks[:-2])
    assert rec.chunks[-2]["choices"] == [] and rec.chunks[-2]["usage"]["total_tokens"] == 3


def test_completion_stream():
    rec = Recorder()
    s = sse_mod.CompletionStream(rec, "cmpl-1", 1, "m", include_usage=True)
    for p in ("The ", "warm ", "Lambda"):
        s.feed(p)
    s.finish("length", text="The warm Lambda says", usage={"total_tokens": 9})
    texts = [c["choices"][0]["text"] for c in rec.chunks if isinstance(c, dict) and c["choices"]]
    assert texts == ["The ", "warm ", "Lambda", " says", ""]
    assert rec.chunks[-3]["choices"][0]["finish_reason"] == "length"
    assert rec.chunks[-2]["usage"] == {"total_tokens": 9} and rec.chunks[-1] == "[DONE]"


class FakeHttp:
    def __init__(self):
        self.status = None
        self.writes: list[tuple[float, bytes]] = []

    def start(self, status, headers):
        self.status, self.headers = status, dict(headers)

    def write(self, data):
        self.writes.append((time.monotonic(), data))

    def end(self, error_type=None, error=None):
        pass


def test_writer_keepalive_only_while_idle():
    http = FakeHttp()
    w = sse_mod.SSEWriter(http, {"x-request-id": "r"}, keepalive_s=0.1)
    w.begin()
    assert http.status == 200 and http.headers["content-type"] == sse_mod.SSE_CONTENT_TYPE
    time.sleep(0.55)
    w.send({"a": 1})
    n_keep = w.keepalives
    for _ in range(8):                 # busy: a chunk every 0.03 s leaves no idle 0.1 s
        time.sleep(0.03)
        w.send({"a": 2})
    w.close()
    assert n_keep >= 3 and all(d == sse_mod.KEEPALIVE for _, d in http.writes[:n_keep])
    assert w.keepalives - n_keep <= 1
    assert http.writes[-1][1] == b'data: {"a":2}\n\n'
