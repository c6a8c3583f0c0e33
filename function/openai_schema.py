"""OpenAI request validation and response shapes (chat completions, completions, models, SSE).

Validation rules: unknown fields are ignored; ``null`` is the same as absent; a field of the
wrong type or out of range is a 400 whose ``param`` names it (``messages[2].content[0].type``).
Fields warmllm cannot honour (``n`` > 1, ``best_of`` > 1, ``echo``, non-text content parts) are a
400 that says so rather than being silently dropped. docs/function.md lists every field.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from engine.sampling import SamplingError, SamplingParams

from . import limits as limits_mod
from .errors import bad_request
from .limits import Limits

ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (chat: the rest of the context)


@dataclass
class Structured:
    """A constraint on the output: ``kind`` json_schema | json_object | grammar | regex | choice,
    ``value`` the schema / grammar text / regex / choices, ``param`` the field it came from."""
    kind: str
    value: object
    param: str


# reasoning_effort values accepted (OpenAI's, plus vLLM's "none"): "none" turns Qwen3.5's thinking
# off; the others leave it on (the template has no budget to tune)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
MAX_TOP_LOGPROBS = 20


@dataclass
class GenRequest:
    route: str
    model: str | None = None
    max_tokens: int | None = None          # None: the rest of the context (chat's default; the deadline stops it)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    structured: Structured | None = None   # response_format / grammar / regex / structured_outputs
    logprobs: bool = False
    top_logprobs: int = 0
    # chat
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None        # what the template renders (after tool_choice)
    tool_choice: object = None
    parse_tool_calls: bool = False
    parallel_tool_calls: bool = True
    template_kwargs: dict = field(default_factory=dict)
    # completion
    prompt: str | list[int] | None = None


# ----------------------------------------------------------------------------- field readers

def _present(body: dict, name: str) -> bool:
    return body.get(name) is not None


def _type_name(v) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(v), type(v).__name__)


def _number(body: dict, name: str, lo: float | None, hi: float | None, default: float) -> float:
    """A JSON number; `lo`/`hi` (None: unbounded here) are the API's own bounds, where the
    engine's type does not already check the field."""
    if not _present(body, name):
        return default
    v = body[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_request(f"'{name}' must be a number, got {_type_name(v)}", name, "invalid_type")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"at most {hi}" if lo is None else f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad_request(f"'{name}' must be {rng}, got {v}", name)
    return float(v)


def _integer(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    if not _present(body, name):
        return None
    v = body[name]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad_request(f"'{name}' must be an integer, got {_type_name(v)}", name, "invalid_type")
    if v < lo or (hi is not None and v > hi):
        rng = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad_request(f"'{name}' must be {rng}, got {v}", name)
    return v


def _boolean(body: dict, name: str, default: bool = False) -> bool:
    if not _present(body, name):
        return default
    v = body[name]
    if not isinstance(v, bool):
        raise bad_request(f"'{name}' must be a boolean, got {_type_name(v)}", name, "invalid_type")
    return v


def _string(body: dict, name: str) -> str | None:
    if not _present(body, name):
        return None
    v = body[name]
    if not isinstance(v, str):
        raise bad_request(f"'{name}' must be a string, got {_type_name(v)}", name, "invalid_type")
    return v


def _object(body: dict, name: str) -> dict | None:
    if not _present(body, name):
        return None
    v = body[name]
    if not isinstance(v, dict):
        raise bad_request(f"'{name}' must be an object, got {_type_name(v)}", name, "invalid_type")
    return v


def _common(body: dict, route: str, lim: Limits) -> GenRequest:
    req = GenRequest(route=route)
    req.model = _string(body, "model")
    _string(body, "user")
    n = _integer(body, "n", 1)
    if n is not None and n != 1:
        raise bad_request(f"'n' must be 1: this function generates one choice per request (got {n}); "
                          "send separate requests for more", "n", "unsupported_value")
    mct = _integer(body, "max_completion_tokens", 1)
    mt = _integer(body, "max_tokens", 1)
    req.max_tokens = mct if mct is not None else mt
    # the JSON types and OpenAI's own limits here (temperature up to 2, a 64-bit seed); the
    # ranges sampling needs are checked once, by SamplingParams
    try:
        req.sampling = SamplingParams(
            temperature=_number(body, "temperature", None, 2.0, 1.0),
            top_p=_number(body, "top_p", None, None, 1.0),
            top_k=_top_k(body),
            min_p=_number(body, "min_p", None, None, 0.0),
            seed=_seed(body),
            presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
            frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
            logit_bias=_logit_bias(body),
        )
    except SamplingError as exc:
        raise bad_request(str(exc), exc.field) from None
    req.stop = _stop(body)
    req.stream = _boolean(body, "stream")
    so = _object(body, "stream_options")
    if so is not None and so.get("include_usage") is not None:
        if not isinstance(so["include_usage"], bool):
            raise bad_request("'stream_options.include_usage' must be a boolean", "stream_options.include_usage",
                              "invalid_type")
        req.include_usage = so["include_usage"]
    req.structured = _structured(body, lim)
    return req


def _logit_bias(body: dict) -> dict[int, float]:
    lb = _object(body, "logit_bias")
    out: dict[int, float] = {}
    for k, v in (lb or {}).items():
        p = f"logit_bias.{k}"
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise bad_request(f"'logit_bias' keys must be token ids, got {k!r}", p, "invalid_type") from None
        if tid < 0:
            raise bad_request(f"'logit_bias' key {k!r} is not a token id", p)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise bad_request(f"'{p}' must be a number, got {_type_name(v)}", p, "invalid_type")
        if not -100 <= v <= 100:
            raise bad_request(f"'{p}' must be between -100 and 100, got {v}", p)
        out[tid] = float(v)
    return out


def _structured(body: dict, lim: Limits) -> Structured | None:
    """The one output constraint the request asks for, from response_format, the llama-server
    style ``grammar`` / ``json_schema`` fields, our ``regex`` field, vLLM's ``structured_outputs``
    (json / regex / grammar / choice) or its older ``guided_*`` fields. Two at once is a 400."""
    found: list[Structured] = []
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict):
            raise bad_request(f"'response_format' must be an object, got {_type_name(rf)}", "response_format",
                              "invalid_type")
        kind = rf.get("type", "text")
        if kind == "json_object":
            found.append(Structured("json_object", {"type": "object"}, "response_format"))
        elif kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
                raise bad_request("'response_format.json_schema' must be an object with a 'schema' object",
                                  "response_format.json_schema", "invalid_type")
            if js.get("strict") is not None and not isinstance(js["strict"], bool):
                raise bad_request("'response_format.json_schema.strict' must be a boolean",
                                  "response_format.json_schema.strict", "invalid_type")
            # strict or not, the schema is enforced (as vLLM and llama-server do)
            found.append(Structured("json_schema", js.get("schema") or {}, "response_format.json_schema.schema"))
        elif kind != "text":
            raise bad_request(f"response_format type {kind!r} is not supported; use 'text', 'json_object' or "
                              "'json_schema'", "response_format.type", "unsupported_value")
    for name, kind in (("grammar", "grammar"), ("regex", "regex"), ("guided_grammar", "grammar"),
                       ("guided_regex", "regex"), ("guided_json", "json_schema"), ("json_schema", "json_schema"),
                       ("guided_choice", "choice")):
        if _present(body, name):
            found.append(_structured_value(kind, body[name], name, lim))
    so = _object(body, "structured_outputs")
    for name, kind in (("json", "json_schema"), ("regex", "regex"), ("grammar", "grammar"), ("choice", "choice")):
        if so is not None and so.get(name) is not None:
            found.append(_structured_value(kind, so[name], f"structured_outputs.{name}", lim))
    if len(found) > 1:
        raise bad_request(f"'{found[0].param}' and '{found[1].param}' both constrain the output; send one",
                          found[1].param, "unsupported_value")
    return found[0] if found else None


def _structured_value(kind: str, v, param: str, lim: Limits) -> Structured:
    if kind == "json_schema":
        if isinstance(v, str):  # the guarded parser: a schema string nested 10,000 deep is a 400
            v = limits_mod.loads(v, lim, param)
        if not isinstance(v, dict):
            raise bad_request(f"'{param}' must be a JSON Schema object", param, "invalid_type")
    elif kind == "choice":
        if not isinstance(v, list) or not v or not all(isinstance(c, str) for c in v):
            raise bad_request(f"'{param}' must be a non-empty array of strings", param, "invalid_type")
    elif not isinstance(v, str) or not v:
        raise bad_request(f"'{param}' must be a non-empty string", param, "invalid_type")
    return Structured(kind, v, param)


def _seed(body: dict) -> int | None:
    """OpenAI takes any 64-bit integer; numpy's generator only non-negative ones, so a negative
    seed is taken modulo 2**64 (-5 and 2**64 - 5 give the same generation)."""
    v = _integer(body, "seed", -(2 ** 63), 2 ** 64 - 1)
    return None if v is None else v % 2 ** 64


def _top_k(body: dict) -> int:
    v = _integer(body, "top_k", -1)
    return 0 if v is None or v < 0 else v       # -1 (vLLM) and 0 both mean "off"


def _stop(body: dict) -> list[str]:
    if not _present(body, "stop"):
        return []
    v = body["stop"]
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad_request("'stop' must be a string or an array of strings", "stop", "invalid_type")
    if len(v) > 16:
        raise bad_request(f"'stop' may hold at most 16 sequences, got {len(v)}", "stop")
    return [s for s in v if s]


# ----------------------------------------------------------------------------- chat

def _content(v, param: str, allow_none: bool) -> str:
    if v is None:
        if allow_none:
            return ""
        raise bad_request(f"'{param}' is required", param, "missing")
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        parts = []
        for j, part in enumerate(v):
            p = f"{param}[{j}]"
            if isinstance(part, str):
                parts.append(part)
                continue
            if not isinstance(part, dict):
                raise bad_request(f"'{p}' must be an object, got {_type_name(part)}", p, "invalid_type")
            kind = part.get("type")
            if kind not in ("text", "input_text"):
                raise bad_request(f"'{p}.type' is {kind!r}; only 'text' content parts are supported",
                                  f"{p}.type", "unsupported_value")
            text = part.get("text")
            if not isinstance(text, str):
                raise bad_request(f"'{p}.text' must be a string, got {_type_name(text)}", f"{p}.text",
                                  "invalid_type")
            parts.append(text)
        return "".join(parts)
    raise bad_request(f"'{param}' must be a string or an array of text parts, got {_type_name(v)}", param,
                      "invalid_type")


def _assistant_tool_calls(v, param: str, lim: Limits) -> list[dict]:
    if not isinstance(v, list):
        raise bad_request(f"'{param}' must be an array, got {_type_name(v)}", param, "invalid_type")
    out = []
    for j, tc in enumerate(v):
        p = f"{param}[{j}]"
        if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
            raise bad_request(f"'{p}' must be an object with a 'function'", p, "invalid_type")
        fn = tc["function"]
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"'{p}.function.name' must be a non-empty string", f"{p}.function.name",
                              "invalid_type")
        args = fn.get("arguments", {})
        if args is None or args == "":
            args = {}
        if isinstance(args, str):
            # the arguments' JSON is parsed with the body's guards (depth, number size, Unicode)
            args = limits_mod.loads(args, lim, f"{p}.function.arguments")
        if not isinstance(args, dict):
            raise bad_request(f"'{p}.function.arguments' must be a JSON object", f"{p}.function.arguments",
                              "invalid_type")
        out.append({"id": str(tc.get("id") or f"call_{j}"), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def _messages(body: dict, lim: Limits) -> list[dict]:
    if "messages" not in body or body["messages"] is None:
        raise bad_request("'messages' is required", "messages", "missing")
    msgs = body["messages"]
    if not isinstance(msgs, list):
        raise bad_request(f"'messages' must be an array, got {_type_name(msgs)}", "messages", "invalid_type")
    if not msgs:
        raise bad_request("'messages' must not be empty", "messages")
    limits_mod.check_messages(len(msgs), lim)
    out = []
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"'{p}' must be an object, got {_type_name(m)}", p, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"'{p}.role' must be one of {', '.join(ROLES)}, got {role!r}", f"{p}.role")
        msg: dict = {"role": "system" if role == "developer" else role}
        has_calls = role == "assistant" and m.get("tool_calls")
        msg["content"] = _content(m.get("content"), f"{p}.content", allow_none=role == "assistant")
        if has_calls:
            msg["tool_calls"] = _assistant_tool_calls(m["tool_calls"], f"{p}.tool_calls", lim)
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "tool":
            tcid = m.get("tool_call_id")
            if tcid is not None and not isinstance(tcid, str):
                raise bad_request(f"'{p}.tool_call_id' must be a string", f"{p}.tool_call_id", "invalid_type")
            if tcid:
                msg["tool_call_id"] = tcid
        name = m.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise bad_request(f"'{p}.name' must be a string", f"{p}.name", "invalid_type")
            msg["name"] = name
        out.append(msg)
    return out


def _tools(body: dict, lim: Limits) -> list[dict] | None:
    if not _present(body, "tools"):
        return None
    tools = body["tools"]
    if not isinstance(tools, list):
        raise bad_request(f"'tools' must be an array, got {_type_name(tools)}", "tools", "invalid_type")
    limits_mod.check_tools(len(tools), lim)
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("function"), dict):
            raise bad_request(f"'{p}' must be an object with a 'function' object", p, "invalid_type")
        if t.get("type", "function") != "function":
            raise bad_request(f"'{p}.type' must be 'function'", f"{p}.type", "unsupported_value")
        fn = t["function"]
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"'{p}.function.name' must be a non-empty string", f"{p}.function.name",
                              "invalid_type")
        if fn["name"] in seen:
            # a call names its function: two tools of one name make the call ambiguous
            raise bad_request(f"'{p}.function.name' {fn['name']!r} is also the name of tools[{seen[fn['name']]}]; "
                              "tool names must be unique", f"{p}.function.name", "duplicate_tool_name")
        seen[fn["name"]] = i
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise bad_request(f"'{p}.function.parameters' must be a JSON Schema object",
                              f"{p}.function.parameters", "invalid_type")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise bad_request(f"'{p}.function.description' must be a string", f"{p}.function.description",
                              "invalid_type")
    return tools or None


