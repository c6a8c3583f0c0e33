"""Continuous batching (issue 55): concurrent generations share one model thread.

Each generation keeps its own `Session` (its own hybrid state) and runs in its caller's thread:
sampling, grammar masks, stop strings, deadlines and the reply stay there, unchanged. Only the
model's work is handed over, through `BatchedModel`, to the `StepScheduler`'s thread: a decode
(one token on one state) waits there to be batched with the other generations' into one
`decode_batch`, and a prefill chunk waits its turn. A step is every decode waiting plus at most
one prefill chunk (the oldest), so a long prompt goes in a chunk per step while the running
streams keep flowing, and a new generation joins at the next step.

A step starts once every generation in flight is waiting on it, or `gather_s` after the first
one arrived: one that is still sampling, or writing to a slow client, joins the next step
instead of holding the others up.

While others decode, a prompt goes in pieces that take at most `prefill_ratio` times the last
decode step (the measured prefill rate x that time, at least MIN_PIECE tokens): a running
stream's next token waits about (1 + prefill_ratio) times the batch's own step, whatever the
arrivals, and a new prompt's first token comes later. Alone, or with `prefill_ratio` 0, a
prompt goes in whole chunks. (Not in the exact mode: there the pieces are the session's chunks,
as alone.)

`decode_batch` multiplies all the rows of a step at once (the int8 tiles), which rounds each
product ~1 ulp differently from a sequence's own decode kernel, and a prompt's pieces round
differently from its whole chunks: a stream's logits stay within rounding of its run alone, but
the difference compounds over its steps (through the f16 K/V cache) and a greedy pick between
two nearly tied logits can change. With `exact` (WARMLLM_BATCH_EXACT) a step takes the rows one at
a time and prompts go in the session's own chunks: bit for bit each sequence's run alone, at
~0.4x the aggregate speed.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from engine.models import LanguageModel
from engine.state import State

__all__ = ["BatchedModel", "StepScheduler", "StepStats"]

DEFAULT_GATHER_S = 0.005
MIN_PIECE = 4          # the fewest prompt tokens a step prefills beside decodes


@dataclass
class _Job:
    """A decode (`token` on `state`) or a prefill chunk (`fn`), and its outcome."""

    token: int = -1
    state: State | None = None
    fn: Callable[[], Any] | None = None
    tokens: int = 0                # a prefill's prompt tokens (for the measured rate)
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class StepStats:
    """What the scheduler has run: for the server's metrics and the tests."""

    steps: int = 0
    decode_steps: int = 0         # steps that decoded at least one sequence
    decode_rows: int = 0          # sequences decoded, summed over steps
    prefill_chunks: int = 0
    mixed_steps: int = 0          # steps that prefilled a chunk beside decoding sequences
    max_rows: int = 0             # the most sequences one step decoded
    decode_s: float = 0.0         # the last decode step's time
    prefill_s_per_token: float = 0.0   # the prefill's time per token (exponential average)


