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

Bounded work: a template comes from the model file, and the sandbox blocks escapes but not
work (``lipsum(100000)`` took 34 s, string doubling reached 3.3 GB, ``tojson(indent=10**9)``
3 GB). Rendering therefore runs through ``Template.generate()`` with an output limit
(``max_chars``) and a time limit (``time_limit_s``), and every place a template can make a big
value is checked *before* it is made: the ``*``, ``+``, ``%`` and ``**`` operators, ``~``
concatenation and ``{% set %}`` blocks, every filter and every call (integer arguments, format
widths, ``replace``/``join`` results, ``lipsum``). A loop that makes no output is stopped by an
exception raised in the rendering thread when the time is up (``PyThreadState_SetAsyncExc``).
Either overrun is a :class:`TemplateLimitError` (a 400 to an API caller).

Prefix property (what lets a warm session extend instead of re-prefilling): with our factory
template (engine/synthetic/qwen35_chat_template.jinja) render(turn-1 messages + the reply) is a
prefix of render(turn-2 messages), for plain chat, thinking on or off, and tool loops. With the
real Qwen3.5 template it holds inside a tool loop (between two user messages) but breaks at
every new user message: Qwen3.5 drops the <think> block of assistant turns before the last
user message, so the reusable prefix ends right after turn 1's "<|im_start|>assistant\n" and
the previous reply is read again (tests/engine/test_chat_template_renders_like_jinja.py shows both).
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from engine.settings import DEFAULT_TEMPLATE_MAX_CHARS, DEFAULT_TEMPLATE_TIME_S

__all__ = ["ChatPrompt", "ChatTemplate", "TemplateError", "TemplateLimitError", "boundary_offsets",
           "normalise_messages"]

# TEMPLATE_MAX_CHARS / TEMPLATE_TIME_S (engine/settings.py): 4x the largest prompt the function
# accepts; two seconds for all the renders of one chat prompt
DEFAULT_MAX_CHARS = DEFAULT_TEMPLATE_MAX_CHARS
DEFAULT_TIME_LIMIT_S = DEFAULT_TEMPLATE_TIME_S
MAX_TOJSON_INDENT = 32


class TemplateError(ValueError):
    """The chat template cannot be compiled or rendered for these messages."""


class TemplateLimitError(TemplateError):
    """Rendering would exceed the output-size or time limit."""


class _Timeout(BaseException):
    # raised asynchronously in the rendering thread; a BaseException so that no `except
    # Exception` in jinja's runtime or a template's callee swallows it
    pass


