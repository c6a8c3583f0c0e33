"""Constrained decoding: JSON schemas, JSON mode, grammars, regexes and forced tool calls, through
llguidance (the grammar engine llama.cpp, vLLM and SGLang use).

Three layers:

- :func:`grammar_tokenizer` turns our GGUF vocabulary into an ``llguidance.LLTokenizer`` (its
  token trie): every token's bytes, CONTROL / USER_DEFINED / UNUSED tokens marked special (so a
  grammar names them as ``<tool_call>``, never spells them with byte tokens), every end-of-
  generation token as EOS. Built once per tokenizer and kept (~30 ms for the 4k factory vocabulary,
  see docs/function.md for the 248k one).
- :class:`GrammarSpec` is what a request asks for, already turned into llguidance's grammar text
  by :func:`json_schema_grammar`, :func:`lark_grammar`, :func:`regex_grammar` or
  :func:`tool_call_grammar`; :func:`compile_grammar` validates it against the vocabulary (a
  construct llguidance cannot do is a :class:`GrammarError` naming it) and caches the result per
  grammar text, so a warm process compiles a tool list once.
- :class:`Constraint` runs one generation: it waits until reasoning is over (where
  engine/reasoning.py's one rule says the reply parser's content starts, however the close marker
  was tokenized) and, for ``tool_choice: auto``, until the model opens the tool-call marker
  (``<tool_call>``) itself; from then on it masks the logits with the tokens the grammar allows
  and consumes each sampled token. The next mask is
  computed on a worker thread while the forward of the sampled token runs (llguidance drops the GIL).

The tool-call grammar writes the family's syntax (engine/conventions.py) exactly as its chat
template teaches it and as ``function/tool_calls.py`` parses it back. In the XML syntax (Qwen3.5) a
parameter whose schema is a string is written verbatim, every other parameter as JSON constrained by
its schema (:func:`schema_types` is shared with the parser so both sides agree on which is which);
in the JSON syntax (Hermes: Qwen2.5, Qwen3) the arguments are one JSON object constrained by the
tool's parameters schema.
"""
from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.conventions import ChatConventions
from engine.json_numbers import finite_schema
from engine.markers import forbidden_after, marker_crossers
from engine.reasoning import ReasoningWatch
from engine.termination import unfinishable_lark, unfinishable_schema
from engine.tokenizer import BYTE_TO_UNICODE, IncrementalDecoder, Tokenizer, TokenType

__all__ = [
    "Constraint",
    "GrammarError",
    "GrammarSpec",
    "choice_grammar",
    "compile_grammar",
    "grammar_tokenizer",
    "prepare_markers",
    "json_schema_grammar",
    "lark_grammar",
    "regex_grammar",
    "schema_types",
    "tool_call_grammar",
]

