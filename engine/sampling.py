"""Next-token choice from logits: greedy, or temperature / top-k / top-p / min-p with a seed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


class SamplingError(ValueError):
    """A sampling field out of range; `field` names it (the function's 400 `param`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SamplingParams:
    """How to choose each token: the one sampling type, from the API request (the function
    builds it from the OpenAI fields) to the Sampler. Checked once, when made."""

    temperature: float = 1.0  # 0 → greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 → off
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0):
            raise SamplingError("temperature", f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise SamplingError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SamplingError("top_k", f"top_k must be >= 0 (0: off), got {self.top_k}")
        if not (0 <= self.min_p <= 1):
            raise SamplingError("min_p", f"min_p must be in [0, 1], got {self.min_p}")


class Sampler:
    """Stateful only through its random generator, so a seed reproduces a whole generation."""

    def __init__(self, params: SamplingParams) -> None:
        # numpy here, not at module scope: the function imports SamplingParams while parsing
        # requests, and its module import (Lambda's init) loads numpy in the model-load thread
        import numpy as np

        self._np = np
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        np = self._np
        p = self.params
        if p.temperature == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64)
        candidates = np.arange(z.size)
        if p.top_k and p.top_k < z.size:
            keep = np.argpartition(-z, p.top_k - 1)[: p.top_k]
            candidates, z = keep, z[keep]
        order = np.argsort(-z, kind="stable")
        candidates, z = candidates[order], z[order]
        probs = np.exp(z - z[0])  # before temperature: top-p / min-p act on the model's distribution
        probs /= probs.sum()
        n = z.size
        if p.top_p < 1.0:
            n = min(n, int(np.searchsorted(np.cumsum(probs), p.top_p) + 1))
        if p.min_p > 0:
            n = min(n, max(1, int(np.sum(probs[:n] >= p.min_p * probs[0]))))
        z = z[:n] / p.temperature
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        return int(candidates[self.rng.choice(n, p=probs)])
