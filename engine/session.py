"""The warm session: the token ids the process has run and their state.

A prompt that extends the held tokens prefills only the suffix (`extend`); the same prompt
reuses the kept last-position logits (`cached`); anything else starts over (`batched`).
Prefill always runs the batched forward in chunks of `prefill_chunk` tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from engine.models.qwen35 import Qwen35
from engine.state import State

DEFAULT_PREFILL_CHUNK = 512


@dataclass
class PrefillResult:
    mode: str  # "batched" | "extend" | "cached"
    reused_tokens: int
    prefilled_tokens: int
    prefill_ms: float
    restore_ms: float
    logits: np.ndarray


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Session:
    def __init__(self, model: Qwen35, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.tokens: list[int] = []
        self.state: State = model.new_state()
        self.last_logits: np.ndarray | None = None

    def reset(self) -> None:
        self.tokens = []
        self.state = self.model.new_state()
        self.last_logits = None

    def prefill(self, prompt: list[int]) -> PrefillResult:
        if not prompt:
            raise ValueError("prompt has no tokens")
        t0 = time.perf_counter()
        held = len(self.tokens)
        if self.last_logits is not None and self.tokens == prompt:
            return PrefillResult("cached", held, 0, (time.perf_counter() - t0) * 1e3, 0.0, self.last_logits)
        if 0 < held < len(prompt) and self.last_logits is not None and prompt[:held] == self.tokens:
            mode, start = "extend", held
        else:
            self.reset()
            mode, start = "batched", 0
        logits = self._run(prompt[start:])
        return PrefillResult(mode, start, len(prompt) - start, (time.perf_counter() - t0) * 1e3, 0.0, logits)

    def step(self, token: int) -> np.ndarray:
        """Decode: one token through the model (the T == 1 path)."""
        return self._run([token])

    def _run(self, ids: list[int]) -> np.ndarray:
        arr = np.asarray(ids, dtype=np.int64)
        logits = None
        try:
            for i in range(0, arr.size, self.prefill_chunk):
                chunk = arr[i:i + self.prefill_chunk]
                last = i + self.prefill_chunk >= arr.size
                logits = self.model.forward(chunk, self.state, logits="last" if last else "none")
                self.tokens.extend(int(t) for t in chunk)
        except BaseException:
            self.reset()  # a half-advanced state must never be reused
            raise
        assert logits is not None
        self.last_logits = logits
        return logits
