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