def _tool_choice(body: dict, tools: list[dict] | None):
    tc = body.get("tool_choice")
    if tc is None:
        return None
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            raise bad_request(f"'tool_choice' must be 'none', 'auto', 'required' or a function object, got {tc!r}",
                              "tool_choice")
        if tc == "required" and not tools:
            raise bad_request("'tool_choice' is 'required' but no 'tools' were given", "tool_choice")
        return tc
    if isinstance(tc, dict) and isinstance(tc.get("function"), dict) and isinstance(tc["function"].get("name"), str):
        name = tc["function"]["name"]
        if not any(t["function"]["name"] == name for t in tools or []):
            raise bad_request(f"'tool_choice' names function {name!r}, which is not in 'tools'",
                              "tool_choice.function.name")
        return tc
    raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice", "invalid_type")


def _chat_chars(messages: list[dict], tools: list[dict] | None) -> int:
    """The characters the template will be given: every message's text and tool calls, the tools."""
    n = 0
    for m in messages:
        n += len(m["content"]) + len(m.get("reasoning_content") or "") + len(m.get("name") or "")
        for tc in m.get("tool_calls") or ():
            n += len(tc["function"]["name"]) + len(json.dumps(tc["function"]["arguments"], ensure_ascii=False))
    if tools:
        n += len(json.dumps(tools, ensure_ascii=False))
    return n


