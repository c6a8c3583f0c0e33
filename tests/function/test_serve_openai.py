"""``make serve`` with the official ``openai`` client: chat, completion, streaming, models and an
error, through real HTTP on 127.0.0.1 into HTTP API v2 events and the handler."""
from __future__ import annotations

import json
import time

import openai
import pytest

from tests.function.warm import start_serve, stop_serve, warm_runtime


@pytest.fixture(scope="module")
def server(tiny_model_path):
    proc, url = start_serve(tiny_model_path)
    if url is None:
        proc.kill()
        pytest.fail("serve did not start: " + (proc.stderr.read() if proc.stderr else ""))
    yield url
    stop_serve(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=120)


def test_models(client):
    models = client.models.list()
    assert len(models.data) == 1 and models.data[0].object == "model"
    assert client.models.retrieve(models.data[0].id).id == models.data[0].id


def test_chat(client):
    r = client.chat.completions.create(model="warmllm", messages=[{"role": "user", "content": "Hello there"}],
                                       max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert isinstance(r.choices[0].message.content, str)


def test_completion(client):
    r = client.completions.create(model="warmllm", prompt="The warm Lambda says", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens <= 6
    assert isinstance(r.choices[0].text, str)


def test_stream_equals_plain(client):
    kw = dict(model="warmllm", messages=[{"role": "user", "content": "Stream me"}], max_tokens=10, temperature=0)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (plain.choices[0].message.content or "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [plain.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_completion_stream(client):
    chunks = list(client.completions.create(model="warmllm", prompt="Once", max_tokens=5, temperature=0,
                                            stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_errors_reach_the_client_as_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="warmllm", messages=[{"role": "user", "content": "x"}], n=2)
    assert ei.value.status_code == 400 and ei.value.body["param"] == "n"
    with pytest.raises(openai.APIStatusError) as ei:
        client.chat.completions.create(model="warmllm", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=10 ** 8)
    assert ei.value.status_code == 413 and ei.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="warmllm", input="x")


def test_structured_outputs_tool_choice_and_logprobs_with_the_official_client(client):
    """The issue's first-user check, with the openai client: a json_schema response, a required tool
    call (streamed too), logprobs parsed into the client's types."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="warmllm", messages=[{"role": "user", "content": "A digit"}], max_tokens=20,
        response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": schema, "strict": True}},
        reasoning_effort="none", logprobs=True, top_logprobs=2, seed=7)
    assert 0 <= json.loads(r.choices[0].message.content)["n"] <= 9
    tops = [len(e.top_logprobs) for e in r.choices[0].logprobs.content]
    # a token the grammar forces ('{"') has no alternative; the digit has ten, two reported
    assert tops[0] == 1 and 2 in tops and max(tops) == 2
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["k"]}}}]
    r = client.chat.completions.create(model="warmllm", messages=[{"role": "user", "content": "Pick"}],
                                       tools=tools, tool_choice="required", max_tokens=60, reasoning_effort="none",
                                       parallel_tool_calls=False, seed=7)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and 1 <= json.loads(call.function.arguments)["k"] <= 3
    stream = client.chat.completions.create(model="warmllm", messages=[{"role": "user", "content": "Pick"}],
                                            tools=tools, tool_choice="required", max_tokens=60,
                                            reasoning_effort="none", stream=True, parallel_tool_calls=False, seed=7)
    deltas = [tc for chunk in stream for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices]
    # the first delta names the call, the next carry its argument text (OpenAI's stream shape)
    args = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
    assert deltas and deltas[0].function.name == "pick" and 1 <= json.loads(args)["k"] <= 3
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="warmllm", messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "bad", "schema": {"type": "string", "format": "nope"}}})
    assert "nope" in str(e.value)


def test_stream_arrives_while_the_engine_decodes(tiny_model_path, monkeypatch):
    """`make serve`'s server in this process (same clock as the engine): the openai client's first
    text chunk arrives before the engine decodes its last token (the engine's own timestamps:
    Session.step wrapped), and the chunks arrive spread over the decode, not in one burst."""
    from function.serve import serve_in_thread

    rt = warm_runtime(tiny_model_path, STREAM_KEEPALIVE_S="0")
    monkeypatch.setattr(rt.engine.tokenizer, "eog_ids", frozenset())
    steps: list[float] = []
    real = rt.engine.session.step

    def timed(tok):
        out = real(tok)
        steps.append(time.monotonic())
        return out

    monkeypatch.setattr(rt.engine.session, "step", timed)
    with serve_in_thread(rt) as (url, _):
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        arrivals = []
        stream = c.chat.completions.create(model="warmllm", messages=[{"role": "user", "content": "Count"}],
                                           max_tokens=48, temperature=1.0, seed=1, stream=True)
        for chunk in stream:
            d = chunk.choices[0].delta if chunk.choices else None
            text = d and ((d.content or "") + (getattr(d, "reasoning_content", None) or ""))
            if text:
                arrivals.append(time.monotonic())
        decode = list(steps)                # the stream's decode steps only
        plain = c.chat.completions.create(model="warmllm", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        assert plain.object == "chat.completion"
    assert len(decode) == 47 and len(arrivals) >= 10
    assert arrivals[0] < decode[-1], "the first chunk must arrive before the last token is decoded"
    assert sum(a < decode[-1] for a in arrivals) >= len(arrivals) // 2


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_ends_the_server_with_status_0(tiny_model_path, sig):
    # issue 52: stopping `make serve` ended in "Error 143" (SIGTERM's default: killed)
    import signal

    proc, url = start_serve(tiny_model_path)
    try:
        assert url is not None
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=60) == 0
        assert proc.stderr is not None and "serve_stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
