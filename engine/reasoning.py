"""Where a reply's reasoning ends: one rule for the reply parser, the stream and the grammar mask.

A family that reasons (engine/conventions.py) writes ``<think> … </think>`` before its answer.
:func:`split_reasoning` is the one function that says where that block ends in a reply's text:
the chat reply parser (function/tool_calls.py), the streamed deltas (function/streaming.py) and
the constrained decoder (:class:`ReasoningWatch`, engine/constraints.py) all call it, so a
schema's mask starts exactly where the parser's ``content`` starts, however the model spelled
the close marker (one special token, or ``</``, ``think``, ``>`` as text tokens).

The rule: the reply has reasoning when the prompt left a block open (the template's generation
prompt ends in ``<think>``) or when the reply itself begins, after blank space, with the open
marker; the reasoning runs to the first close marker; the content is what follows, stripped. Any
other reply is all content (a ``</think>`` inside an answer's JSON string is text).

While a constrained reply reasons, :class:`ReasoningWatch` keeps the answer reachable: no
end-of-generation token (a reply that stops inside its reasoning has no answer), and no token
that would close the block and carry answer text in the same token (that text would bypass the
grammar). :func:`reasoning_budget` is how many tokens the reasoning may take before the close
marker is written for the model, so the answer keeps room.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.conventions import ChatConventions
from engine.markers import forbidden_after
from engine.tokenizer import IncrementalDecoder, Tokenizer

__all__ = ["ReasoningSplit", "ReasoningWatch", "close_text", "reasoning_budget", "split_reasoning"]


@dataclass(frozen=True)
class ReasoningSplit:
    """``reasoning``: the block's text, stripped (None: no reasoning, or only blank space).
    ``content``: the answer after it (the whole reply when it has no reasoning). ``open``: the
    block has not been closed yet: everything so far is reasoning."""

    reasoning: str | None
    content: str
    open: bool


def split_reasoning(text: str, conventions: ChatConventions, prompt_opens_think: bool = False) -> ReasoningSplit:
    """The reply ``text`` cut into reasoning and content (the rule is in the module doc)."""
    open_, close = conventions.think_open, conventions.think_close
    if open_ is None or close is None:
        return ReasoningSplit(None, text, False)
    body = text
    if not prompt_opens_think:
        lead = text.lstrip()
        if not lead.startswith(open_):
            return ReasoningSplit(None, text, False)
        body = lead[len(open_):]
    reasoning, closed, rest = body.partition(close)
    if not closed:
        return ReasoningSplit(reasoning.strip() or None, "", True)
    return ReasoningSplit(reasoning.strip() or None, rest.strip(), False)


def reasoning_budget(limit: int) -> int:
    """Tokens a constrained reply may reason before the close marker is written for it: half of
    its token limit (``max_completion_tokens``, or the context left), so the answer keeps the
    other half."""
    return max(0, limit // 2)


def close_text(conventions: ChatConventions) -> str:
    """What is written for a model whose reasoning budget ran out: the close marker on its own
    line. Nothing after it: the answer's grammar starts right there (a grammar's first token is
    the answer's, never blank space)."""
    assert conventions.think_close is not None
    return f"\n{conventions.think_close}"


# ----------------------------------------------------------------------------- the watch


@dataclass
class ReasoningWatch:
    """A reply's reasoning, followed token by token: :meth:`feed` each kept token, :attr:`open`
    says the reply is still reasoning (by :func:`split_reasoning` on the text so far) and
    :meth:`forbidden` lists the tokens a constrained reply may not take next."""

    tokenizer: Tokenizer
    conventions: ChatConventions
    prompt_opens_think: bool
    text: str = ""
    tokens: int = 0
    open: bool = field(init=False)
    _decoder: IncrementalDecoder = field(init=False, repr=False)
    _eog: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._decoder = self.tokenizer.incremental_decoder()
        self._eog = np.asarray(sorted(self.tokenizer.eog_ids), dtype=np.int64)
        self.open = self.conventions.reasons and split_reasoning("", self.conventions, self.prompt_opens_think).open

    def feed(self, token: int) -> bool:
        """Take a kept token; True when it ended the reasoning."""
        if not self.open:
            return False
        self.tokens += 1
        self.text += self._decoder.feed(token)
        self.open = split_reasoning(self.text, self.conventions, self.prompt_opens_think).open
        return not self.open

    def forbidden(self) -> np.ndarray:
        """Token ids a constrained reply may not take while it reasons: end-of-generation, and any
        token that would finish the close marker with answer text after it in the same token."""
        close = self.conventions.think_close
        assert close is not None
        return np.concatenate([self._eog, forbidden_after(self.text, self.tokenizer, close, blank_ok=True)])
