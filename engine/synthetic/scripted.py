"""A sampler that replays a fixed reply: the benchmarks and tests whose subject is the template,
tokenizer and snapshots (not what a random-weights model says) script the reply with it."""
from __future__ import annotations

import numpy as np


class ScriptedSampler:
    """The engine's Sampler interface (``adjust``, ``observe``, ``__call__``), returning the
    reply's token ids in order, then `end` (the end-of-turn id) for ever."""

    def __init__(self, ids: list[int], end: int) -> None:
        self.ids = list(ids)
        self.end = end

    def adjust(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def observe(self, token: int) -> None:
        pass

    def __call__(self, logits: np.ndarray) -> int:
        return self.ids.pop(0) if self.ids else self.end
