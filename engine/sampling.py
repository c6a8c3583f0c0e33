"""Next-token choice from logits: greedy, or temperature / top-k / top-p / min-p with a seed;
before it, OpenAI's logit_bias and presence / frequency penalties; after it, the log-probabilities
``logprobs`` asks for."""
from __future__ import annotations

from dataclasses import dataclass, field
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
    # OpenAI semantics: bias added to a token's logit (-100..100); penalties subtract
    # count * frequency_penalty + (count > 0) * presence_penalty for tokens already generated
    # (the completion so far, not the prompt: vLLM's rule), each in -2..2.
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0):
            raise SamplingError("temperature", f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise SamplingError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SamplingError("top_k", f"top_k must be >= 0 (0: off), got {self.top_k}")
        if not (0 <= self.min_p <= 1):
            raise SamplingError("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (-2.0 <= getattr(self, name) <= 2.0):
                raise SamplingError(name, f"{name} must be in [-2, 2], got {getattr(self, name)}")
        for tid, bias in self.logit_bias.items():
            if not (-100.0 <= bias <= 100.0):
                raise SamplingError(f"logit_bias.{tid}", f"logit_bias[{tid}] must be in [-100, 100], got {bias}")

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


class Sampler:
    """Stateful only through its random generator, so a seed reproduces a whole generation."""

    def __init__(self, params: SamplingParams) -> None:
        # numpy here, not at module scope: the function imports SamplingParams while parsing
        # requests, and its module import (Lambda's init) loads numpy in the model-load thread
        import numpy as np

        self._np = np
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.counts: dict[int, int] = {}  # generated token -> how often (for the penalties)
        self._bias_ids = np.array(list(params.logit_bias), dtype=np.int64)
        self._bias = np.array(list(params.logit_bias.values()), dtype=np.float32)

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with logit_bias and the penalties applied (a new array when anything applies;
        the input, which may be the model's buffer, is never written)."""
        np = self._np
        p = self.params
        if not p.adjusts_logits:
            return logits
        if self._bias_ids.size and int(self._bias_ids.max()) >= logits.shape[-1]:
            raise SamplingError("logit_bias", f"logit_bias names token {int(self._bias_ids.max())}; the vocabulary "
                                f"has {logits.shape[-1]}")
        z = np.array(logits, dtype=np.float32, copy=True)
        if self._bias_ids.size:
            z[self._bias_ids] += self._bias
        if self.counts and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.counts, dtype=np.int64, count=len(self.counts))
            n = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
            z[ids] -= n * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)
        return z

    def observe(self, token: int) -> None:
        """Count a generated token (the penalties act on the completion so far)."""
        self.counts[token] = self.counts.get(token, 0) + 1

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


def top_logprobs(logits: np.ndarray, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """(log-probability of ``token``, the ``n`` most likely tokens with theirs) under softmax(logits):
    the distribution the sampler chose from, after logit_bias, penalties and the grammar mask and
    before temperature / top-k / top-p (vLLM's and llama-server's convention)."""
    import numpy as np

    z = logits.astype(np.float64)
    m = float(np.max(z))
    lse = m + float(np.log(np.sum(np.exp(z - m))))
    chosen = float(z[token]) - lse
    top: list[tuple[int, float]] = []
    if n > 0:
        k = min(n, z.size)
        idx = np.argpartition(-z, k - 1)[:k]
        idx = idx[np.argsort(-z[idx], kind="stable")]
        top = [(int(i), float(z[i]) - lse) for i in idx if np.isfinite(z[i])]  # masked ones are no choice
    return chosen, top
