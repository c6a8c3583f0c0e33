"""Errors the engine raises on purpose. Each message names the problem and the fix."""
from __future__ import annotations


class ModelLoadError(ValueError):
    """The GGUF file cannot be used: not a GGUF, truncated, wrong architecture, bad tensors."""


class ContextOverflow(ValueError):
    """prompt + max_tokens does not fit in the model's context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}: "
            f"{prompt_tokens + max_tokens} exceeds the context of {n_ctx} tokens; "
            "shorten the prompt or lower max_tokens"
        )


class PrefillDeadline(Exception):
    """The prefill reached its deadline between two chunks and stopped there (the session holds
    the tokens done so far; nothing half-advanced is kept). Not a ValueError: the input was fine,
    the time ran out."""

    def __init__(self, done_tokens: int, remaining_tokens: int) -> None:
        self.done_tokens = done_tokens
        self.remaining_tokens = remaining_tokens
        self.result: object = None     # the session's PrefillResult for the part done (set as it propagates)
        super().__init__(f"the deadline came after {done_tokens} prefilled tokens, {remaining_tokens} still to go")
