"""`SnapshotStore`: looks up the longest usable prefix memory → directory → S3, promotes hits
to the faster tiers, and writes to the stored tiers on a background thread that the generation
path holds back until the first token is out."""
from __future__ import annotations

import atexit
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.jsonlog import LogFn, log_event
from engine.settings import (DEFAULT_SNAPSHOT_COOLDOWN_S, DEFAULT_SNAPSHOT_DIR_MB, DEFAULT_SNAPSHOT_EVERY,
                             DEFAULT_SNAPSHOT_FLUSH_S, DEFAULT_SNAPSHOT_LOOKUP_BUDGET_S, DEFAULT_SNAPSHOT_MEMORY_MB,
                             SnapshotSettings)
from engine.snapshots.format import (Key, Snapshot, SnapshotError, deserialize, max_bytes, owned, prefix_hashes,
                                     serialize, snapshot_name)
from engine.snapshots.s3 import S3Tier
from engine.snapshots.tiers import DirTier, MemoryTier, Tier

DEFAULT_EVERY = DEFAULT_SNAPSHOT_EVERY
DEFAULT_MEMORY_MB = int(DEFAULT_SNAPSHOT_MEMORY_MB)
DEFAULT_DIR_MB = int(DEFAULT_SNAPSHOT_DIR_MB)
DEFAULT_FLUSH_S = DEFAULT_SNAPSHOT_FLUSH_S
# With a memory hit, a slower tier is asked only for prefixes at least this many tokens longer:
# restoring from it costs more than prefilling fewer (0.8B Q4_K_M: directory restore ~100 ms,
# S3 ~150 ms plus a HEAD round trip for every longer candidate, against ~5 ms per token of a
# short suffix). Measured: a new conversation with the same system + tools (27 tokens past the
# memory hit) took 205-220 ms with S3 configured — the HEADs for its 1-27-token-longer
# candidates, which could not pay off — and 155-170 ms without.
SLOW_TIER_MIN_GAIN = 32
# A tier that failed this many lookups or writes in a row (an error, or its budget ran out) is
# skipped for `cooldown_s`: an S3 endpoint that never answers costs the budget twice, not on
# every request.
FAILURES_BEFORE_COOLDOWN = 2
# Reading these from a directory is the snapshot's fault (repaired: deleted and rewritten), not
# the tier's: an unreadable file, a directory where the file should be.
_FILE_FAULTS = (PermissionError, IsADirectoryError, NotADirectoryError)


@dataclass
class _Health:
    failures: int = 0          # in a row
    until: float = 0.0         # time.monotonic() the cool-down ends
    last_error: str = ""


class _CoolingDown(Exception):
    pass


@dataclass
class Restored:
    snapshot: Snapshot
    tier: str  # "memory" | "efs" | "s3"
    nbytes: int  # serialized size (memory: in-memory size)
    ms: float  # lookup + read + parse + checks


@dataclass
class _Job:
    tier: Tier
    key: Key
    snap: Snapshot | None
    data: bytearray | None
    queued: float
    attempt: int = 0


