"""Chat templates: OpenAI-style messages -> the prompt text a model was trained on.

GGUF files carry their chat template as Jinja source (``tokenizer.chat_template``), written
for HuggingFace transformers' ``apply_chat_template``. We render it with ``jinja2`` -- the
language *is* Jinja, so a re-implementation would only be a less faithful copy -- in the same
kind of environment transformers uses: ``ImmutableSandboxedEnvironment`` (templates come
from model files, so they must not reach Python internals or mutate our data),
``trim_blocks`` / ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter with
transformers' signature and output (``ensure_ascii=False``, no HTML escaping), and the globals
``raise_exception`` and ``strftime_now``.

Before rendering, messages are normalised the way OpenAI clients send them and Qwen's
template expects them:

- ``content`` given as a list of text parts (``[{"type": "text", "text": ...}]``) becomes one
  string; any other part type is a :class:`TemplateError` naming the message.
- assistant ``tool_calls[*].function.arguments`` given as a JSON string (OpenAI's wire form)
  is parsed into a dict, because the template iterates the arguments as a mapping.

The caller's messages are never modified.

Prefix property (what lets a warm session extend instead of re-prefilling): with our factory
template (engine/synthetic/qwen35_chat_template.jinja) render(turn-1 messages + the reply) is a
prefix of render(turn-2 messages), for plain chat, thinking on or off, and tool loops. With the
real Qwen3.5 template it holds inside a tool loop (between two user messages) but breaks at
every new user message: Qwen3.5 drops the <think> block of assistant turns before the last
user message, so the reusable prefix ends right after turn 1's "<|im_start|>assistant\n" and
the previous reply is read again (tests/engine/test_chat_template_renders_like_jinja.py shows both).
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatPrompt", "ChatTemplate", "TemplateError", "boundary_offsets", "normalise_messages"]


class TemplateError(ValueError):
    """The chat template cannot be compiled or rendered for these messages."""


def _raise_exception(message: str) -> None:
    raise TemplateError(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' filter: json.dumps with these defaults, returned as plain text.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _content_text(content: Any, index: int) -> Any:
    """A message's content as the template should see it: str or None."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str):
                raise TemplateError(
                    f"messages[{index}].content[{j}] is a {kind!r} part; only text parts "
                    "({'type': 'text', 'text': ...}) are supported"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise TemplateError(
        f"messages[{index}].content must be a string, null or a list of text parts, "
        f"not {type(content).__name__}"
    )


def _tool_calls(calls: Any, index: int) -> Any:
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        return calls
    out = []
    for j, call in enumerate(calls):
        if not isinstance(call, Mapping):
            raise TemplateError(f"messages[{index}].tool_calls[{j}] must be an object")
        call = dict(call)
        holder = call
        if isinstance(call.get("function"), Mapping):
            holder = call["function"] = dict(call["function"])
        args = holder.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise TemplateError(
                    f"messages[{index}].tool_calls[{j}].function.arguments is not valid JSON: {e}"
                ) from None
            if not isinstance(args, dict):
                raise TemplateError(
                    f"messages[{index}].tool_calls[{j}].function.arguments must be a JSON "
                    f"object, not {type(args).__name__}"
                )
            holder["arguments"] = args
        out.append(call)
    return out


def normalise_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` with text-part content joined and tool-call arguments parsed."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateError(f"messages must be a list of objects, not {type(messages).__name__}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateError(f"messages[{i}] must be an object, not {type(message).__name__}")
        m = dict(message)
        if "content" in m:
            m["content"] = _content_text(m["content"], i)
        if m.get("tool_calls") is not None:
            m["tool_calls"] = _tool_calls(m["tool_calls"], i)
        out.append(m)
    return out


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# ChatML, as every Qwen template writes it: the markers the engine needs to find turn boundaries
# in a rendered prompt, and the reasoning block a generation prompt may open, live here, with the
# template, and nowhere else.
TURN_START = "<|im_start|>"
THINK_OPEN = "<think>"


@dataclass
class ChatPrompt:
    """A rendered chat prompt, tokenized, with what the template opened.

    boundaries: where the system + tools block ends and where each completed turn before
    the last user message ends — a later request sharing that much of the conversation
    resumes there (on this instance or, via EFS/S3, on another).
    opens_reasoning: the prompt ends inside a reasoning block the template opened (Qwen3.5's
    generation prompt ends ``<think>\n`` when thinking is on), so the reply begins as reasoning:
    text cut before its ``</think>`` (max_tokens, the deadline) is still reasoning.
    """

    text: str
    ids: list[int]
    boundaries: list[int] = field(default_factory=list)
    spliced_tokens: int = 0  # leading ids taken from the warm session (its own reply tokens)
    opens_reasoning: bool = False


def opens_reasoning(rendered: str) -> bool:
    """Whether a rendered generation prompt leaves a reasoning block open for the reply."""
    return rendered.rstrip().endswith(THINK_OPEN)


def through_role_header(text: str, offset: int) -> int:
    """`offset`, moved past the ChatML role header (``<|im_start|>role\n``) that starts there."""
    if text.startswith(TURN_START, offset):
        end = text.find("\n", offset)
        if end != -1:
            return end + 1
    return offset


def boundary_offsets(render: Callable[..., str], messages: list[dict], tools: list[dict] | None, text: str,
                     kw: Mapping[str, Any]) -> list[int]:
    """Character offsets in `text` (the rendered prompt) worth a checkpoint: where the system +
    tools block and each turn up to the end of the last user message end, each carried through
    the role header of the turn that follows (ChatML's ``<|im_start|>user\n``: every conversation
    that shares the prefix shares that header too). The end of the last user message is included:
    the next turn shares it however the reply is rendered (a client that drops reasoning_content
    changes the reply's text, not what precedes it or the ``<|im_start|>assistant\n`` that opens it).

    Linear in the number of messages: the turns are read off `text` itself (every ChatML turn
    starts with ``<|im_start|>``), and only one more render finds the end of the last user
    message (rendering every prefix was quadratic: 2,000 messages took 32 s). `render` is
    ``Engine.render_chat``'s signature: (messages, tools=, add_generation_prompt=, **kw)."""
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                    default=-1)
    offsets: set[int] = set()
    if last_user >= 0:
        try:
            part = render(messages[:last_user + 1], tools=tools, add_generation_prompt=False, **kw)
        except ValueError:
            part = ""
        # a template that renders that prefix differently from the same messages in the whole
        # conversation shares only the common part: turns inside it are still boundaries of `text`
        end = len(part) if part and text.startswith(part) else len(os.path.commonprefix([part, text]))
        pos = text.find(TURN_START, 1)
        while 0 < pos < end:
            offsets.add(pos)
            pos = text.find(TURN_START, pos + 1)
        if part and end == len(part):
            offsets.add(end)
    if tools and messages and isinstance(messages[0], dict) and messages[0].get("role") != "system":
        # Tools without a system message: the template writes a system block of its own.
        # It ends where renders with two different first messages stop agreeing, cut back
        # to the turn start (ChatML, as every Qwen template).
        try:
            a = render([{"role": "user", "content": "a"}], tools=tools, add_generation_prompt=False, **kw)
            b = render([{"role": "user", "content": "b"}], tools=tools, add_generation_prompt=False, **kw)
            same = len(os.path.commonprefix([a, b]))
            cut = a.rfind(TURN_START, 0, same)
            if cut > 0 and text.startswith(a[:cut]):
                offsets.add(cut)
        except ValueError:
            pass
    return sorted({through_role_header(text, o) for o in offsets})


class ChatTemplate:
    """A compiled chat template. ``TemplateError`` if ``source`` is not valid Jinja."""

    def __init__(self, source: str) -> None:
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("chat template source is empty")
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from None

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text. Extra kwargs (``enable_thinking=False`` ...) go to the template."""
        context = dict(kwargs)
        context["messages"] = normalise_messages(messages)
        context["tools"] = list(tools) if tools is not None else None
        context["add_generation_prompt"] = add_generation_prompt
        try:
            return self._template.render(**context)
        except TemplateError:
            raise
        except jinja2.TemplateError as e:  # includes the sandbox's SecurityError
            raise TemplateError(f"chat template failed: {e.message or type(e).__name__}") from None
        except Exception as e:  # TypeError, OverflowError (sandbox range cap), RecursionError ...
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