@dataclass
class _Budget:
    max_chars: int
    deadline: float          # time.monotonic()

    def size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            shown = str(n) if n < 10 ** 18 else "more than 10**18"     # str() of a huge int fails
            raise TemplateLimitError(f"chat template {what} would be {shown} characters; the limit is "
                                     f"{self.max_chars} (TEMPLATE_MAX_CHARS)")

    def clock(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError("chat template rendering ran past its time limit (TEMPLATE_TIME_S)")


_ACTIVE = threading.local()          # the budget of the render running on this thread


def _budget() -> _Budget:
    b = getattr(_ACTIVE, "budget", None)
    # outside a render (a template compiled and evaluated by hand): the defaults
    return b if b is not None else _Budget(DEFAULT_MAX_CHARS, time.monotonic() + DEFAULT_TIME_LIMIT_S)


def _length(v: Any) -> int:
    return len(v) if isinstance(v, (str, bytes, list, tuple, dict)) else 0


# a run of digits in a format string (a width or precision: '%1000000000s', '{:>1000000000}')
_DIGITS = re.compile(r"\d+")


def _check_format_widths(fmt: Any, b: _Budget) -> None:
    if isinstance(fmt, str):
        for m in _DIGITS.finditer(fmt):
            if len(m.group()) > 7 or int(m.group()) > b.max_chars:
                b.size(int(m.group()) if len(m.group()) < 19 else 10 ** 18, "format width")


def _check_args(args: tuple, kwargs: dict, b: _Budget) -> None:
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > b.max_chars:
            b.size(abs(v), "argument (a width or count)")


def _check_join(items: Any, sep: str, b: _Budget) -> None:
    if isinstance(items, (list, tuple)):
        total = len(sep) * max(0, len(items) - 1)
        for item in items:
            total += len(item) if isinstance(item, str) else 16
            if total > b.max_chars:
                b.size(total, "join")


def _check_replace(s: Any, old: Any, new: Any, b: _Budget) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        n = s.count(old) if old else len(s) + 1
        b.size(len(s) + n * (len(new) - len(old)), "replace")


def _checked_call(fn: Callable, name: str, args: tuple, kwargs: dict) -> Any:
    """Call a filter, a global or a method of a value with the budget's checks around it."""
    b = _budget()
    b.clock()
    _check_args(args, kwargs, b)
    if name in ("replace",) and len(args) >= 3:
        _check_replace(args[0], args[1], args[2], b)
    elif name == "format" or name == "format_map":
        _check_format_widths(args[0] if args else None, b)
    elif name == "join" and args:
        _check_join(args[0], args[1] if len(args) > 1 and isinstance(args[1], str) else "", b)
    out = fn(*args, **kwargs)
    b.size(_length(out), f"{name}() result")
    return out


def _bounded_filter(name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)          # keeps jinja's pass_context / pass_eval_context marker
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # pass_* filters get (context|eval_ctx, value, ...): the value is the 2nd argument then
        vals = args[1:] if getattr(fn, "jinja_pass_arg", None) is not None else args
        if name == "replace" and len(vals) >= 3:
            _check_replace(vals[0], vals[1], vals[2], _budget())
        if name == "format" and vals:
            _check_format_widths(vals[0], _budget())
        if name == "join" and vals:
            _check_join(list(vals[0]) if isinstance(vals[0], (list, tuple)) else None,
                        vals[1] if len(vals) > 1 and isinstance(vals[1], str) else "", _budget())
        return _checked_call(fn, name, args, kwargs)
    return wrapper


def _str_join(seq: Any) -> str:
    # jinja's ``~`` (and its str_join) with the size checked before the string is made
    items = [str(x) for x in seq]
    b = _budget()
    b.size(sum(len(x) for x in items), "concatenation")
    return "".join(items)


def _concat(pieces: Any) -> str:
    # environment.concat: a {% set %} block, a macro's or caller's output
    b = _budget()
    out, n = [], 0
    for piece in pieces:
        n += len(piece)
        b.size(n, "block output")
        out.append(piece)
    return "".join(out)


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The transformers-like sandbox with every value-making operation checked against the
    running render's budget."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        b = _budget()
        b.clock()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and _length(seq):
                    b.size(_length(seq) * max(n, 0), "repetition")
            if isinstance(left, int) and isinstance(right, int):
                b.size((left.bit_length() + right.bit_length()) // 3, "integer product (digits)")
        elif operator == "+":
            b.size(_length(left) + _length(right), "sum")
        elif operator == "%" and isinstance(left, str):
            _check_format_widths(left, b)
            _check_args(right if isinstance(right, tuple) else (right,), {}, b)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            b.size(int(right * abs(left).bit_length() * 0.30103), "power (digits)")
        out = super().call_binop(context, operator, left, right)
        b.size(_length(out), f"{operator!r} result")
        return out

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # str.format / format_map are wrapped when the attribute is read: check the widths then
        if getattr(value, "__name__", None) in ("format", "format_map"):
            _check_format_widths(getattr(value, "__self__", None), _budget())
        return super().wrap_str_format(value)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if not __self.is_safe_callable(__obj):
            raise SecurityError(f"{__obj!r} is not safely callable")
        name = getattr(__obj, "__name__", "")
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):      # a method of a string: its own text is the first argument
            b = _budget()
            if name == "replace" and len(args) >= 2:
                _check_replace(owner, args[0], args[1], b)
            elif name in ("format", "format_map"):
                _check_format_widths(owner, b)
            elif name == "join" and args:
                _check_join(list(args[0]) if isinstance(args[0], (list, tuple)) else None, owner, b)
        return _checked_call(lambda *a, **k: __context.call(__obj, *a, **k), name, args, kwargs)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    # jinja's lipsum, with the words it would write checked first (lipsum(100000) took 34 s)
    from jinja2.utils import generate_lorem_ipsum
    b = _budget()
    b.size(int(n) * int(max) * 8, "lipsum")
    return str(generate_lorem_ipsum(n=n, html=html, min=min, max=max))


class _AsyncStop:
    """Raises `_Timeout` in this thread at `deadline` unless disarmed first (for a loop that
    calls nothing the checks above see). Disarming clears an exception still pending."""

    def __init__(self, deadline: float) -> None:
        self._tid = threading.get_ident()
        self._lock = threading.Lock()
        self._armed = True
        self._fired = False
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._armed:
                self._fired = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._tid), ctypes.py_object(_Timeout))

    def disarm(self) -> None:
        self._timer.cancel()
        with self._lock:
            if self._armed:
                self._armed = False
                if self._fired:         # fired but maybe not yet raised: clear it
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._tid), None)


