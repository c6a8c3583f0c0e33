"""Where the GGUF comes from: ``MODEL_PATH`` (EFS, baked into the image, local) or ``MODEL_S3_URI``.

``MODEL_PATH`` wins when set. ``MODEL_S3_URI`` (``s3://bucket/key.gguf``) is downloaded once to
``MODEL_DIR`` (default ``/tmp/warmllm-models``) with progress lines in the log; the download
goes to ``<file>.part`` and is renamed only when complete, and a ``<file>.source.json`` marker
records the S3 object's size and ETag. A later cold start in the same execution environment
(or a warm /tmp) skips the download when the file's size and the marker match the object's
current ``HeadObject``; a changed object (new ETag) is downloaded again.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import time
from dataclasses import dataclass
from urllib.parse import urlparse

from engine.jsonlog import emit

from .settings import FunctionSettings

PROGRESS_EVERY_S = 2.0
# ranged GETs of this size, written straight to the .part file (a 10 GB model never sits in memory)
CHUNK_BYTES = 64 * 1024 * 1024
CONCURRENCY = 8


class ModelSourceError(RuntimeError):
    """``str()`` is the detail for the log (paths, URIs); ``public`` is what an API caller may read."""

    def __init__(self, detail: str, public: str = "the model source is misconfigured") -> None:
        super().__init__(detail)
        self.public = public


@dataclass
class ResolvedModel:
    path: str
    source: str                 # "path" | "s3"
    uri: str
    download_ms: float = 0.0
    downloaded: bool = False
    bytes: int = 0
    data: bytearray | None = None   # the file's bytes, when downloaded into memory (path is then the URI)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    u = urlparse(uri)
    if u.scheme != "s3" or not u.netloc or not u.path.strip("/"):
        raise ModelSourceError(f"MODEL_S3_URI must look like s3://bucket/path/model.gguf, got {uri!r}",
                               "MODEL_S3_URI is not an s3://bucket/key URI")
    return u.netloc, u.path.lstrip("/")


def resolve(settings: FunctionSettings, s3_client=None) -> ResolvedModel:
    path = settings.model_path
    if path:
        if not os.path.isfile(path):
            raise ModelSourceError(f"MODEL_PATH={path} does not exist or is not a file",
                                   "the configured model file (MODEL_PATH) does not exist")
        return ResolvedModel(path=path, source="path", uri=path, bytes=os.path.getsize(path))
    uri = settings.model_s3_uri
    if uri:
        if settings.model_in_memory:
            return download_to_memory(uri, s3_client=s3_client)
        return download(uri, settings.model_dir, s3_client=s3_client)
    raise ModelSourceError("no model configured: set MODEL_PATH (a GGUF file) or MODEL_S3_URI (s3://bucket/key.gguf)",
                           "no model is configured: deploy with ModelS3Uri or ModelPath")


def _head(s3_client, bucket: str, key: str, uri: str) -> dict:
    try:
        return s3_client.head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        raise ModelSourceError(f"cannot read {uri}: {exc}",
                               "the model object in S3 cannot be read (missing, or no permission)") from exc


def _transfer_config():
    """Ranged parts of CHUNK_BYTES, CONCURRENCY at a time (read at call time: tests scale them)."""
    from boto3.s3.transfer import TransferConfig
    return TransferConfig(multipart_threshold=CHUNK_BYTES, multipart_chunksize=CHUNK_BYTES,
                          max_concurrency=CONCURRENCY)


def _marker(dest: str) -> str:
    return dest + ".source.json"


def _intact(dest: str, uri: str, size: int, etag: str) -> bool:
    try:
        if os.path.getsize(dest) != size:
            return False
        with open(_marker(dest)) as f:
            m = json.load(f)
        return m.get("uri") == uri and m.get("size") == size and m.get("etag") == etag
    except (OSError, ValueError):
        return False


def download(uri: str, model_dir: str, s3_client=None) -> ResolvedModel:
    bucket, key = parse_s3_uri(uri)
    if s3_client is None:
        import boto3
        s3_client = boto3.client("s3")
    t0 = time.perf_counter()
    head = _head(s3_client, bucket, key, uri)
    size = int(head["ContentLength"])
    etag = str(head.get("ETag", "")).strip('"')
    os.makedirs(model_dir, exist_ok=True)
    dest = os.path.join(model_dir, os.path.basename(key))
    if _intact(dest, uri, size, etag):
        emit({"event": "model_download", "uri": uri, "path": dest, "skipped": True,
              "reason": "already in /tmp with the same size and ETag", "bytes": size})
        return ResolvedModel(path=dest, source="s3", uri=uri, bytes=size)

    free = shutil.disk_usage(model_dir).free
    if free < size:
        raise ModelSourceError(f"{uri} is {size} bytes but {model_dir} has {free} bytes free; "
                               "raise the stack's EphemeralStorageMB parameter (file size + 10 %)",
                               "the model does not fit in /tmp: raise the EphemeralStorageMB parameter")
    part = dest + ".part"
    state = {"done": 0, "last": 0.0, "t0": time.perf_counter()}
    emit({"event": "model_download", "uri": uri, "path": dest, "bytes": size, "progress": 0.0})

    def progress(n: int) -> None:
        state["done"] += n
        now = time.perf_counter()
        if now - state["last"] >= PROGRESS_EVERY_S:
            state["last"] = now
            el = now - state["t0"]
            emit({"event": "model_download", "uri": uri, "bytes_done": state["done"], "bytes": size,
                  "progress": round(state["done"] / size, 4) if size else 1.0,
                  "mb_per_s": round(state["done"] / 1e6 / el, 1) if el > 0 else None})

    cfg = _transfer_config()
    try:
        s3_client.download_file(bucket, key, part, Callback=progress, Config=cfg)
    except Exception as exc:
        try:
            os.remove(part)
        except OSError:
            pass
        raise ModelSourceError(f"download of {uri} failed: {exc}", "the model download from S3 failed") from exc
    got = os.path.getsize(part)
    if got != size:
        os.remove(part)
        raise ModelSourceError(f"download of {uri} is {got} bytes, expected {size}",
                               "the model download from S3 was incomplete")
    os.replace(part, dest)
    with open(_marker(dest) + ".tmp", "w") as f:
        json.dump({"uri": uri, "size": size, "etag": etag}, f)
    os.replace(_marker(dest) + ".tmp", _marker(dest))
    ms = (time.perf_counter() - t0) * 1000.0
    emit({"event": "model_download", "uri": uri, "path": dest, "bytes": size, "progress": 1.0,
          "download_ms": round(ms, 1), "mb_per_s": round(size / 1e6 / (ms / 1000.0), 1) if ms > 0 else None})
    return ResolvedModel(path=dest, source="s3", uri=uri, download_ms=ms, downloaded=True, bytes=size)


class _Buffer(io.RawIOBase):
    """A writable, seekable file over a bytearray of the object's size: boto3's parallel ranged
    download writes each part at its offset, with no copy and no growth."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b) -> int:
        n = len(b)
        if self._pos + n > len(self.data):
            raise OSError(f"write past the object's {len(self.data)} bytes")
        self.data[self._pos:self._pos + n] = b
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self.data)}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


def download_to_memory(uri: str, s3_client=None) -> ResolvedModel:
    """The object's bytes in memory (a SnapStart snapshot keeps them; its /tmp is capped at 512 MB)."""
    bucket, key = parse_s3_uri(uri)
    if s3_client is None:
        import boto3
        s3_client = boto3.client("s3")
    t0 = time.perf_counter()
    size = int(_head(s3_client, bucket, key, uri)["ContentLength"])
    emit({"event": "model_download", "uri": uri, "to": "memory", "bytes": size, "progress": 0.0})
    cfg = _transfer_config()
    buf = _Buffer(size)
    try:
        s3_client.download_fileobj(bucket, key, buf, Config=cfg)
    except Exception as exc:
        raise ModelSourceError(f"download of {uri} into memory failed: {exc}",
                               "the model download from S3 failed") from exc
    ms = (time.perf_counter() - t0) * 1000.0
    emit({"event": "model_download", "uri": uri, "to": "memory", "bytes": size, "progress": 1.0,
          "download_ms": round(ms, 1)})
    return ResolvedModel(path=uri, source="s3", uri=uri, download_ms=ms, downloaded=True, bytes=size, data=buf.data)
