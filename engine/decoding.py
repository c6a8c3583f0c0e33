"""One decode step's choice: logits → (logit_bias, penalties) → grammar mask → sampler → token,
with the log-probabilities a request asked for. Generation calls :class:`TokenPicker` once per step
and tells it the token it kept; the picker keeps what the penalties and the grammar need."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.constraints import Constraint
from engine.sampling import Sampler, top_logprobs


@dataclass
class TokenLogprob:
    """A generated token's log-probability and the ``top`` alternatives (id, logprob), most likely
    first, under the distribution the sampler chose from (after bias, penalties and mask, before
    temperature / top-k / top-p)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class TokenPicker:
    """``picker(logits)`` → the next token; ``picker.accept(token)`` after the token is kept.
    ``logprobs``: None for none, else how many alternatives per token (0: the chosen one's only)."""

    def __init__(self, sampler: Sampler, constraint: Constraint | None = None,
                 logprobs: int | None = None) -> None:
        self.sampler = sampler
        self.constraint = constraint
        self.top_n = logprobs
        self.logprobs: list[TokenLogprob] | None = [] if logprobs is not None else None

    def __call__(self, logits: np.ndarray) -> int:
        z = self.sampler.adjust(logits)
        if self.constraint is not None:
            z = self.constraint.mask(z)
        tok = self.sampler(z)
        if self.logprobs is not None and self.top_n is not None:
            lp, top = top_logprobs(z, tok, self.top_n)
            self.logprobs.append(TokenLogprob(tok, lp, top))
        return tok

    def force(self, logits: np.ndarray, token: int) -> int:
        """``token`` chosen for the model (a reasoning block closed for it): no sampling, the
        logprobs entry says what the model thought of it."""
        if self.logprobs is not None and self.top_n is not None:
            z = self.sampler.adjust(logits)
            lp, top = top_logprobs(z, token, self.top_n)
            self.logprobs.append(TokenLogprob(token, lp, top))
        return token

    def accept(self, token: int) -> None:
        self.sampler.observe(token)
        if self.constraint is not None:
            self.constraint.accept(token)

    @property
    def finished(self) -> bool:
        """The grammar is complete: nothing but end-of-generation may follow."""
        return self.constraint is not None and self.constraint.finished

    def close(self) -> None:
        if self.constraint is not None:
            self.constraint.close()

    def timings(self) -> dict[str, float]:
        c = self.constraint
        if c is None:
            return {}
        return {"mask_ms": c.mask_ms, "masked_steps": float(c.masked_steps)}