def _raise_exception(message: str) -> None:
    raise TemplateError(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' filter: json.dumps with these defaults, returned as plain text.
    if isinstance(indent, int) and not 0 <= indent <= MAX_TOJSON_INDENT:
        raise TemplateLimitError(f"tojson indent={indent} is out of range (0 to {MAX_TOJSON_INDENT})")
    if isinstance(indent, str) and len(indent) > MAX_TOJSON_INDENT:
        raise TemplateLimitError(f"tojson indent is a string of {len(indent)} characters (at most {MAX_TOJSON_INDENT})")
    try:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)
    except RecursionError:
        raise TemplateError("tojson: the value nests too deeply") from None


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
    env = _BoundedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["lipsum"] = _lipsum
    env.concat = _concat  # type: ignore[method-assign]
    return env


# ChatML, as every Qwen template writes it: the marker the engine needs to find turn boundaries
# in a rendered prompt lives here, with the template, and nowhere else. Reasoning markers are the
# family's (engine/conventions.py).
TURN_START = "<|im_start|>"


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
    tokenize_ms: float = 0.0  # of the time chat_prompt took, turning the rendered text into ids


def opens_reasoning(rendered: str, think_open: str | None) -> bool:
    """Whether a rendered generation prompt leaves a reasoning block (opened by `think_open`, the
    family's marker; None: the family does not reason) open for the reply."""
    return think_open is not None and rendered.rstrip().endswith(think_open)


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
        except TemplateLimitError:
            raise                   # out of budget: the request fails, not just this boundary
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
        except TemplateLimitError:
            raise
        except ValueError:
            pass
    return sorted({through_role_header(text, o) for o in offsets})


class ChatTemplate:
    """A compiled chat template. ``TemplateError`` if ``source`` is not valid Jinja.
    `max_chars` / `time_limit_s` bound each render (``budget()`` shares one deadline across
    several renders)."""

    def __init__(self, source: str, *, max_chars: int = DEFAULT_MAX_CHARS,
                 time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> None:
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("chat template source is empty")
        self.source = source
        self.max_chars = max_chars
        self.time_limit_s = time_limit_s
        try:
            template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from None
        except Exception as e:      # RecursionError from a deeply nested source, MemoryError ...
            raise TemplateError(f"chat template does not compile: {type(e).__name__}: {e}") from None
        # ``~`` compiles to the module-level str_join jinja imports into the template's namespace
        template.root_render_func.__globals__["str_join"] = _str_join
        self._template = template

    @contextmanager
    def budget(self) -> Iterator[None]:
        """One time limit for every render inside (a chat prompt renders once per message
        boundary too); renders outside a budget get `time_limit_s` each."""
        if getattr(_ACTIVE, "shared", None) is not None:
            yield
            return
        _ACTIVE.shared = time.monotonic() + self.time_limit_s
        try:
            yield
        finally:
            _ACTIVE.shared = None

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
        shared = getattr(_ACTIVE, "shared", None)
        deadline = shared if shared is not None else time.monotonic() + self.time_limit_s
        budget = _Budget(self.max_chars, deadline)
        try:
            return self._bounded_render(context, budget)
        except TemplateError:
            raise
        except _Timeout:
            raise TemplateLimitError("chat template rendering ran past its time limit (TEMPLATE_TIME_S)") from None
        except jinja2.TemplateError as e:  # includes the sandbox's SecurityError
            raise TemplateError(f"chat template failed: {e.message or type(e).__name__}") from None
        except Exception as e:  # TypeError, OverflowError (sandbox range cap), RecursionError ...
            raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from None

    def _bounded_render(self, context: dict, budget: _Budget) -> str:
        _ACTIVE.budget = budget
        stop = _AsyncStop(budget.deadline)
        try:
            budget.clock()
            out: list[str] = []
            n = 0
            for piece in self._template.generate(**context):
                n += len(piece)
                budget.size(n, "output")
                budget.clock()
                out.append(piece)
            return "".join(out)
        finally:
            stop.disarm()
            _ACTIVE.budget = None
