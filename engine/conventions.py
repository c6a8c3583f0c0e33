"""A model family's chat conventions: how its replies mark reasoning and tool calls.

One object per family, beside its model file (engine/models/), chosen from the GGUF by
`engine.models.load_conventions`. The reasoning split (engine/history.py,
function/tool_calls.py, function/streaming.py), the tool-call grammar (engine/constraints.py)
and the tool-call parser read it, so none of them assumes one family's syntax.

Two tool-call syntaxes are known, both inside ``<tool_call>`` … ``</tool_call>``:

- ``"xml"`` (Qwen3.5, Qwen3-Coder)::

      <tool_call>
      <function=NAME>
      <parameter=P>
      VALUE
      </parameter>
      </function>
      </tool_call>

- ``"json"`` (Hermes; Qwen2.5, Qwen3)::

      <tool_call>
      {"name": "NAME", "arguments": {"P": VALUE}}
      </tool_call>

This module is a leaf (it imports nothing of the engine): the model files import it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ChatConventions", "ToolSyntax"]

ToolSyntax = Literal["xml", "json"]


@dataclass(frozen=True)
class ChatConventions:
    """``think_open`` / ``think_close``: the reasoning block's markers, None for a family that
    does not reason. ``tool_syntax``: how a call is written between ``tool_call_open`` and
    ``tool_call_close`` (see the module doc)."""

    name: str
    tool_syntax: ToolSyntax
    tool_call_open: str = "<tool_call>"
    tool_call_close: str = "</tool_call>"
    think_open: str | None = "<think>"
    think_close: str | None = "</think>"

    def __post_init__(self) -> None:
        if (self.think_open is None) != (self.think_close is None):
            raise ValueError(f"{self.name}: reasoning markers come in pairs")
        if self.tool_syntax not in ("xml", "json"):
            raise ValueError(f"{self.name}: unknown tool-call syntax {self.tool_syntax!r}")

    @property
    def reasons(self) -> bool:
        return self.think_close is not None

    def without_reasoning(self) -> ChatConventions:
        """These conventions for a template that never writes a reasoning block."""
        return ChatConventions(self.name, self.tool_syntax, self.tool_call_open, self.tool_call_close, None, None)
