"""The warm session: the token ids the process has run and their state.

A prompt that extends the held tokens prefills only the suffix (`extend`); the same prompt
reuses the kept last-position logits (`cached`); anything else resumes from the longest
stored checkpoint that is a prefix of it (`snapshot_memory` / `snapshot_efs` / `snapshot_s3`,
see engine.snapshots) or prefills from zero (`batched`).

Recurrent (DeltaNet) state cannot be rolled back, so prefill captures checkpoints: at the
chat-message boundaries it is given, every `every` tokens, and at the end of the prompt. The
batched prefill is split at `prefill_chunk` only: the model returns the state at each
checkpoint from the same pass (`LanguageModel.forward_capturing`; Qwen3.5's: DeltaNet S and conv tail at the
position, KV sliced to it). Splitting there instead cost a full pass over the weights per
piece: a 538-token agent prompt with checkpoints at 256, 504, 512 and 533 took 9.9 s split and
7.8 s in one pass (`python -m bench.agent_prefix`, 0.8B Q4_K_M).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from engine.errors import PrefillDeadline
from engine.settings import DEFAULT_PREFILL_CHUNK
from engine.models import LanguageModel
from engine.snapshots import Restored, Snapshot, SnapshotStore, prefix_hashes
from engine.state import State

class _SnapshotFault(Exception):
    """A restored snapshot could not be used (`cause`): the session repairs it and prefills from scratch."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


MIN_SEGMENT = 8  # checkpoints closer than this to the previous one are skipped (memory for little reuse)


@dataclass
class PrefillResult:
    mode: str  # "batched" | "extend" | "cached" | "snapshot_memory" | "snapshot_efs" | "snapshot_s3"
    reused_tokens: int
    prefilled_tokens: int
    prefill_ms: float  # the call less restore_ms: each stage counted once
    restore_ms: float
    logits: np.ndarray
    snapshot_tier: str | None = None  # tier the state was restored from
    snapshot_bytes: int = 0  # size of the restored snapshot
    checkpoints: list[int] = field(default_factory=list)  # positions captured by this call
    checkpoint_bytes: int = 0  # in-memory size of those captures
    checkpoint_ms: float = 0.0  # time spent storing them (inside prefill_ms; the copies are made in the forward)

    @property
    def snapshot_or_checkpoint_bytes(self) -> int:
        """The request log's `snapshot_bytes`: the restored snapshot's size or, when nothing
        was restored, the in-memory size of what this call captured."""
        return self.snapshot_bytes if self.snapshot_tier else self.checkpoint_bytes