class StepScheduler:
    """The model thread of a batched engine (see the module doc)."""

    def __init__(self, model: LanguageModel, *, exact: bool = False, prefill_ratio: float = 0.0,
                 gather_s: float = DEFAULT_GATHER_S) -> None:
        self.model = model
        self.exact = exact
        self.prefill_ratio = prefill_ratio
        self.gather_s = gather_s
        self.stats = StepStats()
        self._cond = threading.Condition()
        self._decodes: list[_Job] = []
        self._prefills: deque[_Job] = deque()
        self._members = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="warmllm-step", daemon=True)
        self._thread.start()

    @contextmanager
    def member(self) -> Iterator[None]:
        """A generation in flight: steps wait (up to gather_s) for each member's next job."""
        with self._cond:
            self._members += 1
        try:
            yield
        finally:
            with self._cond:
                self._members -= 1
                self._cond.notify_all()

    def decode(self, token: int, state: State) -> np.ndarray:
        """One token on `state` in the next step's decode_batch: its (n_vocab,) logits."""
        return self._submit(_Job(token=int(token), state=state))

    def run(self, fn: Callable[[], Any], tokens: int = 0) -> Any:
        """`fn()` (a prefill chunk of `tokens` tokens) on the model thread, as one step's prefill."""
        return self._submit(_Job(fn=fn, tokens=tokens))

    def prefill_piece(self, want: int) -> int:
        """How many of `want` prompt tokens the next step should prefill: all when no other
        generation is in flight (or nothing is measured yet), else what fits in the last decode
        step's time (see the module doc)."""
        s = self.stats
        with self._cond:
            alone = self._members <= 1
        if self.exact or alone or self.prefill_ratio <= 0 or s.decode_s <= 0 or s.prefill_s_per_token <= 0:
            return want
        return min(want, max(MIN_PIECE, int(self.prefill_ratio * s.decode_s / s.prefill_s_per_token)))

    def close(self) -> None:
        """Finish what is queued, then end the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _submit(self, job: _Job) -> Any:
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            (self._prefills.append if job.fn is not None else self._decodes.append)(job)
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _take(self) -> tuple[list[_Job], _Job | None] | None:
        with self._cond:
            while not (self._decodes or self._prefills):
                if self._closed:
                    return None
                self._cond.wait()
            until = time.monotonic() + self.gather_s
            while len(self._decodes) + len(self._prefills) < self._members and not self._closed:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            decodes, self._decodes = self._decodes, []
            prefill = self._prefills.popleft() if self._prefills else None
        return decodes, prefill

    def _loop(self) -> None:
        while (taken := self._take()) is not None:
            decodes, prefill = taken
            # the running streams first: their tokens go out while the prefill chunk runs
            if decodes:
                t0 = time.perf_counter()
                try:
                    rows = self.model.decode_batch([j.token for j in decodes], [cast(State, j.state) for j in decodes],
                                                   exact=self.exact)
                    for j, row in zip(decodes, rows):
                        j.result = row
                except BaseException as exc:   # every sequence of the step sees it (its session resets)
                    for j in decodes:
                        j.error = exc
                self.stats.decode_s = time.perf_counter() - t0
                for j in decodes:
                    j.done.set()
            if prefill is not None:
                t0 = time.perf_counter()
                try:
                    assert prefill.fn is not None
                    prefill.result = prefill.fn()
                    if prefill.tokens:
                        per = (time.perf_counter() - t0) / prefill.tokens
                        old = self.stats.prefill_s_per_token
                        self.stats.prefill_s_per_token = per if old <= 0 else 0.3 * per + 0.7 * old
                except BaseException as exc:
                    prefill.error = exc
                prefill.done.set()
            s = self.stats
            s.steps += 1
            s.decode_steps += bool(decodes)
            s.decode_rows += len(decodes)
            s.prefill_chunks += prefill is not None
            s.mixed_steps += bool(decodes) and prefill is not None
            s.max_rows = max(s.max_rows, len(decodes))


class BatchedModel:
    """The model as a session of a batched engine sees it: a decode step (one token, last
    logits) goes into the scheduler's next decode_batch, every other forward runs on the
    scheduler's thread as a step's prefill. Everything else is the model's."""

    def __init__(self, model: LanguageModel, scheduler: StepScheduler) -> None:
        self.model = model
        self.scheduler = scheduler

    def __getattr__(self, name: str) -> Any:   # file, config, new_state, ...: the model's own
        return getattr(self.model, name)

    def forward(self, tokens: np.ndarray, state: State, *, logits: str = "last", hook=None) -> np.ndarray | None:
        if tokens.size == 1 and logits == "last" and hook is None:
            return self.scheduler.decode(int(tokens[0]), state)
        return self.forward_capturing(tokens, state, (), logits=logits, hook=hook)[0]

    def forward_capturing(self, tokens: np.ndarray, state: State, capture: Sequence[int], *,
                          logits: str = "last", hook=None) -> tuple[np.ndarray | None, dict[int, State]]:
        """The prompt chunk in pieces as the scheduler says (prefill_piece), each one step's
        prefill; the captures (absolute positions) and logits as one call would give them."""
        tokens = np.asarray(tokens)
        m, sched = self.model, self.scheduler
        if hook is not None or logits == "all":
            return sched.run(lambda: m.forward_capturing(tokens, state, capture, logits=logits, hook=hook),
                             int(tokens.size))
        done, n = 0, int(tokens.size)
        out: np.ndarray | None = None
        states: dict[int, State] = {}
        while done < n:
            k = sched.prefill_piece(n - done)
            start, piece = state.n_tokens, tokens[done:done + k]
            want = [p for p in capture if start < p <= start + k]
            mode = logits if done + k == n else "none"

            def step(piece: np.ndarray = piece, want: list[int] = want, mode: str = mode
                     ) -> tuple[np.ndarray | None, dict[int, State]]:
                return m.forward_capturing(piece, state, want, logits=mode)
            out, got = sched.run(step, k)
            states.update(got)
            done += k
        return out, states

    def decode_batch(self, tokens: Sequence[int], states: Sequence[State], *, exact: bool = False) -> np.ndarray:
        return self.scheduler.run(lambda: self.model.decode_batch(tokens, states, exact=exact))
