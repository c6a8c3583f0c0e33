"""A request's output constraint and logprobs, between the OpenAI fields and the engine.

``grammar_for`` picks the one grammar a chat or completion request needs (engine/constraints.py
builds it): a forced tool call (``tool_choice`` ``required`` or a named function) wins; else
``response_format`` / ``grammar`` / ``regex`` / ``structured_outputs``; else, with tools offered
and ``tool_choice`` ``auto`` (the default), a tool-call grammar in the model family's syntax
(engine/conventions.py) that starts only when the model opens ``<tool_call>``. ``logprob_entries`` turns the engine's token ids into OpenAI's texts and
bytes.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from . import openai_schema as oa

if TYPE_CHECKING:
    from engine.constraints import GrammarSpec
    from engine.conventions import ChatConventions


def grammar_for(greq: oa.GenRequest, conventions: ChatConventions, marker_tokens: Collection[str]) -> GrammarSpec | None:
    """The grammar this request asks for, or None. ``marker_tokens``: the vocabulary's marker
    texts (a tool-call marker that is none of them is enforced as text). GrammarError (a
    ValueError naming the field) for a constraint that cannot be built."""
    from engine import constraints as C

    tc = greq.tool_choice
    if greq.tools and (tc == "required" or isinstance(tc, dict)):
        return C.tool_call_grammar(greq.tools, conventions, parallel=greq.parallel_tool_calls, field_name="tools",
                                   marker_tokens=marker_tokens)
    s = greq.structured
    if s is not None:
        if s.kind in ("json_schema", "json_object"):
            assert isinstance(s.value, dict)
            return C.json_schema_grammar(s.value, s.param, s.kind)
        if s.kind == "grammar":
            assert isinstance(s.value, str)
            return C.lark_grammar(s.value, s.param)
        if s.kind == "regex":
            assert isinstance(s.value, str)
            return C.regex_grammar(s.value, s.param)
        if s.kind == "choice":
            assert isinstance(s.value, list)
            return C.choice_grammar(s.value, s.param)
        raise ValueError(f"unknown constraint kind {s.kind!r}")
    if greq.tools and tc in (None, "auto"):
        return C.tool_call_grammar(greq.tools, conventions, parallel=greq.parallel_tool_calls, trigger=True,
                                   field_name="tools", marker_tokens=marker_tokens)
    return None


def logprob_entries(tokenizer: Any, entries: list[Any]) -> list[oa.TokenLogprob]:
    """engine.decoding.TokenLogprob (ids) → the texts and bytes the OpenAI shapes carry."""
    def piece(tid: int) -> tuple[str, list[int]]:
        b = tokenizer.token_bytes(tid)
        return b.decode("utf-8", errors="replace"), list(b)

    out = []
    for e in entries:
        text, raw = piece(e.token)
        out.append(oa.TokenLogprob(text, raw, e.logprob, [(*piece(t), lp) for t, lp in e.top]))
    return out