def checkpoint_positions(n_prompt: int, start: int, boundaries: Sequence[int] = (), every: int = 0,
                         min_segment: int = MIN_SEGMENT) -> list[int]:
    """Where to capture, in (start, n_prompt]: boundaries, multiples of `every`, the end; a point
    closer than `min_segment` to the previous kept one (or to `start`) is dropped, the end never.
    A multiple of `every` within every/8 of a boundary, the start or the end is dropped too: the
    neighbour serves the same prefixes (the agent prompt's 512 next to its system boundary at
    504 cost a 33 MB copy and a write per request)."""
    marks = {int(b) for b in boundaries if start < int(b) < n_prompt}
    pts = set(marks)
    if every > 0:
        near = max(1, every // 8)
        anchors = marks | {start, n_prompt}
        pts |= {p for p in range((start // every + 1) * every, n_prompt, every)
                if min(abs(p - q) for q in anchors) >= near}
    kept: list[int] = []
    last = start
    for p in sorted(pts):
        if p - last >= min_segment:
            kept.append(p)
            last = p
    kept.append(n_prompt)
    return kept


class Session:
    def __init__(self, model: LanguageModel, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 store: SnapshotStore | None = None, every: int | None = None) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.store = store
        self.every = int(every if every is not None else (store.every if store is not None else 0))
        self.tokens: list[int] = []
        self.state: State = model.new_state()
        self.last_logits: np.ndarray | None = None

    def reset(self) -> None:
        self.tokens = []
        self.state = self.model.new_state()
        self.last_logits = None

    def prefill(self, prompt: Sequence[int], boundaries: Sequence[int] = (), *, deadline: float | None = None,
                admit: Callable[[int], None] | None = None) -> PrefillResult:
        """Make the state hold `prompt`, reusing whatever is held or stored.

        `boundaries`: token positions worth a checkpoint (chat-message ends). The store's
        background writes wait while this runs; a caller that needs them to wait longer (the
        engine, until the first token is out) opens `store.writes_held()` around it.
        `admit(n)` is called with the number of tokens left to prefill once reuse and restores
        are decided, before any prefill work (it may raise to refuse); `deadline`
        (time.monotonic()) is checked before each chunk: past it, PrefillDeadline is raised with
        the tokens done so far kept.
        """
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("prompt has no tokens")
        t0 = time.perf_counter()
        with self.store.writes_held() if self.store is not None else nullcontext():
            return self._prefill(prompt, boundaries, t0, deadline, admit)

    def _prefill(self, prompt: list[int], boundaries: Sequence[int], t0: float, deadline: float | None = None,
                 admit: Callable[[int], None] | None = None) -> PrefillResult:
        n = len(prompt)
        held = len(self.tokens)
        if self.last_logits is not None and self.tokens == prompt:
            return PrefillResult("cached", held, 0, (time.perf_counter() - t0) * 1e3, 0.0, self.last_logits)
        can_extend = 0 < held < n and self.last_logits is not None and prompt[:held] == self.tokens
        mode, start = ("extend", held) if can_extend else ("batched", 0)
        tier, restore_ms, snap_bytes = None, 0.0, 0
        if self.store is not None:
            candidates = set(boundaries) | {n}
            if self.every > 0:
                candidates |= set(range(self.every, n + 1, self.every))
            # Extending is already cheap: only a longer checkpoint in memory beats it.
            hit = self.store.lookup(prompt, candidates, min_len=start + 1, slow=not can_extend)
            if hit is not None:
                try:
                    return self._from_snapshot(hit, prompt, boundaries, t0, deadline, admit)
                except _SnapshotFault as fault:
                    # any failure applying a stored state is the snapshot's fault (a valid
                    # checksum is not valid content): repaired, and this prompt prefilled from
                    # scratch, so the answer is the from-scratch answer
                    self.store.fault(hit, fault.cause)
                    mode, start = "batched", 0
        if mode == "batched":
            self.reset()
        if start == n:
            assert self.last_logits is not None
            return PrefillResult(mode, n, 0, (time.perf_counter() - t0) * 1e3 - restore_ms, restore_ms,
                                 self.last_logits, tier, snap_bytes)
        if admit is not None:
            admit(n - start)
        cps = checkpoint_positions(n, start, boundaries, self.every) if self.store is not None else []
        try:
            logits, cp_bytes, cp_ms = self._run(prompt, start, cps, deadline)
        except PrefillDeadline as cut:
            cut.result = PrefillResult(mode, start, cut.done_tokens, (time.perf_counter() - t0) * 1e3 - restore_ms,
                                       restore_ms, np.empty(0, dtype=np.float32), tier, snap_bytes)
            raise
        return PrefillResult(mode, start, n - start, (time.perf_counter() - t0) * 1e3 - restore_ms, restore_ms,
                             logits, tier, snap_bytes, cps, cp_bytes, cp_ms)

    def _from_snapshot(self, hit: Restored, prompt: list[int], boundaries: Sequence[int], t0: float,
                       deadline: float | None, admit: Callable[[int], None] | None) -> PrefillResult:
        """Continue from a restored snapshot: its state (forked), then the rest of the prompt.
        A failure of the snapshot's own (applying it, or non-finite logits from it) is raised as
        _SnapshotFault; the admission's refusal and the deadline's cut are the request's, and
        propagate as they are."""
        n = len(prompt)
        t1 = time.perf_counter()
        try:
            snap = hit.snapshot
            # Stored states are shared (frozen in memory): continue from a fork, no copy.
            self.state = snap.state.fork()
            self.tokens = prompt[:snap.n_tokens]
            self.last_logits = None if snap.logits is None else np.array(snap.logits, copy=True)
            mode, start = f"snapshot_{hit.tier}", snap.n_tokens
            if start == n and (self.last_logits is None or not np.isfinite(self.last_logits).all()):
                raise ValueError("the restored snapshot of the whole prompt has no usable logits")
        except Exception as exc:
            raise _SnapshotFault(exc) from exc
        restore_ms = hit.ms + (time.perf_counter() - t1) * 1e3

        def result(tokens: int, logits: np.ndarray, *extra) -> PrefillResult:
            # restore_ms is its own stage: prefill_ms is the rest (each stage counted once)
            return PrefillResult(mode, start, tokens, (time.perf_counter() - t0) * 1e3 - restore_ms, restore_ms,
                                 logits, hit.tier, hit.nbytes, *extra)

        if start == n:
            assert self.last_logits is not None
            return result(0, self.last_logits)
        if admit is not None:
            admit(n - start)
        cps = checkpoint_positions(n, start, boundaries, self.every)
        try:
            logits, cp_bytes, cp_ms = self._run(prompt, start, cps, deadline)
        except PrefillDeadline as cut:
            cut.result = result(cut.done_tokens, np.empty(0, dtype=np.float32))
            raise
        except Exception as exc:
            raise _SnapshotFault(exc) from exc
        if not np.isfinite(logits).all():
            self.reset()
            raise _SnapshotFault(ValueError("the prefill continued from the restored snapshot gave non-finite logits"))
        return result(n - start, logits, cps, cp_bytes, cp_ms)

    def step(self, token: int) -> np.ndarray:
        """Decode: one token through the model (the T == 1 path)."""
        try:
            logits = self.model.forward(np.array([int(token)], dtype=np.int64), self.state, logits="last")
        except BaseException:
            self.reset()
            raise
        assert logits is not None  # logits="last" always returns them
        self.tokens.append(int(token))
        self.last_logits = logits
        return logits

    def _run(self, prompt: list[int], start: int, checkpoints: Sequence[int],
             deadline: float | None = None) -> tuple[np.ndarray, int, float]:
        """Batched forward over prompt[start:] in pieces of `prefill_chunk`, capturing the state
        at the checkpoints the store does not hold yet from within each piece. Past `deadline`
        (checked before each piece) it stops between pieces: the state is whole there."""
        arr = np.asarray(prompt, dtype=np.int64)
        end = arr.size
        cps = sorted(p for p in checkpoints if start < p <= end)
        hashes = prefix_hashes(prompt, cps) if cps else {}
        store = self.store
        logits = None
        cp_bytes, cp_ms = 0, 0.0
        pos = start
        cut = False
        try:
            while pos < end:
                if deadline is not None and time.monotonic() >= deadline:
                    cut = True
                    break
                nxt = min(pos + self.prefill_chunk, end)
                wanted = [p for p in cps if pos < p <= nxt and store is not None
                          and not store.has((p, hashes[p]), need_logits=p == end)]
                logits, states = self.model.forward_capturing(arr[pos:nxt], self.state, wanted,
                                                              logits="last" if nxt == end else "none")
                self.tokens.extend(prompt[pos:nxt])
                pos = nxt
                t1 = time.perf_counter()
                for p in wanted:  # non-empty only with a store
                    assert store is not None
                    snap = Snapshot(np.asarray(prompt[:p], dtype=np.int32), states[p],
                                    None if p != end else np.array(logits, dtype=np.float32, copy=True))
                    store.put((p, hashes[p]), snap)
                    cp_bytes += snap.nbytes
                cp_ms += (time.perf_counter() - t1) * 1e3
        except BaseException:
            self.reset()  # a half-advanced state must never be reused
            raise
        if cut:
            self.last_logits = None  # the state holds prompt[:pos], whole, but no logits for it
            raise PrefillDeadline(pos - start, end - pos)
        assert logits is not None
        self.last_logits = logits
        return logits, cp_bytes, cp_ms


class SessionPool:
    """An engine's warm sessions, one per generation that may run at once (WARMLLM_MAX_NUM_SEQS;
    one in the Lambda function). A generation takes the free session whose held tokens its
    prompt begins with, the longest such, so a conversation's next turn extends where its last
    one ran; else the one used least recently, so the others stay warm. It gives it back after."""

    def __init__(self, sessions: Sequence[Session]) -> None:
        if not sessions:
            raise ValueError("a session pool needs at least one session")
        self.sessions = list(sessions)
        self._free = list(sessions)          # least recently released first
        self._recent = list(sessions)        # most recently released first
        self._cond = threading.Condition()

    @property
    def busy(self) -> int:
        """Sessions taken by generations running now."""
        with self._cond:
            return len(self.sessions) - len(self._free)

    def by_recency(self) -> list[Session]:
        """Every session, the most recently used first (what tokenizing may reuse)."""
        with self._cond:
            return list(self._recent)

    @contextmanager
    def acquire(self, prompt: Sequence[int]) -> Iterator[Session]:
        """A free session for `prompt` (waits for one when all are busy)."""
        with self._cond:
            while not self._free:
                self._cond.wait()
            session = max(self._free, key=lambda s: _held_prefix(s, prompt))
            if _held_prefix(session, prompt) == 0:
                session = self._free[0]
            self._free.remove(session)
        try:
            yield session
        finally:
            with self._cond:
                self._free.append(session)
                self._recent.remove(session)
                self._recent.insert(0, session)
                self._cond.notify()


def _held_prefix(session: Session, prompt: Sequence[int]) -> int:
    """How many tokens `session` can extend from: all it holds when `prompt` begins with them."""
    n = len(session.tokens)
    if n == 0 or session.last_logits is None or n > len(prompt):
        return 0
    return n if list(prompt[:n]) == session.tokens else 0
