"""Request limits, checked before any work: body bytes, JSON nesting depth, number length,
message count and prompt characters. Each overrun is a 413/400 OpenAI error that names the
field and the limit, found in milliseconds (the checks are linear in the body and run before
the chat template, the tokenizer or the model see anything).

Why each exists (hostile inputs that used to cost a 500, seconds or gigabytes):
- nesting ~1,000 deep made ``json.loads`` (or the template) raise RecursionError;
- an integer of more than 4,300 digits hit Python's int-conversion limit (ValueError);
- a lone surrogate (``"\\ud800"``) reached the tokenizer, which raised TypeError;
- a 6 MB chat body was rendered and tokenized whole (10 s, 1.6 GB) before its 413.

``loads`` is the one guarded JSON parser (request bodies and ``tool_calls[].function.arguments``);
``check_tree`` walks an already-parsed value (a direct invoke's event, which Lambda parsed).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.settings import positive_int

from .errors import APIError, bad_request, invalid_json

# 1 MiB holds a full 32k-token context (about 4 characters a token) several times over, with
# tools; Lambda caps a synchronous payload at 6 MB, which is what the limit is there to refuse.
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_JSON_DEPTH = 64          # OpenAI bodies nest ~6 deep; JSON Schemas in tools ~20
DEFAULT_MAX_NUMBER_DIGITS = 40       # a uint64 seed has 20; a float's repr ~17
DEFAULT_MAX_MESSAGES = 512
DEFAULT_MAX_PROMPT_CHARS = 256 * 1024   # 8 characters a token of the default 32k context
DEFAULT_MAX_TOOLS = 128              # OpenAI's own limit; each tool is rendered and compiled

SURROGATE = re.compile("[\ud800-\udfff]")
# a \uD800-\uDFFF escape in raw JSON text: only then can a parsed string hold a lone surrogate
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES        # MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH        # MAX_JSON_DEPTH
    max_number_digits: int = DEFAULT_MAX_NUMBER_DIGITS  # MAX_NUMBER_DIGITS
    max_messages: int = DEFAULT_MAX_MESSAGES            # MAX_MESSAGES
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS    # MAX_PROMPT_CHARS
    max_tools: int = DEFAULT_MAX_TOOLS                  # MAX_TOOLS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Limits:
        return cls(
            max_body_bytes=positive_int(env, "MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
            max_json_depth=positive_int(env, "MAX_JSON_DEPTH", DEFAULT_MAX_JSON_DEPTH),
            max_number_digits=positive_int(env, "MAX_NUMBER_DIGITS", DEFAULT_MAX_NUMBER_DIGITS),
            max_messages=positive_int(env, "MAX_MESSAGES", DEFAULT_MAX_MESSAGES),
            max_prompt_chars=positive_int(env, "MAX_PROMPT_CHARS", DEFAULT_MAX_PROMPT_CHARS),
            max_tools=positive_int(env, "MAX_TOOLS", DEFAULT_MAX_TOOLS),
        )


def too_large(message: str, param: str | None, code: str = "request_too_large") -> APIError:
    return APIError(413, message, "invalid_request_error", param, code)


@dataclass(frozen=True)
class _LongNumber:
    """Stands in for a number literal over the digit limit until ``check_tree`` names its field
    (``json.loads``' hooks see the literal, not where it is)."""
    digits: int


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def check_body_size(n_bytes: int, limits: Limits) -> None:
    if n_bytes > limits.max_body_bytes:
        raise too_large(f"the request body is {n_bytes} bytes; at most {limits.max_body_bytes} are accepted "
                        "(MAX_BODY_BYTES)", None)


def _deep_field(text: str, limit: int, prefix: str) -> str:
    """The top-level key under which `text` nests deeper than `limit` (only called once
    ``json.loads`` gave up on the depth, so the cost is on the hostile path alone)."""
    depth, last_key, prev_str = 0, None, None
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]', text):
        tok = m.group()
        if tok[0] == '"':
            prev_str = tok
            continue
        if tok == ":" and depth == 1 and prev_str is not None:
            try:
                last_key = json.loads(prev_str)
            except ValueError:
                last_key = None
        elif tok in "[{":
            depth += 1
            if depth > limit:
                break
        elif tok in "]}":
            depth -= 1
        prev_str = None
    if isinstance(last_key, str) and not SURROGATE.search(last_key):
        return _join(prefix, last_key)
    return prefix or "body"


