"""Prefix-state snapshots: a State captured at a token position, kept in memory, a directory
(EFS) and S3, so a later request — on this instance or another — resumes instead of
re-prefilling.

Key: model fingerprint + hash of the token prefix. Value (the `.wsnap` format, version 1):

    offset 0   8 bytes   magic b"WLLMSNAP"
           8   u16 LE    format version (FORMAT_VERSION)
          10   u16 LE    flags (0)
          12   u32 LE    header length H
          16   H bytes   header: UTF-8 JSON (model, prefix hash, n_tokens, created, total_bytes,
                         layer kinds, and per array: name, dtype, shape, offset, nbytes)
           …   arrays    raw little-endian C-order data, each at a 64-byte-aligned offset:
                         "tokens" (int32), optional "logits" (float32, the next-token logits
                         when the snapshot is the end of a prompt), then per layer
                         "<i>.conv", "<i>.S" (DeltaNet) or "<i>.k", "<i>.v" (attention, sliced
                         to n_tokens positions), all float32
      total-32   32 bytes  SHA-256 of every byte before it

No pickle anywhere: a snapshot read from S3 is parsed as JSON + numpy buffers and checked
(magic, version, sizes, checksum, model, prefix tokens, layer shapes) before use. Anything
that fails is ignored with one `{"event": "snapshot_ignored", ...}` log line and deleted.

Tiers, fastest first: `MemoryTier` (process memory, LRU, byte cap), `DirTier` (a directory,
atomic temp+rename writes, byte cap, oldest-first eviction), `S3Tier` (single PUT per
snapshot). `SnapshotStore` looks up the longest usable prefix memory → directory → S3,
promotes hits, and writes to the slower tiers on a background thread that the generation
path holds back until the first token is out.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import queue
import struct
import sys
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from engine.settings import (DEFAULT_SNAPSHOT_DIR_MB, DEFAULT_SNAPSHOT_EVERY, DEFAULT_SNAPSHOT_FLUSH_S,
                             DEFAULT_SNAPSHOT_MEMORY_MB, SnapshotSettings)
from engine.state import LAYER_KINDS, LayerState, State

MAGIC = b"WLLMSNAP"
FORMAT_VERSION = 1
SUFFIX = ".wsnap"
_PRELUDE = struct.Struct("<8sHHI")  # magic, version, flags, header length
_ALIGN = 64
_DIGEST = 32
_MAX_HEADER = 1 << 20
_DTYPES = {"<f4": np.float32, "<i4": np.int32}

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

Key = tuple[int, str]  # (n_tokens, prefix hash)

_log_lock = threading.Lock()


def log_event(event: str, **fields: Any) -> None:
    """One JSON line on stdout (the Lambda log)."""
    line = json.dumps({"event": event, **fields}, separators=(",", ":"), default=str)
    with _log_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


# ---- identity ------------------------------------------------------------------------------

def prefix_hashes(tokens: Sequence[int] | np.ndarray, positions: Iterable[int]) -> dict[int, str]:
    """SHA-256 (hex, 32 chars) of the int32 LE bytes of tokens[:p] for each p, in one pass."""
    arr = np.asarray(tokens, dtype="<i4")
    h = hashlib.sha256()
    done = 0
    out: dict[int, str] = {}
    for p in sorted(set(int(p) for p in positions)):
        if p < 0 or p > arr.size:
            continue
        h.update(arr[done:p].tobytes())
        done = p
        out[p] = h.copy().hexdigest()[:32]
    return out


def snapshot_name(key: Key) -> str:
    return f"{key[0]:08d}-{key[1]}{SUFFIX}"


# ---- the value -------------------------------------------------------------------------------

@dataclass
class Snapshot:
    tokens: np.ndarray  # int32, the prefix
    state: State  # exactly len(tokens) positions
    logits: np.ndarray | None = None  # next-token logits after the prefix, when captured

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def nbytes(self) -> int:
        return int(self.state.nbytes + self.tokens.nbytes + (0 if self.logits is None else self.logits.nbytes))


class SnapshotError(Exception):
    """A stored snapshot that must be ignored; `reason` is one of
    missing | truncated | corrupt | wrong_model | wrong_version | stale | read_error."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def state_layout(state: State) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Per layer: kind and the shapes that must match (conv, S) or (n_kv_heads, head_dim)."""
    return [(l.kind, *l.layout()) for l in state.layers]


