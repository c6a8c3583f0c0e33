"""`S3Tier`: snapshots as S3 objects, read in parallel byte ranges."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from typing import Any

from engine.snapshots.format import Key, SnapshotError, snapshot_name

# An endpoint that accepts and never answers used to cost 150 s a request (boto3's 60 s read
# timeout, retried): each call is bounded here, and the store bounds a whole lookup on top.
DEFAULT_CONNECT_TIMEOUT_S = 1.0
DEFAULT_READ_TIMEOUT_S = 2.0
DEFAULT_ATTEMPTS = 2


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
    Bound the bucket with a lifecycle rule (template.yaml); this tier never lists. A `Tier`
    (engine/snapshots/tiers.py)."""

    name = "s3"
    # AWS's guidance for large objects: byte-range GETs of 8-16 MB in parallel
    PART_BYTES = 8 << 20
    MAX_PARALLEL = 8

    def __init__(self, uri: str, fingerprint: str, client: Any = None,
                 endpoint_url: str | None = None, *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, attempts: int = DEFAULT_ATTEMPTS) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.attempts = attempts
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
                    config=Config(retries={"total_max_attempts": self.attempts, "mode": "standard"},
                                  max_pool_connections=16, connect_timeout=self.connect_timeout_s,
                                  read_timeout=self.read_timeout_s))
            return self._client

    def drop_client(self) -> None:
        """Forget the client; the next use makes a new one (after a SnapStart restore)."""
        with self._lock:
            self._client = None

    def object_key(self, key: Key) -> str:
        return f"{self.prefix}/{snapshot_name(key)}"

    @staticmethod
    def _code(exc: Exception) -> str:
        # a network error (timeout, refused connection) has no response, or response=None
        response = getattr(exc, "response", None)
        error = response.get("Error") if isinstance(response, dict) else None
        return str(error.get("Code", "")) if isinstance(error, dict) else ""

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

    def read(self, key: Key, limit: int | None = None) -> bytearray | None:
        """The object's bytes, in ranges of PART_BYTES fetched in parallel (one GET stream runs
        at tens of MB/s, and a snapshot is 26-36 MB for the 0.8B model), every range of the
        version its HEAD saw (If-Match: an object replaced mid-read fails the read, not the
        checksum). None when it is missing."""
        with self._heads_lock:
            size, etag = self._heads.pop(key, (None, None))
        obj_key = self.object_key(key)
        done = 0  # bytes already read
        if size is not None and limit is not None and size > limit:
            raise SnapshotError("too_large", f"HEAD says {size} bytes, a snapshot of this prefix is at most {limit}")
        try:
            if size is None:  # not asked with exists(): the first range tells the size
                first = self.client.get_object(Bucket=self.bucket, Key=obj_key, Range=f"bytes=0-{self.PART_BYTES - 1}")
                etag = first.get("ETag")
                size = _total_size(first)
                if limit is not None and size > limit:
                    first["Body"].close()
                    raise SnapshotError("too_large", f"{size} bytes, a snapshot of this prefix is at most {limit}")
                buf = bytearray(size)
                done = min(size, self.PART_BYTES)
                got = _read_into(first["Body"], memoryview(buf)[:done])
                if got < done:
                    return buf[:got]  # a short object body: the checksum will say so
            else:
                buf = bytearray(size)
        except SnapshotError:
            raise
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

    def delete(self, key: Key) -> bool:
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