def parse_chat(body: dict, lim: Limits | None = None) -> GenRequest:
    """The chat request, validated; `lim` (the function's limits) bounds the message count and
    the characters given to the template (413 before it renders)."""
    lim = lim if lim is not None else Limits()
    req = _common(body, "chat", lim)
    req.messages = _messages(body, lim)
    tools = _tools(body, lim)
    req.tool_choice = _tool_choice(body, tools)
    if req.tool_choice == "none" or not tools:
        req.tools = None
    elif isinstance(req.tool_choice, dict):
        name = req.tool_choice["function"]["name"]
        req.tools = [t for t in tools if t["function"]["name"] == name]
    else:
        req.tools = tools
    req.parse_tool_calls = req.tools is not None
    req.parallel_tool_calls = _boolean(body, "parallel_tool_calls", True)
    kwargs = _object(body, "chat_template_kwargs")
    req.template_kwargs = dict(kwargs or {})
    limits_mod.check_prompt_chars(_chat_chars(req.messages, tools) + len(json.dumps(req.template_kwargs)),
                                  "messages", lim)
    effort = _string(body, "reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise bad_request(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
                              "reasoning_effort")
        if effort == "none":
            req.template_kwargs.setdefault("enable_thinking", False)
    req.logprobs = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not req.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    req.top_logprobs = top or 0
    return req


