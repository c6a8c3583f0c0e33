"""Model output → OpenAI message parts: reasoning and tool calls, in the family's conventions
(engine/conventions.py).

A tool call sits in a ``<tool_call>`` … ``</tool_call>`` block, in one of the two syntaxes
engine/conventions.py shows: XML (Qwen3.5), each ``<parameter=P>`` value typed by the tool's
JSON Schema (``integer``, ``number``, ``boolean``, ``object``, ``array``, ``null``; ``string``
stays verbatim), or JSON (Hermes: Qwen2.5, Qwen3), the arguments an object (or a string holding
one).

Each well-formed block naming a declared tool becomes an OpenAI ``tool_call`` whose
``arguments`` is a JSON string. A block that is malformed, unclosed (generation cut) or names an
undeclared function stays in the text, untouched. Reasoning is split off by
engine/reasoning.py's one rule, which the grammar mask follows too: the family's block
(``<think>…</think>``) opened by the chat template's prompt or at the very start of the reply. A
family without reasoning has none.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from engine.constraints import schema_types
from engine.conventions import ChatConventions
from engine.json_numbers import loads_finite
from engine.reasoning import split_reasoning

_FUNC = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


@dataclass
class ParsedOutput:
    content: str
    reasoning: str | None
    tool_calls: list[dict]


def coerce(value: str, schema) -> object:
    """A parameter's text typed by its JSON Schema; falls back to the verbatim string."""
    types = schema_types(schema)
    if types == ["string"]:
        return value
    stripped = value.strip()
    try:
        # RFC 8259 and finite doubles only: "1e999" or "NaN" stays text, never Infinity / NaN
        parsed = loads_finite(stripped)
        ok = True
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError; model text nested 1,000 deep
        parsed, ok = None, False
    if not types:                     # no schema: JSON if it is JSON, else the text
        return parsed if ok and not isinstance(parsed, str) else value
    for t in types:
        if t == "string":
            continue
        if t == "boolean" and stripped.lower() in ("true", "false"):
            return stripped.lower() == "true"
        if t == "null" and stripped.lower() in ("null", "none"):
            return None
        if not ok:
            continue
        if t == "integer" and isinstance(parsed, (int, float)) and not isinstance(parsed, bool) \
                and float(parsed).is_integer():
            return int(parsed)
        if t == "number" and isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
            return parsed
        if t == "object" and isinstance(parsed, dict):
            return parsed
        if t == "array" and isinstance(parsed, list):
            return parsed
    return value


def _tool_schemas(tools: list[dict] | None) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for t in tools or []:
        fn = t.get("function") or {}
        if isinstance(fn.get("name"), str):
            params = fn["parameters"] if isinstance(fn.get("parameters"), dict) else {}
            out[fn["name"]] = params["properties"] if isinstance(params.get("properties"), dict) else {}
    return out


def _call(name: str, args: dict) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False, allow_nan=False)}}


