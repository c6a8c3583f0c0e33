"""OpenAI request validation: every wrong type is a 400 naming the field; supported fields land
where the engine reads them; response shapes match OpenAI's."""
from __future__ import annotations

import json

import pytest

from engine.models.qwen35 import CONVENTIONS as QWEN35
from engine.sampling import SamplingParams
from function import openai_schema as oa
from function.errors import APIError

MSG = [{"role": "user", "content": "hi"}]


def chat(**kw):
    return oa.parse_chat({"messages": MSG, **kw})


def bad(fn, body, param, status=400):
    with pytest.raises(APIError) as ei:
        fn(body)
    assert ei.value.status == status
    assert ei.value.param == param, ei.value.message
    assert param.split(".")[0].split("[")[0] in ei.value.message
    return ei.value


def test_defaults_and_sampling_fields():
    r = chat(temperature=0, top_p=0.9, top_k=20, min_p=0.05, seed=7, stop="END", max_tokens=5, user="u",
             unknown_field={"x": 1}, presence_penalty=0.0)
    assert (r.sampling.temperature, r.sampling.top_p, r.sampling.top_k, r.sampling.min_p, r.sampling.seed) == \
        (0.0, 0.9, 20, 0.05, 7)
    assert r.stop == ["END"] and r.max_tokens == 5 and not r.stream
    d = chat()
    assert d.max_tokens is None and d.sampling == SamplingParams() and d.stop == []


def test_max_completion_tokens_wins_and_nulls_are_absent():
    assert chat(max_tokens=5, max_completion_tokens=9).max_tokens == 9
    r = chat(temperature=None, max_tokens=None, stop=None, tools=None, stream=None)
    assert r.max_tokens is None and r.sampling.temperature == 1.0 and r.tools is None
    assert chat(top_k=-1).sampling.top_k == 0


@pytest.mark.parametrize("field,value", [
    ("temperature", "hot"), ("temperature", 3), ("temperature", True), ("top_p", 1.5), ("top_p", 0),
    ("top_k", 1.5), ("min_p", -0.1), ("seed", "x"), ("max_tokens", 0), ("max_tokens", "10"),
    ("max_completion_tokens", -1), ("stop", 5), ("stop", ["a", 1]), ("stream", "yes"), ("model", 3),
    ("user", 1), ("n", 2), ("n", "1"), ("logprobs", 3), ("top_logprobs", 3), ("top_logprobs", 21),
    ("response_format", "json"), ("logit_bias", [1]), ("reasoning_effort", "max"),
    ("grammar", 5), ("regex", ""), ("parallel_tool_calls", "no"), ("frequency_penalty", 2.5),
    ("chat_template_kwargs", []), ("tools", {}), ("tool_choice", "sometimes"), ("presence_penalty", "x"),
])
def test_wrong_fields_are_400_naming_the_field(field, value):
    bad(oa.parse_chat, {"messages": MSG, field: value}, field)


def test_n_must_be_one_with_a_clear_message():
    e = bad(oa.parse_chat, {"messages": MSG, "n": 3}, "n")
    assert "one choice" in e.message and e.code == "unsupported_value"
    assert chat(n=1).route == "chat"


@pytest.mark.parametrize("messages,param", [
    (None, "messages"), ("hi", "messages"), ([], "messages"), ([5], "messages[0]"),
    ([{"role": "robot", "content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], "messages[0].content[0].text"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": None,
      "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}], "messages[1].tool_calls[0].function.arguments"),
    ([{"role": "tool", "content": "x", "tool_call_id": 3}], "messages[0].tool_call_id"),
])
def test_message_errors_name_the_exact_path(messages, param):
    body = {"messages": messages} if messages is not None else {}
    bad(oa.parse_chat, body, param)


def test_messages_are_normalised_for_the_template():
    r = oa.parse_chat({"messages": [
        {"role": "developer", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]})
    assert r.messages[0] == {"role": "system", "content": "sys"}
    assert r.messages[1] == {"role": "user", "content": "ab"}
    assert r.messages[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert r.messages[3] == {"role": "tool", "content": "42", "tool_call_id": "call_1"}


TOOLS = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "b"}}]


def test_tool_choice_shapes_what_the_template_sees():
    assert chat(tools=TOOLS).tools == TOOLS and chat(tools=TOOLS).parse_tool_calls
    assert chat(tools=TOOLS, tool_choice="none").tools is None
    assert not chat(tools=TOOLS, tool_choice="none").parse_tool_calls
    named = chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "b"}})
    assert [t["function"]["name"] for t in named.tools] == ["b"]
    bad(oa.parse_chat, {"messages": MSG, "tools": TOOLS, "tool_choice": {"type": "function",
                        "function": {"name": "zzz"}}}, "tool_choice.function.name")
    bad(oa.parse_chat, {"messages": MSG, "tool_choice": "required"}, "tool_choice")
    bad(oa.parse_chat, {"messages": MSG, "tools": [{"type": "function", "function": {"name": ""}}]},
        "tools[0].function.name")
    bad(oa.parse_chat, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "x",
                        "parameters": "nope"}}]}, "tools[0].function.parameters")


