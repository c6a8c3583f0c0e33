"""Chat templates: engine/chat_template.py with our template and the real Qwen3.5 one."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from engine.chat_template import ChatTemplate, TemplateError, opens_reasoning
from engine.models.qwen35 import CONVENTIONS as QWEN35
from engine.synthetic.vocab import build_vocab
from engine.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[2]
OURS = ChatTemplate((REPO / "engine/synthetic/qwen35_chat_template.jinja").read_text(encoding="utf-8"))
REAL = ChatTemplate((REPO / "tests/fixtures/templates/Qwen3.5-4B.jinja").read_text(encoding="utf-8"))
BOTH = pytest.mark.parametrize("tpl", [OURS, REAL], ids=["ours", "qwen3.5"])

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo actuelle d'une ville",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]

TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": [1, 2], "opts": {"u": "c"}})},
}


@BOTH
def test_system_and_user(tpl: ChatTemplate) -> None:
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]
    assert tpl.render(msgs) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    assert tpl.render(msgs, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    )


@BOTH
def test_thinking_switch(tpl: ChatTemplate) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    assert tpl.render(msgs, enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tpl.render(msgs, enable_thinking=True).endswith("<|im_start|>assistant\n<think>\n")


@BOTH
def test_tools_in_system_turn(tpl: ChatTemplate) -> None:
    out = tpl.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}], tools=TOOLS)
    assert out.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
    # tojson as transformers does it: ensure_ascii=False, ", " / ": " separators
    assert "\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in out
    assert "Météo" in out
    assert "</IMPORTANT>\n\nBe brief.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n" in out


@BOTH
def test_tool_calls_and_tool_results(tpl: ChatTemplate) -> None:
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "Use the tool.", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 18}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "second result"},
    ]
    out = tpl.render(msgs, tools=TOOLS)
    assert out.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n\nLet me check.\n\n"
        "<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n"
        '<parameter=days>\n[1, 2]\n</parameter>\n'
        '<parameter=opts>\n{"u": "c"}\n</parameter>\n'
        "</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"t\": 18}\n</tool_response>\n"
        "<tool_response>\nsecond result\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


@BOTH
def test_tool_call_without_content_and_several_calls(tpl: ChatTemplate) -> None:
    second = {"type": "function", "function": {"name": "noop", "arguments": "{}"}}
    msgs = [{"role": "user", "content": "Go"}, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL, second]}]
    out = tpl.render(msgs, add_generation_prompt=False)
    assert "<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n" in out
    assert "</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call><|im_end|>\n" in out


def test_ours_equals_qwen35_within_one_user_query() -> None:
    """After the last user message Qwen3.5 keeps <think> blocks too, so the two agree."""
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
        {"role": "assistant", "content": "<think>\nplan\n</think>\n\nChecking.", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "18C"},
        {"role": "assistant", "content": "It is 18 °C.", "reasoning_content": "done"},
    ]
    for kwargs in ({}, {"enable_thinking": False}):
        for gen in (True, False):
            assert OURS.render(msgs, tools=TOOLS, add_generation_prompt=gen, **kwargs) == \
                REAL.render(msgs, tools=TOOLS, add_generation_prompt=gen, **kwargs)


def _turns(reasoning: str) -> tuple[list[dict], dict, list[dict]]:
    turn1 = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"}]
    reply = {"role": "assistant", "content": "Hi! How can I help?"}
    if reasoning:
        reply["reasoning_content"] = reasoning
    turn2 = turn1 + [reply, {"role": "user", "content": "Tell me a joke."}]
    return turn1, reply, turn2


@pytest.mark.parametrize("reasoning", ["", "The user greets me."])
@pytest.mark.parametrize("thinking", [True, False])
def test_prefix_property_ours_plain_chat(reasoning: str, thinking: bool) -> None:
    turn1, reply, turn2 = _turns(reasoning)
    kw = {"enable_thinking": thinking}
    history = OURS.render(turn1 + [reply], add_generation_prompt=False, **kw)
    nxt = OURS.render(turn2, **kw)
    assert nxt.startswith(history)
    # ... and the generation prompt is where the reply's rendering starts (the model's own
    # tokens continue it) -- except for a reply with reasoning to a prompt that disabled
    # thinking, which a model following the prompt does not produce
    prompt = OURS.render(turn1, **kw)
    assert history.startswith(prompt) == (thinking or not reasoning)
    # three turns: still a chain of prefixes
    reply2 = {"role": "assistant", "content": "Why did the cache miss? It was cold."}
    turn3 = turn2 + [reply2, {"role": "user", "content": "Another"}]
    assert OURS.render(turn3, **kw).startswith(OURS.render(turn2 + [reply2], add_generation_prompt=False, **kw))


def test_prefix_property_ours_token_level() -> None:
    tok = Tokenizer.from_gguf_metadata(build_vocab(2048).metadata())
    turn1, reply, turn2 = _turns("thinking about it")
    a = tok.encode(OURS.render(turn1 + [reply], add_generation_prompt=False))
    b = tok.encode(OURS.render(turn2))
    assert b[: len(a)] == a and len(b) > len(a)
    assert a[-2:] == [tok.token_id("<|im_end|>"), tok.encode("\n")[0]]


def test_prefix_property_qwen35_breaks_on_past_thinking() -> None:
    """Qwen3.5 drops the <think> block of assistant turns before the last user message."""
    turn1, reply, turn2 = _turns("The user greets me.")
    history = REAL.render(turn1 + [reply], add_generation_prompt=False)
    nxt = REAL.render(turn2)
    assert not nxt.startswith(history)
    assert "<think>\nThe user greets me.\n</think>" in history and "The user greets me." not in nxt
    # the common prefix ends right after turn 1's "<|im_start|>assistant\n": a warm session
    # keeps the system prompt and every earlier message, and re-reads the reply
    common = REAL.render(turn1, add_generation_prompt=False) + "<|im_start|>assistant\n"
    assert history.startswith(common) and nxt.startswith(common)
    # the same holds with thinking disabled (the empty <think></think> is dropped too)
    h0 = REAL.render(turn1 + [reply], add_generation_prompt=False, enable_thinking=False)
    assert not REAL.render(turn2, enable_thinking=False).startswith(h0)


def test_prefix_property_qwen35_holds_within_a_tool_loop() -> None:
    """Between two user messages (an agent's tool loop) Qwen3.5 keeps every turn as is."""
    turn1 = [{"role": "user", "content": "Weather in Paris?"}]
    reply1 = {"role": "assistant", "content": "", "reasoning_content": "call it", "tool_calls": [TOOL_CALL]}
    turn2 = turn1 + [reply1, {"role": "tool", "content": "18C"}]
    reply2 = {"role": "assistant", "content": "18 °C.", "reasoning_content": "answer"}
    for tpl in (OURS, REAL):
        h1 = tpl.render(turn1 + [reply1], tools=TOOLS, add_generation_prompt=False)
        assert tpl.render(turn2, tools=TOOLS).startswith(h1)
        assert tpl.render(turn2, tools=TOOLS).startswith(tpl.render(turn1, tools=TOOLS))
        h2 = tpl.render(turn2 + [reply2], tools=TOOLS, add_generation_prompt=False)
        assert h2.startswith(tpl.render(turn2, tools=TOOLS))


def test_preserve_thinking_false_gives_qwen35_behaviour() -> None:
    turn1, reply, turn2 = _turns("The user greets me.")
    assert OURS.render(turn2, preserve_thinking=False) == REAL.render(turn2)


def test_content_parts_and_arguments_are_normalised_without_mutation() -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    ]
    before = copy.deepcopy(msgs)
    out = OURS.render(msgs)
    assert "<|im_start|>user\nab<|im_end|>" in out and "<parameter=city>\nParis\n" in out
    assert msgs == before