def loads(text: str, limits: Limits, param: str = "") -> object:
    """``json.loads`` that cannot raise anything but an ``APIError`` 400 naming `param` (the
    field holding the text, "" for the body): nesting, long numbers, NaN/Infinity, lone
    surrogates and non-JSON are all refused, the value walked by ``check_tree``."""
    where = f"'{param}'" if param else "the request body"

    def parse_number(kind: Callable[[str], object]) -> Callable[[str], object]:
        def parse(s: str) -> object:
            if len(s) > limits.max_number_digits:
                digits = sum(ch.isdigit() for ch in s)
                if digits > limits.max_number_digits:
                    return _LongNumber(digits)
            return kind(s)
        return parse

    def parse_constant(name: str) -> object:
        raise _Constant(name)

    try:
        value = json.loads(text, parse_int=parse_number(int), parse_float=parse_number(float),
                           parse_constant=parse_constant)
    except RecursionError:
        field = _deep_field(text, limits.max_json_depth, param)
        raise bad_request(f"'{field}' nests deeper than {limits.max_json_depth} levels (MAX_JSON_DEPTH)",
                          field, "too_deep") from None
    except _Constant as exc:
        msg = f"{where} is not valid JSON: {exc.name} is not a JSON value"
        if param:
            raise bad_request(msg, param, "invalid_json") from None
        raise invalid_json(f"{exc.name} is not a JSON value") from None
    except json.JSONDecodeError as exc:
        if param:
            raise bad_request(f"{where} is not valid JSON: {exc.msg}", param, "invalid_json") from None
        raise invalid_json(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    check_tree(value, limits, param, surrogates=bool(_SURROGATE_ESCAPE.search(text)))
    return value


class _Constant(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def check_tree(value: object, limits: Limits, path: str = "", *, surrogates: bool = True) -> None:
    """Walk a parsed value without recursion: nesting depth, number size, string and key
    validity. The first problem is a 400 whose ``param`` is the path (``messages[0].content``).
    `surrogates`: whether strings may hold lone surrogates (False when the raw text had no
    surrogate escape, which skips the per-string scan)."""
    max_depth, max_digits = limits.max_json_depth, limits.max_number_digits
    # digits of an int from its bit length (str() itself fails past 4,300 digits)
    max_bits = int(max_digits / 0.30103) + 1
    stack: list[tuple[object, str, int]] = [(value, path, 1)]
    while stack:
        v, p, depth = stack.pop()
        if isinstance(v, dict):
            if depth > max_depth:
                raise bad_request(f"'{p or 'body'}' nests deeper than {max_depth} levels (MAX_JSON_DEPTH)",
                                  p or "body", "too_deep")
            for k, item in v.items():
                if not isinstance(k, str):
                    raise bad_request(f"'{p or 'body'}' has a key of type {type(k).__name__}; JSON object keys "
                                      "are strings", p or "body", "invalid_type")
                if surrogates and SURROGATE.search(k):
                    raise bad_request(f"a key in '{p or 'body'}' is not valid Unicode (a lone surrogate)",
                                      p or "body", "invalid_unicode")
                stack.append((item, _join(p, k), depth + 1))
        elif isinstance(v, list):
            if depth > max_depth:
                raise bad_request(f"'{p or 'body'}' nests deeper than {max_depth} levels (MAX_JSON_DEPTH)",
                                  p or "body", "too_deep")
            stack.extend((item, f"{p}[{i}]", depth + 1) for i, item in enumerate(v))
        elif isinstance(v, str):
            if surrogates and SURROGATE.search(v):
                raise bad_request(f"'{p}' is not valid Unicode: it holds a lone surrogate (\\ud800-\\udfff); "
                                  "send UTF-8 text", p or "body", "invalid_unicode")
        elif isinstance(v, _LongNumber):
            raise bad_request(f"'{p}' is a number of {v.digits} digits; at most {max_digits} are accepted "
                              "(MAX_NUMBER_DIGITS)", p or "body", "number_too_long")
        elif isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > max_bits:
            raise bad_request(f"'{p}' is an integer of about {int(v.bit_length() * 0.30103)} digits; at most "
                              f"{max_digits} are accepted (MAX_NUMBER_DIGITS)", p or "body", "number_too_long")
        elif v is not None and not isinstance(v, (bool, int, float)):
            raise bad_request(f"'{p}' is a {type(v).__name__}, not a JSON value", p or "body", "invalid_type")


def check_messages(n: int, limits: Limits) -> None:
    if n > limits.max_messages:
        raise bad_request(f"'messages' holds {n} messages; at most {limits.max_messages} are accepted "
                          "(MAX_MESSAGES)", "messages", "too_many_messages")


def check_tools(n: int, limits: Limits) -> None:
    if n > limits.max_tools:
        raise bad_request(f"'tools' holds {n} tools; at most {limits.max_tools} are accepted (MAX_TOOLS)", "tools",
                          "too_many_tools")


def check_prompt_chars(n: int, param: str, limits: Limits) -> None:
    if n > limits.max_prompt_chars:
        raise too_large(f"'{param}' is {n} characters; at most {limits.max_prompt_chars} are accepted "
                        "(MAX_PROMPT_CHARS)", param, "prompt_too_long")
