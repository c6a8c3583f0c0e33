"""History stays text: a conversation's fields are rendered by the chat template and tokenized
with no special or marker token in them.

An agent platform forwards whatever earlier turns contained, so no field a client sends may
become a token the template alone should write: ``<|im_start|>system`` typed in a message, in
reasoning, in a tool call's name or arguments, in a tool result or a tool definition stays text.

How (one path for the handler and the CLI: ``Engine.chat_prompt``):

1. ``split_history_reasoning``: an assistant message whose content holds the family's reasoning
   close marker (``</think>``) is split into ``reasoning_content`` and ``content`` here, the way
   Qwen's templates split it, because the template cannot see the marker once step 2 has escaped it.
2. ``FieldEscape.tree``: every string of the messages and tools (dictionary keys too) is escaped.
   Each character that begins or ends a marker text (``<`` and ``>`` in Qwen's vocabulary) and
   the escape character itself become a two-character code from Unicode's noncharacters
   (U+FDD0...). A field then cannot hold a marker text, and cannot complete one with the
   template's own text at its edges (a tool name ``x</tool_call`` before the template's ``>``).
3. The template renders the escaped fields. Every marker text in its output was written by the
   template: ``FieldEscape.pieces`` cuts the output at them; markers become their tokens, the
   text between is unescaped and encoded with no special or marker token at all
   (``Tokenizer.encode_text``).
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.conventions import ChatConventions

__all__ = ["FieldEscape", "Piece", "split_history_reasoning"]

# Unicode noncharacters: never meant to be interchanged, so a template has no reason to touch
# them; a client may still send them, which is why the escape character escapes itself.
_ESC = "\ufdd0"
_CODE0 = 0xFDD1


@dataclass(frozen=True)
class Piece:
    """A run of a rendered prompt: a marker the template wrote (one token) or text."""

    text: str
    marker: bool


@dataclass
class FieldEscape:
    """The escape of one vocabulary's marker texts (the tokens a tokenizer splits out of text
    when it parses specials: CONTROL, USER_DEFINED, UNKNOWN)."""

    markers: tuple[str, ...]
    _chars: tuple[str, ...] = field(init=False)
    _code: dict[str, str] = field(init=False)
    _escape_re: re.Pattern[str] = field(init=False)
    _marker_re: re.Pattern[str] | None = field(init=False)

    def __post_init__(self) -> None:
        edges = {m[0] for m in self.markers if m} | {m[-1] for m in self.markers if m}
        self._chars = (_ESC, *sorted(edges - {_ESC}))
        if len(self._chars) > 0xFDEF - _CODE0 + 1:
            raise ValueError(f"{len(self._chars)} marker edge characters: more than the escape has codes for")
        self._code = {c: _ESC + chr(_CODE0 + i) for i, c in enumerate(self._chars)}
        self._escape_re = re.compile("|".join(re.escape(c) for c in self._chars))
        # longest first: at one position the longest marker wins (leftmost-longest, as the tokenizer)
        ordered = sorted({m for m in self.markers if m}, key=len, reverse=True)
        self._marker_re = re.compile("|".join(re.escape(m) for m in ordered)) if ordered else None

    def escape(self, text: str) -> str:
        return self._escape_re.sub(lambda m: self._code[m.group()], text)

    def unescape(self, text: str) -> str:
        if _ESC not in text:
            return text
        out, i, n = [], 0, len(text)
        while i < n:
            j = text.find(_ESC, i)
            if j < 0 or j + 1 >= n:
                out.append(text[i:])
                break
            out.append(text[i:j])
            k = ord(text[j + 1]) - _CODE0
            if 0 <= k < len(self._chars):
                out.append(self._chars[k])
                i = j + 2
            else:  # not one of ours (a template cut a code in two): keep it as it is
                out.append(_ESC)
                i = j + 1
        return "".join(out)

    def tree(self, value: Any) -> Any:
        """`value` (messages or tools: dicts, lists, strings, numbers) with every string escaped,
        keys included. The caller's objects are not modified."""
        if isinstance(value, str):
            return self.escape(value)
        if isinstance(value, Mapping):
            return {self.escape(k) if isinstance(k, str) else k: self.tree(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.tree(v) for v in value]
        return value

    def pieces(self, rendered: str) -> list[Piece]:
        """`rendered` (a template's output over escaped fields) cut at the template's markers,
        the text between unescaped."""
        out: list[Piece] = []
        pos = 0
        if self._marker_re is not None:
            for m in self._marker_re.finditer(rendered):
                if m.start() > pos:
                    out.append(Piece(self.unescape(rendered[pos:m.start()]), False))
                out.append(Piece(m.group(), True))
                pos = m.end()
        if pos < len(rendered):
            out.append(Piece(self.unescape(rendered[pos:]), False))
        return out

    def offset_map(self, rendered: str) -> OffsetMap:
        """Maps character offsets of `rendered` to offsets of its unescaped text."""
        return OffsetMap([m.start() for m in re.finditer(re.escape(_ESC) + ".", rendered, re.DOTALL)])


@dataclass
class OffsetMap:
    codes: list[int]  # where each two-character code starts in the escaped text

    def __call__(self, offset: int) -> int:
        # every code before `offset` is one character shorter unescaped
        return offset - bisect.bisect_left(self.codes, offset)


def split_history_reasoning(messages: Sequence[dict[str, Any]], conventions: ChatConventions
                            ) -> list[dict[str, Any]]:
    """Assistant messages whose content holds the close marker (``</think>``) and that have no
    ``reasoning_content``, split the way Qwen's templates split them: the reasoning is what
    precedes the first close marker (after any open marker, newlines trimmed), the content what
    follows the last. Unchanged for a family that does not reason."""
    close, open_ = conventions.think_close, conventions.think_open
    if close is None or open_ is None:
        return list(messages)
    out = []
    for m in messages:
        content = m.get("content")
        if (m.get("role") == "assistant" and isinstance(content, str) and close in content
                and not isinstance(m.get("reasoning_content"), str)):
            m = dict(m)
            parts = content.split(close)
            m["reasoning_content"] = parts[0].rstrip("\n").split(open_)[-1].lstrip("\n")
            m["content"] = parts[-1].lstrip("\n")
        out.append(m)
    return out
