"""Refuse up front what cannot be prefilled before the deadline.

``PrefillRate`` is the warm process's measured prefill speed: after every generation that
prefilled at least ``MIN_TOKENS`` tokens it takes ``prefilled_tokens / prefill_ms`` into an
exponential average (``ALPHA``; a cold process has no estimate and admits everything, the prefill's
own deadline check between chunks still bounds it). Before a prefill starts, the session tells us
how many tokens are left to prefill after reuse and snapshot restores (``Engine.generate``'s
``admit`` hook); when they would need longer than the time left, the request is a 413
``prompt_exceeds_deadline`` that says how many tokens fit, and no prefill time was burnt.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .errors import APIError

MIN_TOKENS = 32      # shorter prefills are dominated by fixed costs: their rate says little
ALPHA = 0.3          # weight of the newest observation
SAFETY = 0.9         # plan on 90 % of the measured rate (prefill slows as the context grows)


@dataclass
class PrefillRate:
    tokens_per_s: float | None = None
    observations: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def observe(self, tokens: int, ms: float) -> None:
        if tokens < MIN_TOKENS or ms <= 0:
            return
        rate = tokens / (ms / 1000.0)
        with self._lock:
            self.tokens_per_s = rate if self.tokens_per_s is None else (
                ALPHA * rate + (1 - ALPHA) * self.tokens_per_s)
            self.observations += 1

    def tokens_within(self, seconds: float) -> int | None:
        """How many tokens the measured rate prefills in `seconds` (None: no measurement yet)."""
        if self.tokens_per_s is None:
            return None
        return max(0, int(self.tokens_per_s * SAFETY * max(0.0, seconds)))


def prompt_exceeds_deadline(tokens: int, fit: int, remaining_s: float, rate: float, param: str) -> APIError:
    return APIError(
        413,
        f"the prompt needs {tokens} tokens prefilled, about {tokens / rate:.1f} s at this function's measured "
        f"{rate:.0f} tokens/s, but {max(0.0, remaining_s):.1f} s remain before the deadline: about {fit} tokens fit "
        "in that time. Shorten the prompt, or use the streaming endpoint (Function URL or REST API), whose "
        "deadline is longer",
        "invalid_request_error", param, "prompt_exceeds_deadline")


def check(rate: PrefillRate, tokens: int, remaining_s: float, param: str) -> None:
    """Raise the 413 when `tokens` cannot be prefilled in `remaining_s` at the measured rate."""
    fit = rate.tokens_within(remaining_s)
    if fit is not None and tokens > fit and rate.tokens_per_s:
        raise prompt_exceeds_deadline(tokens, fit, remaining_s, rate.tokens_per_s, param)