def serialize(snap: Snapshot, fingerprint: str, prefix_hash: str, created: float | None = None) -> bytearray:
    n = snap.n_tokens
    if snap.state.n_tokens != n:
        raise ValueError(f"snapshot state holds {snap.state.n_tokens} tokens but the prefix has {n}")
    arrays: list[tuple[str, np.ndarray]] = [("tokens", np.ascontiguousarray(snap.tokens, dtype="<i4"))]
    if snap.logits is not None:
        arrays.append(("logits", np.ascontiguousarray(snap.logits, dtype="<f4")))
    kinds = []
    for i, l in enumerate(snap.state.layers):
        kinds.append(l.kind)
        arrays += [(f"{i}.{name}", a) for name, a in l.named_arrays(n).items()]
    table: list[dict[str, Any]] = []
    offset = 0
    for name, a in arrays:
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        table.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset,
                      "nbytes": int(a.nbytes)})
        offset += -(-int(a.nbytes) // _ALIGN) * _ALIGN
    header = {"format": "warmllm-snapshot", "model": fingerprint, "prefix": prefix_hash, "n_tokens": n,
              "created": time.time() if created is None else created, "layers": kinds, "arrays": table}
    # total_bytes depends on the header length, which depends on total_bytes' digits: iterate.
    total = 0
    for _ in range(3):
        header["total_bytes"] = total
        hb = json.dumps(header, separators=(",", ":")).encode()
        data_start = -(-(_PRELUDE.size + len(hb)) // _ALIGN) * _ALIGN
        want = data_start + offset + _DIGEST
        if want == total:
            break
        total = want
    buf = bytearray(total)
    _PRELUDE.pack_into(buf, 0, MAGIC, FORMAT_VERSION, 0, len(hb))
    buf[_PRELUDE.size:_PRELUDE.size + len(hb)] = hb
    mv = memoryview(buf)
    for (_name, a), entry in zip(arrays, table):
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        start = data_start + entry["offset"]
        # numpy declares the buffer protocol to mypy only for Python >= 3.12
        mv[start:start + entry["nbytes"]] = a.reshape(-1).view(np.uint8)  # type: ignore[call-overload]
    buf[total - _DIGEST:] = hashlib.sha256(mv[:total - _DIGEST]).digest()
    return buf


def deserialize(data: bytes | bytearray | memoryview, *, fingerprint: str, key: Key,
                tokens: Sequence[int] | None, layout: list, max_age_s: float = 0.0) -> Snapshot:
    """Parse and check a `.wsnap`; SnapshotError(reason) when it must not be used."""
    mv = memoryview(data)
    size = len(mv)
    if size < _PRELUDE.size:
        raise SnapshotError("truncated", f"{size} bytes is shorter than the {_PRELUDE.size}-byte prelude")
    magic, version, _flags, hlen = _PRELUDE.unpack_from(mv, 0)
    if magic != MAGIC:
        raise SnapshotError("corrupt", f"bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise SnapshotError("wrong_version", f"format version {version}, this engine reads {FORMAT_VERSION}")
    if hlen > _MAX_HEADER:
        raise SnapshotError("corrupt", f"header length {hlen} is implausible")
    if _PRELUDE.size + hlen > size:
        raise SnapshotError("truncated", f"header needs {_PRELUDE.size + hlen} bytes, file has {size}")
    try:
        header = json.loads(bytes(mv[_PRELUDE.size:_PRELUDE.size + hlen]))
        total = int(header["total_bytes"])
        table = list(header["arrays"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError("corrupt", f"header is not valid JSON: {exc}") from None
    if size < total:
        raise SnapshotError("truncated", f"{size} of {total} bytes")
    if size != total:
        raise SnapshotError("corrupt", f"{size} bytes, header says {total}")
    if hashlib.sha256(mv[:total - _DIGEST]).digest() != bytes(mv[total - _DIGEST:]):
        raise SnapshotError("corrupt", "checksum mismatch")
    if header.get("model") != fingerprint:
        raise SnapshotError("wrong_model", f"written for model {header.get('model')}, this is {fingerprint}")
    n = key[0]
    if header.get("n_tokens") != n or header.get("prefix") != key[1]:
        raise SnapshotError("stale", f"holds prefix {header.get('n_tokens')}/{header.get('prefix')}, "
                                     f"wanted {n}/{key[1]}")
    if max_age_s > 0 and time.time() - float(header.get("created", 0)) > max_age_s:
        raise SnapshotError("stale", f"older than SNAPSHOT_MAX_AGE_S={max_age_s:g}")
    data_start = -(-(_PRELUDE.size + hlen) // _ALIGN) * _ALIGN
    arrays: dict[str, np.ndarray] = {}
    try:
        for e in table:
            dt = _DTYPES[e["dtype"]]
            shape = tuple(int(s) for s in e["shape"])
            nb = int(e["nbytes"])
            start = data_start + int(e["offset"])
            if nb != int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize or start < data_start \
                    or start + nb > total - _DIGEST:
                raise SnapshotError("corrupt", f"array {e['name']} lies outside the file or has a bad size")
            arrays[str(e["name"])] = np.frombuffer(mv[start:start + nb], dtype=dt).reshape(shape)
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError("corrupt", f"bad array table: {exc}") from None
    tok = arrays.get("tokens")
    if tok is None or tok.shape != (n,):
        raise SnapshotError("corrupt", "token array missing or of the wrong length")
    if tokens is not None and not np.array_equal(tok, np.asarray(tokens[:n], dtype=np.int32)):
        raise SnapshotError("stale", "stored token prefix differs from the requested one")
    kinds = header.get("layers")
    if kinds != [k for k, _, _ in layout]:
        raise SnapshotError("wrong_model", f"layer kinds {kinds} do not match the model")
    layers: list[LayerState] = []
    try:
        for i, (kind, s1, s2) in enumerate(layout):
            cls = LAYER_KINDS[kind]
            want = cls.expected_shapes((s1, s2), n)
            got = {name: arrays[f"{i}.{name}"] for name in want}
            if any(got[name].shape != shape for name, shape in want.items()):
                raise SnapshotError("wrong_model", f"layer {i} ({kind}) state shapes "
                                                   f"{[a.shape for a in got.values()]} != {list(want.values())}")
            layers.append(cls.from_arrays(got))
    except KeyError as exc:
        raise SnapshotError("corrupt", f"array {exc} missing") from None
    return Snapshot(tok, State(n, layers), arrays.get("logits"))


def _owned(data: bytes | bytearray) -> bytearray:
    """Arrays parsed from a bytearray are writable (the forward may update state in place)."""
    return data if isinstance(data, bytearray) else bytearray(data)


# ---- tiers ---------------------------------------------------------------------------------

class MemoryTier:
    """Process memory: Snapshot objects (no serialization), LRU under a byte cap."""

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

    def path(self, key: Key) -> str:
        return os.path.join(self.dir, snapshot_name(key))

    def exists(self, key: Key) -> bool:
        return os.path.isfile(self.path(key))

    def read(self, key: Key) -> tuple[bytearray, tuple] | None:
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
        return buf, (st.st_ino, st.st_size)  # a replace always brings a new inode

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

    def delete(self, key: Key, seen: tuple | None = None) -> bool:
        """Delete the file, but only if it is still the one we read (another writer may have
        replaced a bad file with a good one meanwhile)."""
        p = self.path(key)
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


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"SNAPSHOT_S3_URI must look like s3://bucket/prefix, got {uri!r}")
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"SNAPSHOT_S3_URI has no bucket: {uri!r}")
    return bucket, prefix.strip("/")


class S3Tier:
    """S3: `s3://bucket/prefix/<fingerprint>/<n>-<hash>.wsnap`, one PUT per snapshot (S3
    replaces objects atomically, so two writers of the same key leave one whole object).
    Bound the bucket with a lifecycle rule (template.yaml); this tier never lists."""

    name = "s3"
    # AWS's guidance for large objects: byte-range GETs of 8-16 MB in parallel
    PART_BYTES = 8 << 20
    MAX_PARALLEL = 8

    def __init__(self, uri: str, fingerprint: str, client: Any = None,
                 endpoint_url: str | None = None) -> None:
        self.bucket, prefix = parse_s3_uri(uri)
        self.prefix = f"{prefix}/{fingerprint}" if prefix else fingerprint
        self._client = client
        self._endpoint_url = endpoint_url
        self._lock = threading.Lock()  # the client, made once
        # HEAD results (size, ETag) for the read that follows: written by the lookup's HEAD pool
        # and the background writer's exists(), cleared and popped by the lookup thread
        self._heads_lock = threading.Lock()
        self._heads: dict[Key, tuple[int, str | None]] = {}

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                self._client = boto3.client(
                    "s3", endpoint_url=self._endpoint_url or None,
                    config=Config(retries={"max_attempts": 4, "mode": "standard"}, max_pool_connections=16,
                                  connect_timeout=3, read_timeout=30))
            return self._client

    def object_key(self, key: Key) -> str:
        return f"{self.prefix}/{snapshot_name(key)}"

    @staticmethod
    def _code(exc: Exception) -> str:
        return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))

    @classmethod
    def _missing(cls, exc: Exception) -> bool:
        return cls._code(exc) in ("404", "NoSuchKey", "NotFound")

    def exists(self, key: Key) -> bool:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
        except Exception as exc:
            if self._missing(exc):
                return False
            raise
        # the size and version the read that follows fetches in parallel ranges
        with self._heads_lock:
            self._heads[key] = (int(head.get("ContentLength") or 0), head.get("ETag"))
        return True

    def existing(self, keys: Sequence[Key]) -> list[Key]:
        """Which of `keys` exist, asked in parallel (HEAD requests)."""
        with self._heads_lock:
            self._heads.clear()  # only this lookup's candidates: the rest were never read
        if not keys:
            return []
        if len(keys) == 1:
            return [k for k in keys if self.exists(k)]
        with ThreadPoolExecutor(max_workers=min(8, len(keys))) as pool:
            found = list(pool.map(self.exists, keys))
        return [k for k, ok in zip(keys, found) if ok]

    def read(self, key: Key) -> bytearray | None:
        """The object's bytes, in ranges of PART_BYTES fetched in parallel (one GET stream runs
        at tens of MB/s, and a snapshot is 26-36 MB for the 0.8B model), every range of the
        version its HEAD saw (If-Match: an object replaced mid-read fails the read, not the
        checksum). None when it is missing."""
        with self._heads_lock:
            size, etag = self._heads.pop(key, (None, None))
        obj_key = self.object_key(key)
        done = 0  # bytes already read
        try:
            if size is None:  # not asked with exists(): the first range tells the size
                first = self.client.get_object(Bucket=self.bucket, Key=obj_key, Range=f"bytes=0-{self.PART_BYTES - 1}")
                etag = first.get("ETag")
                size = _total_size(first)
                buf = bytearray(size)
                done = min(size, self.PART_BYTES)
                got = _read_into(first["Body"], memoryview(buf)[:done])
                if got < done:
                    return buf[:got]  # a short object body: the checksum will say so
            else:
                buf = bytearray(size)
        except Exception as exc:
            if self._missing(exc):
                return None
            if self._code(exc) == "InvalidRange":
                return bytearray()  # an empty object has no byte 0
            raise
        view = memoryview(buf)
        parts = [(lo, min(size, lo + self.PART_BYTES)) for lo in range(done, size, self.PART_BYTES)]

        def fetch(part: tuple[int, int]) -> None:
            lo, hi = part
            extra = {"IfMatch": etag} if etag else {}
            r = self.client.get_object(Bucket=self.bucket, Key=obj_key, Range=f"bytes={lo}-{hi - 1}", **extra)
            got = _read_into(r["Body"], view[lo:hi])
            if got != hi - lo:
                raise OSError(f"{obj_key}: range {lo}-{hi - 1} ended after {got} of {hi - lo} bytes")

        if len(parts) == 1:
            fetch(parts[0])
        elif parts:
            with ThreadPoolExecutor(max_workers=min(self.MAX_PARALLEL, len(parts))) as pool:
                list(pool.map(fetch, parts))
        return buf

    def write(self, key: Key, data: bytes | bytearray) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.object_key(key), Body=bytes(data),
                               ContentType="application/octet-stream")

    def delete(self, key: Key, seen: Any = None) -> bool:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))
            return True
        except Exception:
            return False