def test_non_text_part_names_the_message() -> None:
    msgs = [{"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(TemplateError, match=r"messages\[1\]\.content\[0\].*image_url"):
        OURS.render(msgs)


def test_bad_tool_arguments() -> None:
    bad = {"type": "function", "function": {"name": "f", "arguments": "{not json"}}
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [bad]}]
    with pytest.raises(TemplateError, match=r"messages\[1\]\.tool_calls\[0\].*not valid JSON"):
        OURS.render(msgs)
    bad["function"]["arguments"] = "[1, 2]"
    with pytest.raises(TemplateError, match="JSON object"):
        OURS.render(msgs)


def test_template_errors() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% if messages %}unterminated")
    with pytest.raises(TemplateError, match="empty"):
        ChatTemplate("")
    # raise_exception from the template keeps its message
    with pytest.raises(TemplateError, match="System message must be at the beginning"):
        REAL.render([{"role": "user", "content": "a"}, {"role": "system", "content": "late"}])
    with pytest.raises(TemplateError, match="No messages provided"):
        OURS.render([])
    with pytest.raises(TemplateError, match="Unexpected message role"):
        OURS.render([{"role": "wizard", "content": "a"}])
    assert issubclass(TemplateError, ValueError)


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ messages.append({'role': 'user'}) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ range(10**9) | list | length }}",
])
def test_sandbox_blocks_internals_and_mutation(source: str) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError):
        ChatTemplate(source).render(msgs)
    assert msgs == [{"role": "user", "content": "hi"}]


def test_sandbox_hides_function_globals() -> None:
    assert ChatTemplate("[{{ raise_exception.__globals__ }}]").render([{"role": "user", "content": "hi"}]) == "[]"


def test_helpers_and_kwargs() -> None:
    tpl = ChatTemplate(
        "{{ {'a': 'é<b>'} | tojson }}|{{ [1, {'b': 2}] | tojson(indent=2) }}|"
        "{{ {'a': 1, 'b': 2} | tojson(separators=(',', ':')) }}|{{ strftime_now('%Y') | length }}|"
        "{{ custom }}|{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    )
    out = tpl.render([{"role": "user", "content": "x"}], custom="K")
    assert out == '{"a": "é<b>"}|[\n  1,\n  {\n    "b": 2\n  }\n]|{"a":1,"b":2}|4|K|01'


def test_trim_and_lstrip_blocks() -> None:
    tpl = ChatTemplate("A\n  {% if true %}\nB\n  {% endif %}\nC")
    assert tpl.render([]) == "A\nB\nC"


def test_a_turn_boundary_moves_past_the_role_header_that_starts_there():
    from engine.chat_template import TURN_START, through_role_header

    text = f"sys{TURN_START}user\nhello"
    assert through_role_header(text, 3) == text.index("hello")
    assert through_role_header(text, 0) == 0 and through_role_header(f"a{TURN_START}user", 1) == 1  # no header / no newline


@BOTH
def test_the_generation_prompt_says_whether_it_opened_reasoning(tpl):
    """Qwen3.5's generation prompt ends `<think>\\n` with thinking on: the reply begins as
    reasoning (ChatPrompt.opens_reasoning, what the function reads instead of the text)."""
    msgs = [{"role": "user", "content": "Hi"}]
    assert opens_reasoning(tpl.render(msgs), QWEN35.think_open)
    assert not opens_reasoning(tpl.render(msgs, enable_thinking=False), QWEN35.think_open)  # <think>\n\n</think>: closed
    assert not opens_reasoning(tpl.render(msgs, add_generation_prompt=False), QWEN35.think_open)
    assert not opens_reasoning(tpl.render(msgs), None)  # a family that does not reason