class SnapshotStore:
    """Memory → directory → S3, with a background writer for the slower tiers."""

    def __init__(self, fingerprint: str, layout: list, *, memory_bytes: int = DEFAULT_MEMORY_MB << 20,
                 dir: str | None = None, dir_bytes: int = DEFAULT_DIR_MB << 20,
                 s3_uri: str | None = None, s3_client: Any = None, s3_endpoint_url: str | None = None,
                 every: int = DEFAULT_EVERY, max_age_s: float = 0.0, flush_at_exit_s: float = DEFAULT_FLUSH_S,
                 log: LogFn = log_event, lookup_budget_s: float = DEFAULT_SNAPSHOT_LOOKUP_BUDGET_S,
                 cooldown_s: float = DEFAULT_SNAPSHOT_COOLDOWN_S, hmac_key: bytes | None = None,
                 n_vocab: int | None = None, s3_connect_timeout_s: float = 1.0, s3_read_timeout_s: float = 2.0,
                 s3_attempts: int = 2) -> None:
        self.fingerprint = fingerprint
        self.layout = layout
        self.every = int(every)
        self.max_age_s = float(max_age_s)
        self.log = log
        self.lookup_budget_s = float(lookup_budget_s)
        self.cooldown_s = float(cooldown_s)
        self.hmac_key = hmac_key
        self.n_vocab = n_vocab
        self._health: dict[str, _Health] = {}
        self._health_lock = threading.Lock()
        self.memory = MemoryTier(memory_bytes) if memory_bytes > 0 else None
        self.dir = DirTier(dir, fingerprint, dir_bytes, on_evict=self._forget_efs) if dir else None
        self.s3 = S3Tier(s3_uri, fingerprint, s3_client, s3_endpoint_url, connect_timeout_s=s3_connect_timeout_s,
                         read_timeout_s=s3_read_timeout_s, attempts=s3_attempts) if s3_uri else None
        self.slow_tiers: list[Tier] = [t for t in (self.dir, self.s3) if t is not None]
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._released = threading.Event()  # set: the writer may run
        self._released.set()
        self._hold_lock = threading.Lock()
        self._holders = 0  # writes_held() blocks open
        self._held = False  # hold() until release()
        self._thread: threading.Thread | None = None
        self._written: set[tuple[str, Key]] = set()  # (tier, key) known present in that tier
        self._closed = False
        if self.s3 is not None and s3_client is None:
            # boto3's import and client setup take ~0.3 s: do it now, off the request path
            s3 = self.s3
            threading.Thread(target=lambda: s3.client, name="warmllm-s3-client", daemon=True).start()
        if self.slow_tiers and flush_at_exit_s > 0:
            atexit.register(self._flush_at_exit, flush_at_exit_s)
        if self.dir is not None:
            # temp files of writers killed before this process: cleaned now, not at the first write
            threading.Thread(target=self._evict_quietly, name="warmllm-snapshot-evict", daemon=True).start()

    def _evict_quietly(self) -> None:
        try:
            assert self.dir is not None
            self.dir.evict()
        except Exception as exc:
            self.log("snapshot_evict_error", tier="efs", error=f"{type(exc).__name__}: {exc}")

    def _forget_efs(self, key: Key) -> None:
        # the directory evicted it: a later capture of the same prefix must write it again
        self._written.discard(("efs", key))

    @classmethod
    def from_settings(cls, fingerprint: str, layout: list, s: SnapshotSettings,
                      s3_client: Any = None, log: LogFn = log_event, n_vocab: int | None = None) -> SnapshotStore:
        from engine.snapshots.keys import resolve_hmac_key
        s = resolve_hmac_key(s)  # SSM / Secrets Manager, once, at init
        return cls(
            fingerprint, layout,
            memory_bytes=int(s.memory_mb * (1 << 20)), dir=s.dir, dir_bytes=int(s.dir_mb * (1 << 20)),
            s3_uri=s.s3_uri, s3_client=s3_client, s3_endpoint_url=s.s3_endpoint_url,
            every=s.every, max_age_s=s.max_age_s, flush_at_exit_s=s.flush_s, log=log,
            lookup_budget_s=s.lookup_budget_s, cooldown_s=s.cooldown_s, hmac_key=s.hmac_key, n_vocab=n_vocab,
            s3_connect_timeout_s=s.s3_connect_timeout_s, s3_read_timeout_s=s.s3_read_timeout_s,
            s3_attempts=s.s3_attempts,
        )

    @property
    def tiers(self) -> list[str]:
        return [t.name for t in ([self.memory] if self.memory is not None else []) + self.slow_tiers]

    # ---- lookup ------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], candidates: Iterable[int], *, min_len: int = 1,
               slow: bool = True) -> Restored | None:
        """The longest stored prefix of `tokens` among `candidates` (plus every length held in
        memory) with min_len ≤ n ≤ len(tokens). A snapshot of the whole prompt is usable only
        if it carries the next-token logits. Memory first; slower tiers only for ones longer by at
        least SLOW_TIER_MIN_GAIN tokens (any longer one when memory has none)."""
        t0 = time.perf_counter()
        total = len(tokens)
        cands = {int(c) for c in candidates}
        if self.memory is not None:
            cands |= self.memory.lengths()
        cands = {c for c in cands if min_len <= c <= total and c > 0}
        if not cands:
            return None
        hashes = prefix_hashes(tokens, cands)
        order = sorted(cands, reverse=True)
        best: Restored | None = None
        if self.memory is not None:
            for n in order:
                key = (n, hashes[n])
                snap = self.memory.get(key)
                if snap is None:
                    continue
                if not np.array_equal(snap.tokens, np.asarray(tokens[:n], dtype=np.int32)):
                    continue  # a hash collision: never in practice, but never trust it either
                if n == total and snap.logits is None:
                    continue
                best = Restored(snap, "memory", snap.nbytes, 0.0)
                break
        if slow:
            for tier in self.slow_tiers:
                floor = best.snapshot.n_tokens + SLOW_TIER_MIN_GAIN if best else 0
                keys = [(n, hashes[n]) for n in order if n >= floor]
                found = self._lookup_tier_bounded(tier, keys, tokens)
                if found is not None:
                    best = found[0]
                    self._promote(best, found[1])
        if best is not None:
            best.ms = (time.perf_counter() - t0) * 1e3
        return best

    # ---- tier health: budget and cool-down --------------------------------------------

    def _cooling(self, tier: Tier) -> bool:
        with self._health_lock:
            h = self._health.get(tier.name)
            return h is not None and time.monotonic() < h.until

    def _tier_ok(self, tier: Tier) -> None:
        with self._health_lock:
            self._health.pop(tier.name, None)

    def _tier_failed(self, tier: Tier, error: str) -> None:
        with self._health_lock:
            h = self._health.setdefault(tier.name, _Health())
            h.failures += 1
            h.last_error = error
            cool = h.failures >= FAILURES_BEFORE_COOLDOWN and self.cooldown_s > 0
            if cool:
                h.until = time.monotonic() + self.cooldown_s
                h.failures = 0
        if cool:
            self.log("snapshot_tier_cooldown", tier=tier.name, seconds=self.cooldown_s, error=error)

    def _lookup_tier_bounded(self, tier: Tier, keys: list[Key],
                             tokens: Sequence[int]) -> tuple[Restored, bytearray] | None:
        """`_lookup_tier` within `lookup_budget_s`: past it the tier is skipped for this request
        (its thread finishes or times out on its own, its result dropped) and the lookup goes on
        without it. A tier in cool-down is not asked at all."""
        if not keys:
            return None
        if self._cooling(tier):
            return None
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["found"] = self._lookup_tier(tier, keys, tokens)
            except BaseException as exc:  # a bug: logged below, never raised into the request
                box["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                done.set()

        threading.Thread(target=run, name=f"warmllm-snapshot-lookup-{tier.name}", daemon=True).start()
        if not done.wait(self.lookup_budget_s):
            with self._health_lock:
                last = self._health.get(tier.name, _Health()).last_error
            self.log("snapshot_tier_skipped", tier=tier.name, reason="budget", budget_s=self.lookup_budget_s,
                     detail=last or "no answer within the lookup budget")
            self._tier_failed(tier, f"lookup took over SNAPSHOT_LOOKUP_BUDGET_S={self.lookup_budget_s:g}"
                                    + (f" ({last})" if last else ""))
            return None
        if "error" in box:
            self.log("snapshot_ignored", tier=tier.name, reason="read_error", detail=box["error"])
            return None
        return box.get("found")

    def _limit(self, key: Key) -> int:
        return max_bytes(self.layout, key[0], self.n_vocab)

    def _lookup_tier(self, tier: Tier, keys: list[Key], tokens: Sequence[int]) -> tuple[Restored, bytearray] | None:
        if not keys:
            return None
        try:
            present = tier.existing(keys)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.log("snapshot_ignored", tier=tier.name, reason="read_error", detail=error)
            self._tier_failed(tier, error)
            return None
        if not present:
            self._tier_ok(tier)  # it answered and holds nothing: the failures in a row are over
        for key in present:  # longest first
            data = None  # the previous candidate's buffer is freed before the next is read
            try:
                data = tier.read(key, self._limit(key))
            except (SnapshotError, *_FILE_FAULTS) as exc:
                # the stored thing is bad (too large for its prefix, not a file, unreadable): repair
                reason = exc.reason if isinstance(exc, SnapshotError) else "unreadable"
                detail = exc.detail if isinstance(exc, SnapshotError) else f"{type(exc).__name__}: {exc}"
                self._fault(tier, key, reason, detail, 0)
                continue
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                self.log("snapshot_ignored", tier=tier.name, key=snapshot_name(key), reason="read_error",
                         detail=error, deleted=False)
                self._tier_failed(tier, error)
                return None  # the tier is failing (network): the shorter candidates would too
            if data is None:
                self.log("snapshot_ignored", tier=tier.name, key=snapshot_name(key), reason="missing",
                         detail="listed but gone when read", deleted=False)
                continue
            data = owned(data)
            try:
                snap = deserialize(data, fingerprint=self.fingerprint, key=key, tokens=tokens, layout=self.layout,
                                   max_age_s=self.max_age_s, n_vocab=self.n_vocab, hmac_key=self.hmac_key)
            except SnapshotError as exc:
                # a snapshot MAC'd under a key this store lacks is another deployment's, not damage
                keep = exc.reason == "unauthenticated" and not self.hmac_key
                self._fault(tier, key, exc.reason, exc.detail, len(data), delete=not keep)
                continue
            self._tier_ok(tier)
            self._written.add((tier.name, key))
            if key[0] == len(tokens) and snap.logits is None:
                continue  # a mid-prompt checkpoint: usable only as a prefix of a longer prompt
            return Restored(snap, tier.name, len(data), 0.0), data
        return None

    def _fault(self, tier: Tier, key: Key, reason: str, detail: str, nbytes: int, *, delete: bool = True) -> None:
        """A bad stored snapshot: logged, deleted where the tier can, forgotten as written (the
        next capture of the prefix writes it again)."""
        deleted = False
        if delete:
            try:
                deleted = tier.delete(key)
            except Exception as exc:
                detail += f"; delete failed: {type(exc).__name__}: {exc}"
        self._written.discard((tier.name, key))
        self.log("snapshot_ignored", tier=tier.name, key=snapshot_name(key), reason=reason, detail=detail,
                 bytes=nbytes, deleted=deleted)

    def fault(self, hit: Restored, error: BaseException) -> None:
        """A restored snapshot that failed while it was applied (the session's forward raised):
        the same repair as a check that failed — dropped from memory, deleted from the tier it
        came from, and written again from the fresh prefill that follows."""
        snap = hit.snapshot
        key = (snap.n_tokens, prefix_hashes(snap.tokens, [snap.n_tokens])[snap.n_tokens])
        if self.memory is not None:
            self.memory.delete(key)
        tiers = {t.name: t for t in self.slow_tiers}
        detail = f"failed while applied: {type(error).__name__}: {str(error)[:200]}"
        if hit.tier in tiers:
            self._fault(tiers[hit.tier], key, "apply_error", detail, hit.nbytes)
        else:
            self.log("snapshot_ignored", tier=hit.tier, key=snapshot_name(key), reason="apply_error",
                     detail=detail, bytes=hit.nbytes, deleted=True)
        for name in tiers:
            self._written.discard((name, key))

    def _promote(self, hit: Restored, data: bytearray) -> None:
        """Hold a slow-tier hit in memory and queue it (as the same bytes) for the faster slow
        tiers. No copy: the memory tier freezes the state and the session forks it."""
        snap = hit.snapshot
        key = (snap.n_tokens, prefix_hashes(snap.tokens, [snap.n_tokens])[snap.n_tokens])
        if self.memory is not None:
            self.memory.put(key, snap)
        faster = self.slow_tiers[:[t.name for t in self.slow_tiers].index(hit.tier)]
        for tier in faster:
            if (tier.name, key) not in self._written:
                self._enqueue(tier, key, data=bytearray(data))

    # ---- capture -----------------------------------------------------------------------

    def has(self, key: Key, need_logits: bool = False) -> bool:
        """Held in memory (with next-token logits, if asked)."""
        if self.memory is None:
            return False
        snap = self.memory.get(key)
        return snap is not None and (snap.logits is not None or not need_logits)

    def put(self, key: Key, snap: Snapshot) -> None:
        """Keep `snap` (already an independent copy) in memory now; queue the slower tiers."""
        if self.memory is not None:
            self.memory.put(key, snap)
        for tier in self.slow_tiers:
            if (tier.name, key) not in self._written:
                self._enqueue(tier, key, snap=snap)

    def _enqueue(self, tier: Tier, key: Key, snap: Snapshot | None = None, data: bytearray | None = None) -> None:
        if self._closed:
            return
        self._written.add((tier.name, key))
        with self._cond:
            self._pending += 1
        self._queue.put(_Job(tier, key, snap, data, time.perf_counter()))
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._writer, name="warmllm-snapshot-writer", daemon=True)
            self._thread.start()

    @contextmanager
    def writes_held(self) -> Iterator[None]:
        """Queued writes wait while a block is open (the prefill and the first token must not
        share the CPU with serialising and uploading 30 MB); blocks nest, the outermost end lets
        them go. A write already running finishes."""
        with self._hold_lock:
            self._holders += 1
            self._released.clear()
        try:
            yield
        finally:
            with self._hold_lock:
                self._holders -= 1
                self._sync_release()

    def drop_clients(self) -> None:
        """Forget the network clients (the S3 tier's); the next use makes new ones."""
        if self.s3 is not None:
            self.s3.drop_client()

    def hold(self) -> None:
        """Keep queued writes waiting until `release()` or `flush()` (a process about to exit
        whose writes need not happen)."""
        with self._hold_lock:
            self._held = True
            self._released.clear()

    def release(self) -> None:
        """End a `hold()`; writes run once no `writes_held()` block is open either."""
        with self._hold_lock:
            self._held = False
            self._sync_release()

    def _sync_release(self) -> None:
        if self._holders == 0 and not self._held:
            self._released.set()

    @property
    def pending(self) -> int:
        with self._cond:
            return self._pending

    def flush(self, timeout: float | None = None) -> bool:
        """Let every queued write run now, holds or not, and wait until they have finished;
        False if `timeout` ran out first."""
        with self._hold_lock:
            self._held = False
            self._released.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _flush_at_exit(self, timeout: float) -> None:
        if self.pending:
            t0 = time.perf_counter()
            n = self.pending
            ok = self.flush(timeout)
            self.log("snapshot_flush", at="exit", writes=n, ok=ok, ms=round((time.perf_counter() - t0) * 1e3, 1))
        self._closed = True

    def _writer(self) -> None:
        while True:
            job = self._queue.get()
            self._released.wait()
            t0 = time.perf_counter()
            fields: dict[str, Any] = {}
            try:
                if self._cooling(job.tier):
                    raise _CoolingDown(f"the {job.tier.name} tier is cooling down after failures")
                if job.data is None:
                    assert job.snap is not None  # a job carries its snapshot until serialized
                    job.data = serialize(job.snap, self.fingerprint, job.key[1], hmac_key=self.hmac_key)
                    job.snap = None
                if job.tier.exists(job.key):
                    fields["skipped"] = "exists"
                else:
                    job.tier.write(job.key, job.data)
                ok, err = True, None
                self._tier_ok(job.tier)
            except _CoolingDown as exc:
                ok, err = False, str(exc)
                job.attempt = 2        # no retry: the tier is known to be failing
            except Exception as exc:
                ok, err = False, f"{type(exc).__name__}: {exc}"
                self._tier_failed(job.tier, err)
            ms = (time.perf_counter() - t0) * 1e3
            if not ok and job.attempt < 2:
                job.attempt += 1
                self._queue.put(job)  # e.g. a connection cut by a Lambda freeze: try again
            else:
                if not ok:
                    self._written.discard((job.tier.name, job.key))
                self.log("snapshot_write", tier=job.tier.name, key=snapshot_name(job.key), n_tokens=job.key[0],
                         bytes=0 if job.data is None else len(job.data), ms=round(ms, 1),
                         queued_ms=round((t0 - job.queued) * 1e3, 1), ok=ok,
                         **({"error": err} if err else {}), **fields)
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