# ----------------------------------------------------------------------------- completions

def parse_completion(body: dict, lim: Limits | None = None) -> GenRequest:
    lim = lim if lim is not None else Limits()
    req = _common(body, "completion", lim)
    if "prompt" not in body or body["prompt"] is None:
        raise bad_request("'prompt' is required", "prompt", "missing")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]                                   # a batch of one
    if isinstance(p, str):
        req.prompt = p
    elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
        req.prompt = list(p)
    elif isinstance(p, list) and len(p) > 1 and all(isinstance(t, (str, list)) for t in p):
        raise bad_request(f"'prompt' holds {len(p)} prompts; this function completes one per request",
                          "prompt", "unsupported_value")
    else:
        raise bad_request("'prompt' must be a string or an array of token ids", "prompt", "invalid_type")
    limits_mod.check_prompt_chars(len(req.prompt), "prompt", lim)
    if req.max_tokens is None:
        req.max_tokens = DEFAULT_COMPLETION_MAX_TOKENS
    # completions: logprobs is how many alternatives per token (0 = only the chosen one's)
    lp = body.get("logprobs")
    if lp is not None and lp is not False:
        n = _integer(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        req.logprobs, req.top_logprobs = True, n or 0
    if _integer(body, "best_of", 1) not in (None, 1):
        raise bad_request("'best_of' must be 1", "best_of", "unsupported_value")
    if _boolean(body, "echo"):
        raise bad_request("'echo' is not supported by this function", "echo", "unsupported_value")
    if _string(body, "suffix"):
        raise bad_request("'suffix' is not supported by this function", "suffix", "unsupported_value")
    return req


# ----------------------------------------------------------------------------- responses

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def chat_message(content: str, reasoning: str | None, tool_calls: list[dict] | None) -> dict:
    msg: dict = {"role": "assistant", "content": content if (content or not tool_calls) else None}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


@dataclass
class TokenLogprob:
    """One generated token for the logprobs shapes: its text, bytes, log-probability and the
    most likely alternatives as (text, bytes, logprob)."""
    token: str
    bytes: list[int]
    logprob: float
    top: list[tuple[str, list[int], float]] = field(default_factory=list)


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    """``choices[0].logprobs`` of a chat completion (OpenAI's shape)."""
    return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": e.bytes,
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": b} for t, b, lp in e.top]}
                        for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[TokenLogprob]) -> dict:
    """``choices[0].logprobs`` of a text completion (the legacy shape: parallel arrays)."""
    offsets, pos = [], 0
    for e in entries:
        offsets.append(pos)
        pos += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t: lp for t, _, lp in e.top} for e in entries], "text_offset": offsets}


def chat_completion(rid: str, created: int, model: str, message: dict, finish_reason: str, use: dict,
                    logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}],
            "usage": use, "system_fingerprint": None}


def text_completion(rid: str, created: int, model: str, text: str, finish_reason: str, use: dict,
                    logprobs: dict | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
            "usage": use, "system_fingerprint": None}


def model_list(model_id: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                        "owned_by": "warmllm"}]}


def now() -> int:
    return int(time.time())