def _parse_json_block(inner: str, schemas: dict[str, dict]) -> dict | None:
    """A Hermes block: one JSON object naming a declared tool, its arguments an object (or a string
    holding one, as some fine-tunes write them)."""
    try:
        obj = loads_finite(inner.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or set(obj) - {"name", "arguments"} or obj.get("name") not in schemas:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = loads_finite(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return _call(obj["name"], args)


def _param(pm: re.Match, props: dict) -> tuple[str, object]:
    """One ``<parameter=P>`` match: its name and its value typed by the tool's schema (the
    template writes the value between newlines)."""
    value = pm.group(2)
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    pname = pm.group(1).strip()
    return pname, coerce(value, props.get(pname))


def _parse_xml_block(inner: str, schemas: dict[str, dict]) -> dict | None:
    m = _FUNC.fullmatch(inner)
    if not m:
        return None
    name = m.group(1).strip()
    if name not in schemas:
        return None
    body = m.group(2)
    props = schemas[name]
    args: dict = {}
    pos = 0
    for pm in _PARAM.finditer(body):
        if body[pos:pm.start()].strip():
            return None                # stray text between parameters: not the format
        pos = pm.end()
        pname, value = _param(pm, props)
        args[pname] = value
    if body[pos:].strip():
        return None
    return _call(name, args)


def parse_tool_calls(text: str, tools: list[dict] | None, conventions: ChatConventions) -> tuple[str, list[dict]]:
    """(text without the parsed blocks, tool_calls). Unparseable blocks stay in the text."""
    schemas = _tool_schemas(tools)
    parse_block = _parse_json_block if conventions.tool_syntax == "json" else _parse_xml_block
    block = re.compile(re.escape(conventions.tool_call_open) + "(.*?)" + re.escape(conventions.tool_call_close), re.S)
    calls: list[dict] = []
    kept: list[str] = []
    pos = 0
    for m in block.finditer(text):
        call = parse_block(m.group(1), schemas)
        if call is None:
            continue
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append(call)
    kept.append(text[pos:])
    if not calls:
        return text, []
    return "".join(kept).strip(), calls


def parse_output(text: str, *, tools: list[dict] | None, conventions: ChatConventions,
                 prompt_opens_think: bool = False) -> ParsedOutput:
    split = split_reasoning(text, conventions, prompt_opens_think)
    reasoning, rest = split.reasoning, split.content
    if tools:
        rest, calls = parse_tool_calls(rest, tools, conventions)
    else:
        calls = []
    return ParsedOutput(content=rest, reasoning=reasoning, tool_calls=calls)


def finish_reason(generation: str, tool_calls: list[dict]) -> str:
    """The reply's ``finish_reason``: ``tool_calls`` for calls the generation finished (end of
    generation, or the grammar's end); a reply cut by ``max_tokens`` or the deadline says
    ``length`` even when calls before the cut parsed (parallel calls running past the limit)."""
    return "tool_calls" if tool_calls and generation == "stop" else generation


# ----------------------------------------------------------------------------- streamed calls

_XML_HEAD = re.compile(r"\s*<function=([^>\n]+)>\n")
_JSON_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,')


@dataclass
class CallDelta:
    """One ``delta.tool_calls[i]`` of a stream: ``id`` and ``name`` on a call's first delta (with
    ``arguments`` ""), then pieces of ``arguments``."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass
class _Block:
    index: int | None        # None: names no declared tool, so the parser leaves it as text
    sent: str = ""           # arguments sent so far
    params: int = 0          # XML: parameters sent
    done: bool = False


class CallStream:
    """Tool calls as a reply's text grows (the content after any reasoning). A call is announced
    once its header names a declared tool (XML ``<function=NAME>``, Hermes ``{"name": "NAME",``);
    its arguments follow in pieces that add up to exactly the ``arguments`` :func:`parse_tool_calls`
    gives the finished block: in the XML syntax one piece per closed parameter (``{"P": value``,
    ``, "Q": value``) and ``}`` at the block's end; in the Hermes syntax the whole object at the
    block's end (its text is re-serialised, so no earlier piece could be final)."""

    def __init__(self, tools: list[dict] | None, conventions: ChatConventions) -> None:
        self.schemas = _tool_schemas(tools)
        self.conventions = conventions
        self.blocks: list[_Block] = []
        self.announced = 0
        self._pos = 0   # where the text after the last closed block starts: the scan resumes there
        self._k = 0     # ... and that block's successor's index in self.blocks

    def update(self, content: str) -> list[CallDelta]:
        """The deltas ``content`` (the reply's content so far, a longer text each call) adds."""
        open_, close = self.conventions.tool_call_open, self.conventions.tool_call_close
        out: list[CallDelta] = []
        pos, k = self._pos, self._k
        while True:
            start = content.find(open_, pos)
            if start < 0:
                break
            body_at = start + len(open_)
            end = content.find(close, body_at)
            inner = content[body_at:] if end < 0 else content[body_at:end]
            if k == len(self.blocks):
                name = self._name(inner)
                if name is None:
                    if end < 0:
                        break           # the header is not complete yet
                    self.blocks.append(_Block(None, done=True))
                else:
                    self.blocks.append(_Block(self.announced if name in self.schemas else None))
                    if name in self.schemas:
                        out.append(CallDelta(self.announced, "", f"call_{uuid.uuid4().hex[:24]}", name))
                        self.announced += 1
            block = self.blocks[k]
            if block.index is not None and not block.done:
                out += self._pieces(block, inner, closed=end >= 0)
            if end < 0:
                break
            pos, k = end + len(close), k + 1
            self._pos, self._k = pos, k
        return out

    def _name(self, inner: str) -> str | None:
        if self.conventions.tool_syntax == "json":
            m = _JSON_HEAD.match(inner)
            if not m:
                return None
            try:
                name = json.loads(m.group(1))
            except ValueError:
                return None
            return name if isinstance(name, str) else None
        m = _XML_HEAD.match(inner)
        return m.group(1).strip() if m else None

    def _pieces(self, block: _Block, inner: str, closed: bool) -> list[CallDelta]:
        assert block.index is not None
        pieces: list[str] = []
        if self.conventions.tool_syntax == "xml":
            head = _XML_HEAD.match(inner)
            assert head is not None
            name = head.group(1).strip()
            params = list(_PARAM.finditer(inner, head.end()))
            for pm in params[block.params:]:
                pname, value = _param(pm, self.schemas[name])
                pieces.append(("{" if not block.sent and not pieces else ", ")
                              + json.dumps(pname, ensure_ascii=False) + ": "
                              + json.dumps(value, ensure_ascii=False, allow_nan=False))
            block.params = len(params)
        if closed:
            block.done = True
            parse = _parse_json_block if self.conventions.tool_syntax == "json" else _parse_xml_block
            call = parse(inner, self.schemas)
            sent = block.sent + "".join(pieces)
            final = call["function"]["arguments"] if call is not None else None
            if final is not None and final.startswith(sent):
                pieces.append(final[len(sent):])
        block.sent += "".join(pieces)
        return [CallDelta(block.index, p) for p in pieces if p]
