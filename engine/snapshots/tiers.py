"""Where snapshots are kept, fastest first: `MemoryTier` (Snapshot objects in process memory)
in front of the stored tiers, which hold the `.wsnap` bytes and all implement `Tier`: `DirTier`
(a directory, EFS) here and `S3Tier` (engine/snapshots/s3.py)."""
from __future__ import annotations

import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from engine.snapshots.format import SUFFIX, Key, Snapshot, snapshot_name


class Tier(Protocol):
    """A store of serialised snapshots. The store's lookup calls `existing` then `read` (and
    `delete` for a snapshot that fails its checks); the background writer calls `exists` then
    `write`. Every stored tier implements these the same way, so the store never asks which
    tier it holds."""

    name: str  # the `tier` field of log lines and of a restore

    def existing(self, keys: Sequence[Key]) -> list[Key]:
        """Which of `keys` are present, in the order given (the lookup asks longest first).
        One call per lookup: a tier may keep what it learnt here for the reads that follow."""
        ...

    def exists(self, key: Key) -> bool:
        ...

    def read(self, key: Key) -> bytearray | None:
        """The stored bytes (owned, writable); None when the snapshot is missing."""
        ...

    def write(self, key: Key, data: bytes | bytearray) -> None:
        """Store `data` whole: a concurrent reader sees the old snapshot or the new one."""
        ...

    def delete(self, key: Key) -> bool:
        """Remove a snapshot that failed its checks; False if it was gone (or, where the tier
        can tell, already replaced by another writer since this tier read it)."""
        ...


class MemoryTier:
    """Process memory: Snapshot objects (no serialization), LRU under a byte cap. Not a `Tier`:
    it holds live states that sessions fork, not bytes, and the store asks it first."""

    name = "memory"

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = int(cap_bytes)
        self._items: OrderedDict[Key, Snapshot] = OrderedDict()
        self.bytes = 0
        self._lock = threading.Lock()

    def __contains__(self, key: Key) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def lengths(self) -> set[int]:
        with self._lock:
            return {k[0] for k in self._items}

    def get(self, key: Key) -> Snapshot | None:
        with self._lock:
            snap = self._items.get(key)
            if snap is not None:
                self._items.move_to_end(key)
            return snap

    def put(self, key: Key, snap: Snapshot) -> bool:
        """Hold `snap`, its state frozen: sessions continue from forks of it (State.fork)."""
        size = snap.nbytes
        if size > self.cap_bytes:
            return False
        snap.state.freeze()
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            self._items[key] = snap
            self.bytes += size
            while self.bytes > self.cap_bytes and self._items:
                _, gone = self._items.popitem(last=False)
                self.bytes -= gone.nbytes
        return True

    def delete(self, key: Key) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes


class DirTier:
    """A directory (EFS mount, or /tmp): `<root>/<fingerprint>/<n>-<hash>.wsnap`.

    Writes go to a unique temp file in the same directory and are renamed into place
    (atomic on POSIX and NFSv4/EFS), so readers and concurrent writers of the same key only
    ever see whole files. The byte cap covers every `.wsnap` under root; the files least
    recently written or read (mtime, refreshed on a hit) are deleted first.
    """

    name = "efs"

    def __init__(self, root: str, fingerprint: str, cap_bytes: int) -> None:
        self.root = root
        self.dir = os.path.join(root, fingerprint)
        self.cap_bytes = int(cap_bytes)
        # (inode, size) of each file this lookup read, so `delete` removes only that file: a
        # replace always brings a new inode. Cleared by `existing` (one lookup's reads).
        self._lock = threading.Lock()
        self._read_as: dict[Key, tuple[int, int]] = {}

    def path(self, key: Key) -> str:
        return os.path.join(self.dir, snapshot_name(key))

    def exists(self, key: Key) -> bool:
        return os.path.isfile(self.path(key))

    def existing(self, keys: Sequence[Key]) -> list[Key]:
        with self._lock:
            self._read_as.clear()
        return [k for k in keys if self.exists(k)]

    def read(self, key: Key) -> bytearray | None:
        p = self.path(key)
        try:
            with open(p, "rb") as fh:
                st = os.fstat(fh.fileno())
                buf = bytearray(st.st_size)
                got = fh.readinto(buf)
        except FileNotFoundError:
            return None
        if got != st.st_size:
            buf = buf[:got]
        try:
            os.utime(p)  # a hit counts as recent use for eviction
        except OSError:
            pass
        with self._lock:
            self._read_as[key] = (st.st_ino, st.st_size)
        return buf

    def write(self, key: Key, data: bytes | bytearray) -> None:
        os.makedirs(self.dir, exist_ok=True)
        final = self.path(key)
        tmp = os.path.join(self.dir, f".{snapshot_name(key)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.evict()

    def delete(self, key: Key) -> bool:
        """Delete the file, but only if it is still the one this tier read (another writer may
        have replaced a bad file with a good one meanwhile)."""
        p = self.path(key)
        with self._lock:
            seen = self._read_as.pop(key, None)
        try:
            if seen is not None:
                st = os.stat(p)
                if (st.st_ino, st.st_size) != seen:
                    return False
            os.unlink(p)
            return True
        except FileNotFoundError:
            return False

    def evict(self) -> list[str]:
        files = []
        now = time.time()
        try:
            subdirs = [os.path.join(self.root, d) for d in os.listdir(self.root)]
        except FileNotFoundError:
            return []
        for d in subdirs:
            try:
                entries = list(os.scandir(d))
            except (NotADirectoryError, FileNotFoundError):
                continue
            for e in entries:
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue
                if e.name.endswith(".tmp") and now - st.st_mtime > 3600:  # a writer that died
                    _unlink(e.path)
                elif e.name.endswith(SUFFIX):
                    files.append((st.st_mtime, st.st_size, e.path))
        total = sum(f[1] for f in files)
        gone = []
        for _mtime, size, p in sorted(files):
            if total <= self.cap_bytes:
                break
            if _unlink(p):
                gone.append(p)
            total -= size
        return gone


def _unlink(p: str) -> bool:
    try:
        os.unlink(p)
        return True
    except FileNotFoundError:
        return False
