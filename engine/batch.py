"""Continuous batching's step loop (issue 55): many sequences decode together, new ones join
between steps, and a long prompt is prefilled a chunk per step so the running streams keep flowing.

Each sequence has its own `State`. A step is: one prefill chunk of the oldest sequence still
prefilling (its first token sampled once the prompt is in), then one token for every running
sequence through `decode_batch` -- the model runs each layer for all of them together; with the
matrices taken row by row (models/common.each_row) a batched step is bit for bit each sequence's
own decode, so batching changes no output. Sampling and stopping stay per sequence: a
sequence's `sample` turns its logits row into a token (its sampler, its grammar mask), and its
`on_token` may end it (a stop string, a deadline, a client gone).

The loop is single-threaded and owns the states; the server's engine thread drives it.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from engine.models import LanguageModel
from engine.state import State

__all__ = ["BatchDecoder", "BatchSequence"]


@dataclass
class BatchSequence:
    """One request in the loop. `sample(logits) -> token`; `on_token(token) -> bool` (False ends
    it with finish_reason "stop"). `state` may start from a snapshot's fork holding a prefix of
    the prompt (`state.n_tokens` tokens of it); the rest is prefilled."""

    prompt: list[int]
    max_tokens: int
    sample: Callable[[np.ndarray], int]
    on_token: Callable[[int], bool] | None = None
    state: State | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    _prefilled: int = 0
    _next: int | None = None       # the token the next decode step feeds

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class BatchDecoder:
    """The step loop over at most `max_num_seqs` sequences (see the module doc)."""

    def __init__(self, model: LanguageModel, max_num_seqs: int = 16, prefill_chunk: int = 256) -> None:
        if max_num_seqs < 1 or prefill_chunk < 1:
            raise ValueError(f"max_num_seqs and prefill_chunk must be >= 1, got {max_num_seqs}, {prefill_chunk}")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[BatchSequence] = deque()     # not yet admitted (the batch is full)
        self.prefilling: deque[BatchSequence] = deque()  # admitted, prompt not all in
        self.running: list[BatchSequence] = []           # decoding

    def add(self, seq: BatchSequence) -> None:
        if not seq.prompt:
            raise ValueError("a sequence needs at least one prompt token")
        if seq.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {seq.max_tokens}")
        if seq.state is None:
            seq.state = self.model.new_state()
        if not 0 <= seq.state.n_tokens < len(seq.prompt):
            raise ValueError(f"the state holds {seq.state.n_tokens} tokens of a {len(seq.prompt)}-token prompt; "
                             "at least the prompt's last token must be left to prefill")
        seq._prefilled = seq.state.n_tokens
        self.waiting.append(seq)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.running)

    def step(self) -> list[BatchSequence]:
        """One chunk of prefill and one decode step; returns the sequences that finished in it."""
        finished: list[BatchSequence] = []
        while self.waiting and len(self.prefilling) + len(self.running) < self.max_num_seqs:
            self.prefilling.append(self.waiting.popleft())
        if self.prefilling:
            seq = self.prefilling[0]
            logits = self._prefill_chunk(seq)
            if logits is not None:
                self.prefilling.popleft()
                if self._emit(seq, logits):
                    self.running.append(seq)
                else:
                    finished.append(seq)
        live = [s for s in self.running if s._next is not None]
        if live:
            states = [cast(State, s.state) for s in live]
            rows = self.model.decode_batch([cast(int, s._next) for s in live], states)
            for s, row in zip(live, rows):
                if not self._emit(s, row):
                    finished.append(s)
        self.running = [s for s in self.running if not s.done]
        return finished

    def run(self) -> None:
        """Step until every sequence added has finished."""
        while not self.idle:
            self.step()

    def _prefill_chunk(self, seq: BatchSequence) -> np.ndarray | None:
        """The next chunk of the prompt; the last position's logits once it is all in."""
        assert seq.state is not None
        end = min(len(seq.prompt), seq._prefilled + self.prefill_chunk)
        chunk = np.asarray(seq.prompt[seq._prefilled:end], dtype=np.int64)
        last = end == len(seq.prompt)
        out = self.model.forward(chunk, seq.state, logits="last" if last else "none")
        seq._prefilled = end
        return out if last else None

    def _emit(self, seq: BatchSequence, logits: np.ndarray) -> bool:
        """Sample from `logits`, hand the token over; False once the sequence is finished."""
        tok = int(seq.sample(logits))
        seq.tokens.append(tok)
        if seq.on_token is not None and not seq.on_token(tok):
            seq.finish_reason = "stop"
        elif len(seq.tokens) >= seq.max_tokens:
            seq.finish_reason = "length"
        seq._next = None if seq.done else tok
        return not seq.done
