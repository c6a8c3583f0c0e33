"""Next-token choice from logits: greedy, or temperature / top-k / top-p / min-p with a seed."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 → greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 → off
    min_p: float = 0.0
    seed: int | None = None

    def validate(self) -> None:
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not (0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")


class Sampler:
    """Stateful only through its random generator, so a seed reproduces a whole generation."""

    def __init__(self, params: SamplingParams) -> None:
        params.validate()
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
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
