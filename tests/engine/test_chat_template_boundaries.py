"""engine.chat_template.boundary_offsets: the checkpoint offsets of a rendered chat prompt, read off
the text in a fixed number of renders (rendering every prefix was quadratic: 2,000 messages took
32 s of template_ms). Same offsets as the prefix-by-prefix rule on our factory template (where
every prefix renders as a prefix), each at a turn's role header on the real Qwen3.5 template."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.chat_template import TURN_START, ChatTemplate, boundary_offsets, through_role_header

REPO = Path(__file__).resolve().parents[2]
OURS = ChatTemplate((REPO / "engine/synthetic/qwen35_chat_template.jinja").read_text(encoding="utf-8"))
REAL = ChatTemplate((REPO / "tests/fixtures/templates/Qwen3.5-4B.jinja").read_text(encoding="utf-8"))
SYSTEM = {"role": "system", "content": "You are terse."}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


class Counting:
    def __init__(self, tpl: ChatTemplate):
        self.tpl, self.calls = tpl, 0

    def __call__(self, messages, tools=None, add_generation_prompt=True, **kw):
        self.calls += 1
        return self.tpl.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **kw)


def prefix_rule(tpl: ChatTemplate, messages, tools, text, kw) -> list[int]:
    """The old rule, render by render: the end of each prefix up to the last user message that
    renders as a prefix of `text` (and the template's own system block when tools come without one)."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    offs = set()
    for k in range(1, last_user + 2):
        part = tpl.render(messages[:k], tools=tools, add_generation_prompt=False, **kw)
        if text.startswith(part):
            offs.add(len(part))
    if tools and messages[0]["role"] != "system":
        a = tpl.render([{"role": "user", "content": "a"}], tools=tools, add_generation_prompt=False, **kw)
        b = tpl.render([{"role": "user", "content": "b"}], tools=tools, add_generation_prompt=False, **kw)
        cut = a.rfind(TURN_START, 0, len(os.path.commonprefix([a, b])))
        if cut > 0 and text.startswith(a[:cut]):
            offs.add(cut)
    return sorted({through_role_header(text, o) for o in offs})


CONVERSATIONS = {
    "plain": ([SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
               {"role": "user", "content": "Weather?"}], None),
    "tools": ([SYSTEM, {"role": "user", "content": "Paris?"}], TOOLS),
    "tools_no_system": ([{"role": "user", "content": "Paris?"}], TOOLS),
    "tool_loop": ([SYSTEM, {"role": "user", "content": "Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "20C"}], TOOLS),
    "long": ([SYSTEM] + [{"role": r, "content": f"turn {i}"} for i in range(12)
                         for r in ("user", "assistant")][:-1], None),
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_same_offsets_as_rendering_every_prefix(name):
    messages, tools = CONVERSATIONS[name]
    kw = {"enable_thinking": False}
    text = OURS.render(messages, tools=tools, add_generation_prompt=True, **kw)
    assert boundary_offsets(Counting(OURS), messages, tools, text, kw) == prefix_rule(OURS, messages, tools, text, kw)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_real_template_offsets_sit_after_a_role_header(name):
    messages, tools = CONVERSATIONS[name]
    text = REAL.render(messages, tools=tools, add_generation_prompt=True)
    offs = boundary_offsets(Counting(REAL), messages, tools, text, {})
    assert offs and offs == sorted(set(offs))
    for o in offs:
        start = text.rfind(TURN_START, 0, o)
        assert start >= 0 and text[start:o].count("\n") == 1 and text[o - 1] == "\n", text[start:o]
    # the end of the last user message, through the assistant header, is always one of them
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    part = REAL.render(messages[:last_user + 1], tools=tools, add_generation_prompt=False)
    assert through_role_header(text, len(part)) in offs


def test_two_thousand_messages_take_a_fixed_number_of_renders():
    messages = [SYSTEM] + [{"role": r, "content": f"message number {i}"} for i in range(1000)
                           for r in ("user", "assistant")][:-1]
    assert len(messages) == 2000
    render = Counting(OURS)
    text = OURS.render(messages, add_generation_prompt=True)
    offs = boundary_offsets(render, messages, None, text, {})
    assert render.calls == 1                       # the prefix rule would render 2,000 times
    assert len(offs) == 2000                       # the end of every message, the last user one included
    assert text[:offs[-1]].endswith("message number 999<|im_end|>\n<|im_start|>assistant\n")