def test_template_kwargs_and_stream_options():
    r = chat(chat_template_kwargs={"enable_thinking": False}, stream=True, stream_options={"include_usage": True})
    assert r.template_kwargs == {"enable_thinking": False} and r.stream and r.include_usage
    bad(oa.parse_chat, {"messages": MSG, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage")


def test_completion_prompts():
    assert oa.parse_completion({"prompt": "x"}).prompt == "x"
    # the one place each route's max_tokens default lives: completions OpenAI's 16, chat None
    assert oa.parse_completion({"prompt": "x"}).max_tokens == oa.DEFAULT_COMPLETION_MAX_TOKENS == 16
    assert oa.parse_completion({"prompt": "x", "max_tokens": 3}).max_tokens == 3
    assert oa.parse_completion({"prompt": ["x"]}).prompt == "x"
    assert oa.parse_completion({"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    assert oa.parse_completion({"prompt": [[1, 2]]}).prompt == [1, 2]
    for body, param in [({}, "prompt"), ({"prompt": 5}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"),
                        ({"prompt": [1, -2]}, "prompt"), ({"prompt": "x", "echo": True}, "echo"),
                        ({"prompt": "x", "best_of": 2}, "best_of"), ({"prompt": "x", "suffix": "y"}, "suffix")]:
        bad(oa.parse_completion, body, param)


def test_response_shapes():
    u = oa.usage(10, 3, 4)
    assert u == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                 "prompt_tokens_details": {"cached_tokens": 4}}
    msg = oa.chat_message("", "why", [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}])
    assert msg["content"] is None and msg["reasoning_content"] == "why"
    c = oa.chat_completion("chatcmpl-1", 1, "m", oa.chat_message("hi", None, None), "stop", u)
    assert c["object"] == "chat.completion" and c["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    t = oa.text_completion("cmpl-1", 1, "m", "x", "length", u)
    assert t["object"] == "text_completion" and t["choices"][0]["text"] == "x"
    assert oa.model_list("m", 5)["data"][0] == {"id": "m", "object": "model", "created": 5, "owned_by": "warmllm"}


def test_sse_body_is_data_lines_ending_done():
    from function.streaming import ChatStream, Collector
    out = Collector()
    s = ChatStream(out, "id", 1, "m", tools=None, conventions=QWEN35, opens_think=False, include_usage=True)
    for piece in ("<think>r</think>", "He", "llo"):
        s.feed(piece)
    s.finish("stop", usage=oa.usage(1, 2))
    body = out.body()
    events = [e for e in body.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    parsed = [json.loads(e[6:]) for e in events[:-1]]
    assert parsed[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(p["choices"][0]["delta"].get("content", "") for p in parsed if p["choices"]) == "Hello"
    assert "".join(p["choices"][0]["delta"].get("reasoning_content", "") for p in parsed if p["choices"]) == "r"
    assert parsed[-2]["choices"][0]["finish_reason"] == "stop"
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["total_tokens"] == 3


def test_structured_output_fields_and_their_aliases():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert (r.structured.kind, r.structured.value, r.structured.param) == (
        "json_schema", schema, "response_format.json_schema.schema")
    assert chat(response_format={"type": "json_object"}).structured.value == {"type": "object"}
    assert chat(response_format={"type": "text"}).structured is None
    assert chat(grammar='start: "a"').structured.kind == "grammar"
    assert chat(regex="[0-9]+").structured.kind == "regex"
    assert chat(structured_outputs={"choice": ["a", "b"]}).structured.value == ["a", "b"]
    assert chat(guided_json=json.dumps(schema)).structured.value == schema
    e = bad(oa.parse_chat, {"messages": MSG, "regex": "a", "grammar": "b"}, "regex")
    assert "both" in e.message
    bad(oa.parse_chat, {"messages": MSG, "response_format": {"type": "xml"}}, "response_format.type")


def test_sampling_extras_reasoning_effort_and_logprobs():
    r = chat(logit_bias={"17": -100, "3": 5.5}, presence_penalty=0.5, frequency_penalty=-1)
    assert r.sampling.logit_bias == {17: -100.0, 3: 5.5}
    assert (r.sampling.presence_penalty, r.sampling.frequency_penalty) == (0.5, -1.0)
    assert chat(reasoning_effort="none").template_kwargs["enable_thinking"] is False
    assert "enable_thinking" not in chat(reasoning_effort="high").template_kwargs
    r = chat(logprobs=True, top_logprobs=20)
    assert (r.logprobs, r.top_logprobs) == (True, 20)
    c = oa.parse_completion({"prompt": "x", "logprobs": 3})
    assert (c.logprobs, c.top_logprobs) == (True, 3)
    assert chat(parallel_tool_calls=False).parallel_tool_calls is False
    bad(oa.parse_chat, {"messages": MSG, "logit_bias": {"x": 1}}, "logit_bias.x")
    bad(oa.parse_chat, {"messages": MSG, "logit_bias": {"5": 101}}, "logit_bias.5")