# JSON as the model writes it in a reply: Python's json.dumps separators, no free whitespace (a
# flexible-whitespace grammar lets a weak model emit newlines forever inside an object).
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """The requested schema / grammar / regex is not something llguidance can enforce; the message
    names the construct (llguidance's own words) and the request field it came from."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.reason = message


# ----------------------------------------------------------------------------- the token trie

_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, Any] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


class _Vocab:
    """What ``llguidance.TokenizerWrapper`` reads: token bytes, eos, special ids, an encoder."""

    def __init__(self, tok: Tokenizer) -> None:
        self.eos_token_id = tok.eos_id
        self.bos_token_id = None
        types = tok.token_types
        special = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNUSED, TokenType.UNKNOWN)
        self.special_token_ids = np.flatnonzero(np.isin(types, special)).tolist()
        self.tokens = _trie_tokens(tok, types)
        self._tok = tok

    def __call__(self, text: str | bytes) -> list[int]:
        # llguidance re-tokenizes forced text with this; special-token text stays text
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, parse_special=False, add_special=False)


# byte-level BPE text -> bytes: one character stands for one byte
_TO_LATIN1 = {ord(ch): b for b, ch in BYTE_TO_UNICODE.items()}
_BYTE_OF_CHAR = np.full(max(_TO_LATIN1) + 1, -1, dtype=np.int16)
_BYTE_OF_CHAR[list(_TO_LATIN1)] = list(_TO_LATIN1.values())


def _trie_tokens(tok: Tokenizer, types: np.ndarray) -> list[bytes]:
    """Every token's bytes as the trie stores them. The NORMAL tokens (all but a few hundred) go
    through one table lookup over their concatenated characters, cut at their lengths (one
    character is one byte): ~50 ms for Qwen3.5's 248k tokens, not ~180 ms token by token. The
    rest, and any token with a character outside the byte map, go one by one."""
    pieces = tok.pieces
    ids = np.flatnonzero(types == TokenType.NORMAL)
    texts = [pieces[i] for i in ids.tolist()]
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
    byte = np.where(codes < len(_BYTE_OF_CHAR), _BYTE_OF_CHAR[np.minimum(codes, len(_BYTE_OF_CHAR) - 1)], -1)
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    unmapped = np.zeros(len(texts), dtype=bool)
    unmapped[np.searchsorted(ends, np.flatnonzero(byte < 0), side="right")] = True
    joined = byte.astype(np.uint8).tobytes()
    out: list[bytes] = [b""] * len(pieces)
    start = 0
    for i, end in zip(ids.tolist(), ends.tolist()):
        out[i] = joined[start:end]
        start = end
    one_by_one = np.union1d(np.flatnonzero(types != TokenType.NORMAL), ids[unmapped])
    for i in one_by_one.tolist():
        out[i] = _trie_bytes(tok, i)
    return out


def _trie_bytes(tok: Tokenizer, i: int) -> bytes:
    kind = tok.token_type(i)
    if kind == TokenType.NORMAL:
        try:
            return tok.piece(i).translate(_TO_LATIN1).encode("latin-1")
        except UnicodeEncodeError:  # a character outside the byte map: the general path
            return tok.token_bytes(i)
    if kind == TokenType.UNUSED:
        # An UNUSED token ([PAD…]) decodes to nothing, but in the trie it must keep its name:
        # llguidance stores a special token as 0xff + its bytes, and a bare 0xff is a prefix of
        # every special token, so the mask would let the fillers through wherever <tool_call> is.
        return tok.piece(i).encode("utf-8")
    return tok.token_bytes(i)


def grammar_tokenizer(tok: Tokenizer) -> Any:
    """The ``llguidance.LLTokenizer`` for ``tok`` (built on first use, then kept with it)."""
    with _TOKENIZERS_LOCK:
        lt = _TOKENIZERS.get(tok)
        if lt is None:
            import llguidance

            # slices=[]: llguidance's default lexer slices (faster masks inside JSON strings) cost
            # ~0.3 s more to build, all of it holding the GIL, on every cold start; without them a
            # mask on Qwen3.5's vocabulary takes 0.14 ms on average (0.08 with), next to a ~25 ms
            # decode step (bench.constrained 0.94-1.0x free decode either way)
            lt = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(tok)), n_vocab=tok.n_vocab,
                                        eos_token=sorted(tok.eog_ids), slices=[])
            _TOKENIZERS[tok] = lt
        return lt


def prepare_markers(tok: Tokenizer, conventions: ChatConventions) -> None:
    """Build, ahead of the first constrained request, the marker tables the mask reads while a
    reply reasons or waits for a call marker written as text (engine/markers.py; ~50 ms each for
    Qwen3.5's vocabulary, which the first such request would otherwise pay)."""
    if conventions.think_close is not None:
        marker_crossers(tok, conventions.think_close, blank_ok=True)
    trig = conventions.tool_call_open
    tid = tok.token_id(trig)
    if tid is None or not tok.is_marker(tid):
        marker_crossers(tok, trig, blank_ok=False)


# ----------------------------------------------------------------------------- grammars


@dataclass(frozen=True)
class GrammarSpec:
    """One request's constraint. ``grammar``: llguidance grammar text. ``field``: the request field
    it came from (errors name it). ``trigger``: masking starts only once the model emits this token
    (``<tool_call>`` for ``tool_choice: auto``); None: from the first content token on."""

    grammar: str
    field: str
    kind: str  # "json_schema" | "json_object" | "grammar" | "regex" | "tool_call"
    trigger: str | None = None


def json_schema_grammar(schema: Mapping[str, Any], field_name: str = "response_format.json_schema.schema",
                        kind: str = "json_schema") -> GrammarSpec:
    """JSON constrained by ``schema``. Like every grammar here it starts with the reply's first
    content token: no leading blank lines (a template that closes ``<think>`` writes those itself,
    and after a ``</think>`` of the model's the reasoning parser strips them anyway)."""
    if not isinstance(schema, Mapping):
        raise GrammarError(field_name, f"a JSON Schema must be an object, got {type(schema).__name__}")
    _must_finish(unfinishable_schema(schema), field_name)
    lark = f"start: json\njson: %json {_json_text(schema)}\n"
    return GrammarSpec(_from_lark(lark), field_name, kind)


def lark_grammar(text: str, field_name: str = "grammar") -> GrammarSpec:
    """A Lark grammar in llguidance's dialect, or a llama.cpp GBNF grammar (converted)."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError(field_name, "the grammar is empty")
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(text)
    except Exception as exc:  # the converter raises bare Exceptions on malformed GBNF
        raise GrammarError(field_name, f"not a Lark or GBNF grammar: {exc}") from None
    _must_finish(unfinishable_lark(lark), field_name)
    return GrammarSpec(_from_lark(lark), field_name, "grammar")


def _must_finish(why: str | None, field_name: str) -> None:
    """A schema or grammar with no finite answer is refused before decoding (engine/termination.py):
    the mask would lead the model along an answer that never ends."""
    if why is not None:
        raise GrammarError(field_name, why)


def regex_grammar(pattern: str, field_name: str = "regex") -> GrammarSpec:
    """Text that matches ``pattern`` as a whole (Rust ``regex`` syntax)."""
    if not isinstance(pattern, str) or not pattern:
        raise GrammarError(field_name, "the regex is empty")
    import llguidance

    return GrammarSpec(llguidance.LLMatcher.grammar_from_regex(pattern), field_name, "regex")


def choice_grammar(choices: Sequence[str], field_name: str = "structured_outputs.choice") -> GrammarSpec:
    """Exactly one of ``choices``."""
    if not choices or not all(isinstance(c, str) for c in choices):
        raise GrammarError(field_name, "choices must be a non-empty list of strings")
    return GrammarSpec(_from_lark("start: " + " | ".join(_lark_str(c) for c in choices) + "\n"), field_name,
                       "choice")


def _from_lark(lark: str) -> str:
    import llguidance

    return str(llguidance.LLMatcher.grammar_from_lark(lark))


def _json_text(schema: Mapping[str, Any]) -> str:
    """``schema`` as JSON with our output style (x-guidance options the schema sets win), every
    number it admits bounded to a finite double (engine/json_numbers.py)."""
    s = finite_schema(schema)
    s["x-guidance"] = {**_JSON_STYLE, **(s.get("x-guidance") or {})}
    return json.dumps(s, ensure_ascii=False)


def schema_types(schema: Any) -> list[str]:
    """The JSON types a schema admits, as far as the XML tool-call syntax cares: ``type`` (string or
    list), else the union of ``anyOf`` / ``oneOf`` branches, else the types of ``enum`` / ``const``
    values. ``[]``: unknown (any value). Shared with function/tool_calls.py, which types parameter
    text by the same rule."""
    if not isinstance(schema, Mapping):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            out += schema_types(sub)
    if not out and "enum" in schema and isinstance(schema["enum"], list):
        out = sorted({json_type(v) for v in schema["enum"]})
    if not out and "const" in schema:
        out = [json_type(schema["const"])]
    return out


def json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if v is None:
        return "null"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(v), "string")


def _lark_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _regex_literal(s: str) -> str:
    """``s`` as a regex matching exactly it (Rust regex escapes, '/' escaped for Lark's /.../)."""
    out = []
    for ch in s:
        if ch in "\\.+*?()|[]{}^$#&-~":
            out.append("\\" + ch)
        elif ch == "/":
            out.append("\\/")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append(ch)
    return "".join(out)


# A verbatim parameter value may not contain the closing tags the parser looks for.
_NO_CLOSING_TAG = r"~/(?s:.*)(<\/parameter>|<\/function>|<\/tool_call>)(?s:.*)/"


def _raw_string_value(schema: Mapping[str, Any], where: str) -> str:
    """The regex terminal (Lark) of a verbatim string parameter satisfying ``schema``'s string
    keywords: enum / const, pattern (JSON Schema semantics: a search, so unanchored unless the
    pattern anchors itself), minLength / maxLength. ``format`` is not enforced (as the jsonschema
    package, which treats it as an annotation by default)."""
    import llguidance

    parts = [r"/(?s:.*)/", _NO_CLOSING_TAG]
    values = None
    if "const" in schema:
        values = [schema["const"]]
    elif isinstance(schema.get("enum"), list):
        values = schema["enum"]
    if values is not None:
        strings = [v for v in values if isinstance(v, str)]
        if not strings:
            raise GrammarError(where, "the enum has no string value for a string parameter")
        parts.append("/(" + "|".join(_regex_literal(v) for v in strings) + ")/")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        body = llguidance.regex_to_lark(pattern, "dw")
        if body.startswith("^") and body.endswith("$") and not body.endswith("\\$"):
            parts.append(f"/{body[1:-1]}/")
        elif body.startswith("^"):
            parts.append(f"/(?:{body[1:]})(?s:.*)/")
        elif body.endswith("$") and not body.endswith("\\$"):
            parts.append(f"/(?s:.*)(?:{body[:-1]})/")
        else:
            parts.append(f"/(?s:.*)(?:{body})(?s:.*)/")
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if isinstance(lo, int) or isinstance(hi, int):
        lo_s = str(lo if isinstance(lo, int) else 0)
        hi_s = str(hi) if isinstance(hi, int) else ""
        parts.append(f"/(?s:.){{{lo_s},{hi_s}}}/")
    return " & ".join(parts)


def _enum_value(schema: Mapping[str, Any], types: list[str], where: str) -> str:
    values = [schema["const"]] if "const" in schema else list(schema.get("enum") or [])
    texts = []
    for v in values:
        if isinstance(v, str):
            try:
                back = json.loads(v)
            except ValueError:
                back = v
            if not isinstance(back, str) and json_type(back) in types:
                continue  # "3" beside an integer type would read back as 3
            texts.append(v)
        else:
            texts.append(json.dumps(v, ensure_ascii=False))
    if not texts:
        raise GrammarError(where, "no enum value can be written as a parameter")
    return "/(" + "|".join(_regex_literal(t) for t in texts) + ")/"


def _param_schema(root: Mapping[str, Any], prop: Any) -> dict[str, Any]:
    """A parameter's schema, carrying the root's $defs / definitions so its $refs resolve."""
    s = dict(prop) if isinstance(prop, Mapping) else {}
    for key in ("$defs", "definitions"):
        if key in root and key not in s:
            s[key] = root[key]
    return s


def _without_string(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its string alternative dropped (a string-or-X parameter is written as X:
    the verbatim form of a string would be read back as X whenever it parses as one)."""
    s = dict(schema)
    t = s.get("type")
    if isinstance(t, list):
        s["type"] = [x for x in t if x != "string"]
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            s[key] = [b for b in s[key] if schema_types(b) != ["string"]]
    return s


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], conventions: ChatConventions, *, parallel: bool = True,
                      trigger: bool = False, field_name: str = "tools",
                      marker_tokens: Collection[str] | None = None) -> GrammarSpec:
    """Tool calls to any of ``tools`` (OpenAI tool objects) in the family's syntax
    (``conventions.tool_syntax``), one or (``parallel``) several separated by a newline, the
    arguments constrained by each tool's parameters schema. ``trigger``: for ``tool_choice: auto``
    -- free text until the model opens the call marker (``<tool_call>``). ``marker_tokens``: the
    vocabulary's marker texts (``Tokenizer.marker_texts``); a call marker that is not one of them
    is written as text (a vocabulary that never added ``<tool_call>``). None: both markers are
    tokens."""
    if not tools:
        raise GrammarError(field_name, "no tools to call")
    rules: list[str] = []
    alts: list[str] = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise GrammarError(f"{field_name}[{i}]", "a tool needs function.name")
        raw_params = fn.get("parameters")
        params: Mapping[str, Any] = raw_params if isinstance(raw_params, Mapping) else {}
        if conventions.tool_syntax == "json":
            rules += _json_call_rules(i, fn["name"], params, f"{field_name}[{i}]")
        else:
            rules += _xml_call_rules(i, fn["name"], params, f"{field_name}[{i}]")
        alts.append(f"f{i}")
    def marker(text: str) -> str:
        # a token of the vocabulary (special in llguidance's trie) is named as <name>; else text
        return text if marker_tokens is None or text in marker_tokens else _lark_str(text)

    call = (f"call: {marker(conventions.tool_call_open)} \"\\n\" ({' | '.join(alts)}) "
            f"{marker(conventions.tool_call_close)}")
    calls = 'call ("\\n" call)*' if parallel else "call"
    lark = "\n".join([f"start: {calls}", call, *rules]) + "\n"
    return GrammarSpec(_from_lark(lark), field_name, "tool_call", conventions.tool_call_open if trigger else None)


def _json_call_rules(i: int, name: str, params: Mapping[str, Any], where: str) -> list[str]:
    """Hermes: ``{"name": "NAME", "arguments": {...}}`` then a newline, the arguments one JSON
    object of the parameters schema (no undeclared key unless the schema allows them)."""
    schema = dict(params)
    schema.setdefault("type", "object")
    if isinstance(schema.get("properties"), Mapping):
        schema.setdefault("additionalProperties", False)
    _must_finish(unfinishable_schema(schema), f"{where}.function.parameters")
    head = _lark_str('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
    return [f"f{i}: {head} %json {_json_text(schema)} " + _lark_str("}\n")]


def _xml_call_rules(i: int, name: str, params: Mapping[str, Any], where0: str) -> list[str]:
    """Qwen3.5's XML call: each parameter constrained by its schema, required ones in declaration
    order, optional ones where they are declared, nothing else."""
    if any(c in name for c in "<>\n"):
        raise GrammarError(f"{where0}.function.name", f"{name!r} cannot be written in the XML syntax")
    raw_props = params.get("properties")
    props: Mapping[str, Any] = raw_props if isinstance(raw_props, Mapping) else {}
    required = set(params.get("required") or [])
    rules: list[str] = []
    pieces = []
    for j, (pname, prop) in enumerate(props.items()):
        where = f"{where0}.function.parameters.properties.{pname}"
        if any(c in pname for c in "<>\n"):
            raise GrammarError(where, f"parameter name {pname!r} cannot be written in the XML syntax")
        rule = f"f{i}_p{j}"
        head = _lark_str(f"<parameter={pname}>\n")
        tail = _lark_str("\n</parameter>\n")
        ps = _param_schema(params, prop)
        types = schema_types(ps)
        if not types or ("string" in types and set(types) <= {"string", "null"}):
            # verbatim text, then the closing tag, as one lazy lexeme: it ends at the first
            # closing tag (a greedy one would run on past it). With a null alternative the
            # text "null" reads back as None, which the schema allows too.
            value = f"F{i}_P{j}"
            constraint = _raw_string_value(ps, where) if types else _NO_CLOSING_TAG
            rules.append(f"{value}: ({constraint}) {tail}")
            rules.append(f"{rule}_v[lazy]: {value}")
            rules.append(f"{rule}: {head} {rule}_v")
        elif ("enum" in ps or "const" in ps) and "string" in types:
            # a mixed enum: each value as the template writes it (strings verbatim, others as
            # JSON), kept only if the parser reads it back as that same value
            value = f"F{i}_P{j}"
            rules.append(f"{value}: ({_enum_value(ps, types, where)}) {tail}")
            rules.append(f"{rule}_v[lazy]: {value}")
            rules.append(f"{rule}: {head} {rule}_v")
        else:
            js = _without_string(ps) if "string" in types else ps
            _must_finish(unfinishable_schema(js), where)
            rules.append(f"{rule}: {head} %json {_json_text(js)} {tail}")
        pieces.append(rule if pname in required else f"{rule}?")
    body = " ".join(pieces)
    rules.append(f"f{i}: {_lark_str(f'<function={name}>' + chr(10))} {body} {_lark_str('</function>' + chr(10))}")
    return rules


# ----------------------------------------------------------------------------- compile + cache


@dataclass
class CompiledGrammar:
    spec: GrammarSpec
    matcher: Any  # a fresh llguidance.LLMatcher in its start state; copied per generation
    compile_ms: float


_COMPILED: dict[tuple[int, str], CompiledGrammar] = {}
_COMPILED_MAX = 64
_COMPILED_LOCK = threading.Lock()


def compile_grammar(spec: GrammarSpec, tok: Tokenizer) -> CompiledGrammar:
    """Validate and build ``spec`` for ``tok``'s vocabulary, cached per (vocabulary, grammar text):
    a warm process pays the compile once per schema / tool list. GrammarError when llguidance
    rejects a construct."""
    import llguidance

    lt = grammar_tokenizer(tok)
    key = (id(lt), spec.grammar)
    with _COMPILED_LOCK:
        hit = _COMPILED.get(key)
    if hit is not None:
        # the same grammar text may come with another trigger or field (tool_choice auto and
        # required compile the same calls): the matcher is shared, the spec is this request's
        return hit if hit.spec == spec else replace(hit, spec=spec)
    t0 = time.perf_counter()
    is_err, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(spec.grammar, lt)
    if is_err:
        raise GrammarError(spec.field, _short(msgs[0] if msgs else "llguidance rejected the grammar"))
    m = llguidance.LLMatcher(lt, spec.grammar, log_level=0)
    if m.is_error():
        raise GrammarError(spec.field, _short(m.get_error()))
    # the first step's mask, on a copy: a grammar whose language is empty (no rule reaches a
    # terminal, an intersection of disjoint regexes) fails here instead of mid-decode
    probe = m.deep_copy()
    bits = np.zeros((tok.n_vocab + 31) // 32, dtype=np.int32)
    probe.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    if probe.is_error() or not (bits.any() or probe.is_accepting()):
        raise GrammarError(spec.field, "the grammar admits no output: no rule of it reaches text the model "
                                       "could write")
    compiled = CompiledGrammar(spec, m, (time.perf_counter() - t0) * 1e3)
    with _COMPILED_LOCK:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = compiled
    return compiled


def _short(msg: str) -> str:
    # llguidance's errors can carry the whole grammar; the first line names the construct
    first = msg.strip().splitlines()[0] if msg.strip() else msg
    return first[:500]


# ----------------------------------------------------------------------------- one generation

_MASK_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warmllm-mask")


@dataclass
class Constraint:
    """The grammar state of one generation.

    ``reasoning``: the reply's reasoning (engine/reasoning.py), when the prompt left a reasoning
    block open: nothing is masked by the grammar until it ends -- wherever
    :func:`engine.reasoning.split_reasoning` says it ends, so the parser's content and the masked
    text are the same text -- and meanwhile the reply may neither stop nor close the block with
    answer text in the same token. Call :meth:`mask` on each step's logits before sampling and
    :meth:`accept` with the kept token; :attr:`finished` says the grammar is complete (the
    generation stops there, finish_reason ``stop``)."""

    compiled: CompiledGrammar
    tokenizer: Tokenizer
    reasoning: ReasoningWatch | None = None
    mask_ms: float = 0.0
    masked_steps: int = 0
    _matcher: Any = None
    _active: bool = False
    _pending: Future | None = None
    _bits: np.ndarray | None = None
    _trigger: int | None = None
    _trigger_text: str | None = None  # a trigger the vocabulary has no marker token for
    _seen: str = ""                   # the reply's text since its reasoning, while it waits for that
    _decoder: IncrementalDecoder | None = None
    finished: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        self._matcher = self.compiled.matcher.deep_copy()
        n = self.tokenizer.n_vocab
        self._bits = np.full((n + 31) // 32, -1, dtype=np.int32)
        trig = self.compiled.spec.trigger
        if trig:
            tid = self.tokenizer.token_id(trig)
            if tid is not None and self.tokenizer.is_marker(tid):
                self._trigger = tid
            else:  # tool_call_grammar wrote it as text for this vocabulary: watch the text
                self._trigger_text = trig
                self._decoder = self.tokenizer.incremental_decoder()
        self._active = not self.reasoning_open and not trig
        if self._active:
            self._prefetch()

    @property
    def reasoning_open(self) -> bool:
        """The reply is still inside its reasoning block."""
        return self.reasoning is not None and self.reasoning.open

    @property
    def active(self) -> bool:
        return self._active

    def _prefetch(self) -> None:
        # the mask of the next step, computed while the forward runs (llguidance drops the GIL)
        assert self._bits is not None
        bits, m = self._bits, self._matcher
        self._pending = _MASK_POOL.submit(m.unsafe_compute_mask_ptr, bits.ctypes.data, bits.nbytes)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with the tokens the grammar forbids at -inf (a new array; the input is left
        alone). Unchanged while the constraint is not active."""
        if not self._active:
            if self.reasoning is not None and self.reasoning.open:
                if self.compiled.spec.trigger:
                    return logits
                forbidden = self.reasoning.forbidden()    # the answer's grammar comes next: keep it reachable
            elif self._trigger_text is not None:          # the marker must end on a token boundary
                forbidden = forbidden_after(self._seen, self.tokenizer, self._trigger_text, blank_ok=False)
            else:
                return logits
            out = np.array(logits, dtype=np.float32, copy=True)
            out[forbidden] = -np.inf
            return out
        t0 = time.perf_counter()
        if self._pending is None:
            self._prefetch()
        assert self._pending is not None and self._bits is not None
        self._pending.result()
        self._pending = None
        n = logits.shape[-1]
        # the forbidden tokens as a bool vector, then one fancy-index store: 0.17 ms for 248k
        # logits where np.where took 0.84 ms (measured on this host under load)
        forbidden = np.unpackbits((~self._bits).view(np.uint8), bitorder="little")[:n].view(bool)
        out = np.array(logits, dtype=np.float32, copy=True)
        out[forbidden] = -np.inf
        if forbidden.all():  # cannot happen for a valid grammar; never sample from nothing
            self.error = "the grammar allows no token"
            out = logits
        self.mask_ms += (time.perf_counter() - t0) * 1e3
        self.masked_steps += 1
        return out

    def accept(self, token: int) -> None:
        """Advance past the sampled ``token``."""
        if self.finished:
            return
        if not self._active:
            if self.reasoning_open:
                assert self.reasoning is not None
                if self.reasoning.feed(token):  # the block closed with this token
                    self._active = not self.compiled.spec.trigger
                    if self._active:
                        self._prefetch()
                return
            if self._trigger_text is not None:
                assert self._decoder is not None
                self._seen += self._decoder.feed(token)
                if self._trigger_text not in self._seen:
                    return
                # the model wrote the marker, ending with this token (the mask saw to that): the
                # grammar starts with it, whichever tokens spelled it
                self._active = True
                for t in self.tokenizer.encode_text(self._trigger_text):
                    if not self._matcher.consume_token(t):
                        self.error = _short(self._matcher.get_error() or "the grammar refused its own trigger")
                        self.finished = True
                        return
                self._prefetch()
                return
            if token != self._trigger:
                return
            self._active = True  # the model opened the call itself: the grammar starts with it
        if token in self.tokenizer.eog_ids:
            self.finished = True
            return
        if not self._matcher.consume_token(int(token)):
            self.error = _short(self._matcher.get_error() or "the sampled token was not allowed")
            self.finished = True
            return
        if self._matcher.is_stopped():
            self.finished = True
            return
        self._prefetch()

    def close(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None