def _total_size(resp: dict) -> int:
    """The object's size from a ranged GET (Content-Range: bytes 0-8388607/33258144)."""
    rng = resp.get("ContentRange") or ""
    if "/" in rng and rng.rsplit("/", 1)[1].isdigit():
        return int(rng.rsplit("/", 1)[1])
    return int(resp.get("ContentLength") or 0)  # the whole object came back


def _read_into(body: Any, view: memoryview) -> int:
    """Read a streaming body into `view`; the bytes read (fewer if the stream ended early)."""
    got = 0
    while got < len(view):
        chunk = body.read(min(8 << 20, len(view) - got))
        if not chunk:
            break
        view[got:got + len(chunk)] = chunk
        got += len(chunk)
    return got


# ---- the store ---------------------------------------------------------------------------

@dataclass
class Restored:
    snapshot: Snapshot
    tier: str  # "memory" | "efs" | "s3"
    nbytes: int  # serialized size (memory: in-memory size)
    ms: float  # lookup + read + parse + checks


@dataclass
class _Job:
    tier: Any
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
                 log: Callable[..., None] = log_event) -> None:
        self.fingerprint = fingerprint
        self.layout = layout
        self.every = int(every)
        self.max_age_s = float(max_age_s)
        self.log = log
        self.memory = MemoryTier(memory_bytes) if memory_bytes > 0 else None
        self.dir = DirTier(dir, fingerprint, dir_bytes) if dir else None
        self.s3 = S3Tier(s3_uri, fingerprint, s3_client, s3_endpoint_url) if s3_uri else None
        self.slow_tiers = [t for t in (self.dir, self.s3) if t is not None]
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._released = threading.Event()
        self._released.set()
        self._thread: threading.Thread | None = None
        self._written: set[tuple[str, Key]] = set()  # (tier, key) known present in that tier
        self._closed = False
        if self.s3 is not None and s3_client is None:
            # boto3's import and client setup take ~0.3 s: do it now, off the request path
            s3 = self.s3
            threading.Thread(target=lambda: s3.client, name="warmllm-s3-client", daemon=True).start()
        if self.slow_tiers and flush_at_exit_s > 0:
            atexit.register(self._flush_at_exit, flush_at_exit_s)

    @classmethod
    def from_settings(cls, fingerprint: str, layout: list, s: SnapshotSettings,
                      s3_client: Any = None, log: Callable[..., None] = log_event) -> SnapshotStore:
        return cls(
            fingerprint, layout,
            memory_bytes=int(s.memory_mb * (1 << 20)), dir=s.dir, dir_bytes=int(s.dir_mb * (1 << 20)),
            s3_uri=s.s3_uri, s3_client=s3_client, s3_endpoint_url=s.s3_endpoint_url,
            every=s.every, max_age_s=s.max_age_s, flush_at_exit_s=s.flush_s, log=log,
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
                found = self._lookup_tier(tier, keys, tokens)
                if found is not None:
                    best = found[0]
                    self._promote(best, found[1])
        if best is not None:
            best.ms = (time.perf_counter() - t0) * 1e3
        return best

    def _lookup_tier(self, tier: Any, keys: list[Key], tokens: Sequence[int]) -> tuple[Restored, bytearray] | None:
        if not keys:
            return None
        try:
            present = tier.existing(keys) if isinstance(tier, S3Tier) else [k for k in keys if tier.exists(k)]
        except Exception as exc:
            self.log("snapshot_ignored", tier=tier.name, reason="read_error", detail=f"{type(exc).__name__}: {exc}")
            return None
        for key in present:  # longest first
            try:
                got = tier.read(key)
            except Exception as exc:
                self.log("snapshot_ignored", tier=tier.name, key=snapshot_name(key), reason="read_error",
                         detail=f"{type(exc).__name__}: {exc}", deleted=False)
                continue
            if got is None:
                self.log("snapshot_ignored", tier=tier.name, key=snapshot_name(key), reason="missing",
                         detail="listed but gone when read", deleted=False)
                continue
            data, seen = got if isinstance(got, tuple) else (got, None)
            data = _owned(data)
            try:
                snap = deserialize(data, fingerprint=self.fingerprint, key=key, tokens=tokens, layout=self.layout,
                                   max_age_s=self.max_age_s)
            except SnapshotError as exc:
                deleted = tier.delete(key, seen)
                self._written.discard((tier.name, key))
                self.log("snapshot_ignored", tier=tier.name, key=snapshot_name(key), reason=exc.reason,
                         detail=exc.detail, bytes=len(data), deleted=deleted)
                continue
            self._written.add((tier.name, key))
            if key[0] == len(tokens) and snap.logits is None:
                continue  # a mid-prompt checkpoint: usable only as a prefix of a longer prompt
            return Restored(snap, tier.name, len(data), 0.0), data
        return None

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

    def _enqueue(self, tier: Any, key: Key, snap: Snapshot | None = None, data: bytearray | None = None) -> None:
        if self._closed:
            return
        self._written.add((tier.name, key))
        with self._cond:
            self._pending += 1
        self._queue.put(_Job(tier, key, snap, data, time.perf_counter()))
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._writer, name="warmllm-snapshot-writer", daemon=True)
            self._thread.start()

    def hold(self) -> None:
        """Keep queued writes waiting (the prefill and first token must not share the CPU)."""
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    @property
    def pending(self) -> int:
        with self._cond:
            return self._pending

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write has finished; False if `timeout` ran out first."""
        self.release()
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
                if job.data is None:
                    assert job.snap is not None  # a job carries its snapshot until serialized
                    job.data = serialize(job.snap, self.fingerprint, job.key[1])
                    job.snap = None
                if job.tier.exists(job.key):
                    fields["skipped"] = "exists"
                else:
                    job.tier.write(job.key, job.data)
                ok, err = True, None
            except Exception as exc:
                ok, err = False, f"{type(exc).__name__}: {exc}"
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

