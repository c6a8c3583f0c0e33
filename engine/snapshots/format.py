"""The `.wsnap` wire format (version 2): a State captured at a token position, as bytes.

Key: model fingerprint + hash of the token prefix. Value:

    offset 0   8 bytes   magic b"WLLMSNAP"
           8   u16 LE    format version (FORMAT_VERSION)
          10   u16 LE    flags (0)
          12   u32 LE    header length H
          16   H bytes   header: UTF-8 JSON (model, prefix hash, n_tokens, created, total_bytes,
                         layer kinds, and per array: name, dtype, shape, offset, nbytes)
           …   arrays    raw little-endian C-order data, each at a 64-byte-aligned offset:
                         "tokens" (int32), optional "logits" (float32, the next-token logits
                         when the snapshot is the end of a prompt), then per layer
                         "<i>.conv", "<i>.S" (DeltaNet, float32) or "<i>.k", "<i>.v" (attention,
                         sliced to n_tokens positions, float16 as the cache; version 1 had them
                         float32)
      total-32   32 bytes  SHA-256 of every byte before it, or with SNAPSHOT_HMAC_KEY (flag
                         bit 0 set) HMAC-SHA256 of them under that key

No pickle anywhere: a snapshot read from S3 is parsed as JSON + numpy buffers and checked
(magic, version, sizes, checksum or MAC, model, prefix tokens, layer shapes, every array's
dtype and shape, finite values) before use; a check that fails — or any exception while
parsing — raises SnapshotError with the reason the store logs. A checksum is not
authentication (anyone who can write to the bucket can plant a state with a valid one): a
store that shares its bucket sets SNAPSHOT_HMAC_KEY, and then applies only MAC'd snapshots.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.state import LAYER_KINDS, LayerState, State

MAGIC = b"WLLMSNAP"
FORMAT_VERSION = 2
SUFFIX = ".wsnap"
_PRELUDE = struct.Struct("<8sHHI")  # magic, version, flags, header length
_ALIGN = 64
_DIGEST = 32
_MAX_HEADER = 256 << 10  # the header of a 64-layer model is ~10 KB
_DTYPES = {"<f4": np.float32, "<f2": np.float16, "<i4": np.int32}
# each layer array's stored type, by its name after "<i>." (state.py's classes say it)
_LAYER_DTYPES = {name: np.dtype(dt).newbyteorder("<") for cls in LAYER_KINDS.values() for name, dt in cls.dtypes.items()}
FLAG_HMAC = 1

Key = tuple[int, str]  # (n_tokens, prefix hash)


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
    """A stored snapshot that must be ignored; `reason` is one of missing | truncated | corrupt |
    wrong_model | wrong_version | stale | unauthenticated | too_large | not_a_file | read_error."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def state_layout(state: State) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Per layer: kind and the shapes that must match (conv, S) or (n_kv_heads, head_dim)."""
    return [(l.kind, *l.layout()) for l in state.layers]


def max_bytes(layout: list, n_tokens: int, n_vocab: int | None = None) -> int:
    """The largest a valid `.wsnap` of `n_tokens` for this layout can be: what a stored size is
    checked against before anything is read (a 3 GB object or a 2 GB sparse file is refused
    by its size alone). Without `n_vocab` the logits are allowed 1 Mi floats."""
    arrays = [n_tokens * 4, (n_vocab if n_vocab is not None else 1 << 20) * 4]
    for kind, s1, s2 in layout:
        for name, shape in LAYER_KINDS[kind].expected_shapes((s1, s2), n_tokens).items():
            arrays.append(int(np.prod(shape, dtype=np.int64)) * _LAYER_DTYPES[name].itemsize)
    return _PRELUDE.size + _MAX_HEADER + _ALIGN + sum(-(-a // _ALIGN) * _ALIGN for a in arrays) + _DIGEST


def _digest(view: memoryview, hmac_key: bytes | None) -> bytes:
    if hmac_key:
        return hmac.new(hmac_key, view, hashlib.sha256).digest()
    return hashlib.sha256(view).digest()


def serialize(snap: Snapshot, fingerprint: str, prefix_hash: str, created: float | None = None,
              hmac_key: bytes | None = None) -> bytearray:
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
    _PRELUDE.pack_into(buf, 0, MAGIC, FORMAT_VERSION, FLAG_HMAC if hmac_key else 0, len(hb))
    buf[_PRELUDE.size:_PRELUDE.size + len(hb)] = hb
    mv = memoryview(buf)
    for (_name, a), entry in zip(arrays, table):
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        start = data_start + entry["offset"]
        # numpy declares the buffer protocol to mypy only for Python >= 3.12
        mv[start:start + entry["nbytes"]] = a.reshape(-1).view(np.uint8)  # type: ignore[call-overload]
    buf[total - _DIGEST:] = _digest(mv[:total - _DIGEST], hmac_key)
    return buf


def deserialize(data: bytes | bytearray | memoryview, *, fingerprint: str, key: Key,
                tokens: Sequence[int] | None, layout: list, max_age_s: float = 0.0,
                n_vocab: int | None = None, hmac_key: bytes | None = None) -> Snapshot:
    """Parse and check a `.wsnap`; SnapshotError(reason) when it must not be used. Nothing
    else escapes: any other exception while parsing is a SnapshotError("corrupt") too (a
    header nested 10,000 deep, a non-numeric `created`), so a bad file is always a fault the
    store repairs, never a failed request."""
    try:
        return _deserialize(memoryview(data), fingerprint, key, tokens, layout, max_age_s, n_vocab, hmac_key)
    except SnapshotError:
        raise
    except Exception as exc:
        raise SnapshotError("corrupt", f"{type(exc).__name__} while parsing: {str(exc)[:200]}") from None


# the dtype each stored array must have: the prefix int32, logits float32, a layer's arrays
# their class's (DeltaNet float32, attention float16)
def _want_dtype(name: str) -> str:
    if name == "tokens":
        return "<i4"
    layer_array = name.split(".", 1)[-1]
    return _LAYER_DTYPES[layer_array].str if "." in name and layer_array in _LAYER_DTYPES else "<f4"


def _deserialize(mv: memoryview, fingerprint: str, key: Key, tokens: Sequence[int] | None, layout: list,
                 max_age_s: float, n_vocab: int | None, hmac_key: bytes | None) -> Snapshot:
    size = len(mv)
    if size < _PRELUDE.size:
        raise SnapshotError("truncated", f"{size} bytes is shorter than the {_PRELUDE.size}-byte prelude")
    magic, version, flags, hlen = _PRELUDE.unpack_from(mv, 0)
    if magic != MAGIC:
        raise SnapshotError("corrupt", f"bad magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise SnapshotError("wrong_version", f"format version {version}, this engine reads {FORMAT_VERSION}")
    if hlen > _MAX_HEADER:
        raise SnapshotError("corrupt", f"header length {hlen} is implausible (at most {_MAX_HEADER})")
    if _PRELUDE.size + hlen > size:
        raise SnapshotError("truncated", f"header needs {_PRELUDE.size + hlen} bytes, file has {size}")
    if bool(flags & FLAG_HMAC) != bool(hmac_key):
        raise SnapshotError("unauthenticated", "written with SNAPSHOT_HMAC_KEY, and this store has none"
                            if flags & FLAG_HMAC else "not MAC'd, and this store requires SNAPSHOT_HMAC_KEY")
    try:
        header = json.loads(bytes(mv[_PRELUDE.size:_PRELUDE.size + hlen]))
        total = int(header["total_bytes"])
        table = list(header["arrays"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise SnapshotError("corrupt", f"header is not valid JSON: {type(exc).__name__}: {exc}") from None
    if size < total:
        raise SnapshotError("truncated", f"{size} of {total} bytes")
    if size != total:
        raise SnapshotError("corrupt", f"{size} bytes, header says {total}")
    if not hmac.compare_digest(_digest(mv[:total - _DIGEST], hmac_key), bytes(mv[total - _DIGEST:])):
        if hmac_key:
            raise SnapshotError("unauthenticated", "MAC mismatch (another SNAPSHOT_HMAC_KEY, or tampered)")
        raise SnapshotError("corrupt", "checksum mismatch")
    if not isinstance(header, dict):
        raise SnapshotError("corrupt", "header is not a JSON object")
    if header.get("model") != fingerprint:
        raise SnapshotError("wrong_model", f"written for model {header.get('model')}, this is {fingerprint}")
    n = key[0]
    if header.get("n_tokens") != n or header.get("prefix") != key[1]:
        raise SnapshotError("stale", f"holds prefix {header.get('n_tokens')}/{header.get('prefix')}, "
                                     f"wanted {n}/{key[1]}")
    created = header.get("created", 0)
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not np.isfinite(created):
        raise SnapshotError("corrupt", f"'created' is {created!r:.40}, not a time")
    if max_age_s > 0 and time.time() - float(created) > max_age_s:
        raise SnapshotError("stale", f"older than SNAPSHOT_MAX_AGE_S={max_age_s:g}")
    data_start = -(-(_PRELUDE.size + hlen) // _ALIGN) * _ALIGN
    arrays: dict[str, np.ndarray] = {}
    for e in table:
        if not isinstance(e, dict):
            raise SnapshotError("corrupt", "bad array table: an entry is not an object")
        name = str(e["name"])
        if e["dtype"] != _want_dtype(name):
            raise SnapshotError("corrupt", f"array {name} has dtype {e['dtype']!r:.20}, expected {_want_dtype(name)}")
        dt = _DTYPES[e["dtype"]]
        shape = tuple(int(s) for s in e["shape"])
        if any(d < 0 for d in shape) or len(shape) > 4:
            raise SnapshotError("corrupt", f"array {name} has shape {shape}")
        nb = int(e["nbytes"])
        start = data_start + int(e["offset"])
        if nb != int(np.prod(shape, dtype=object)) * np.dtype(dt).itemsize or start < data_start \
                or start + nb > total - _DIGEST:
            raise SnapshotError("corrupt", f"array {name} lies outside the file or has a bad size")
        arrays[name] = np.frombuffer(mv[start:start + nb], dtype=dt).reshape(shape)
    tok = arrays.get("tokens")
    if tok is None or tok.shape != (n,):
        raise SnapshotError("corrupt", "token array missing or of the wrong length")
    if tokens is not None and not np.array_equal(tok, np.asarray(tokens[:n], dtype=np.int32)):
        raise SnapshotError("stale", "stored token prefix differs from the requested one")
    logits = arrays.get("logits")
    if logits is not None and (logits.ndim != 1 or (n_vocab is not None and logits.shape != (n_vocab,))):
        raise SnapshotError("corrupt", f"logits of shape {logits.shape}, the model has {n_vocab} tokens")
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
    # a NaN or Inf in a state never comes from a forward pass; applied, it would answer garbage
    for name, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise SnapshotError("corrupt", f"array {name} holds NaN or Inf")
    return Snapshot(tok, State(n, layers), logits)


def owned(data: bytes | bytearray) -> bytearray:
    """Arrays parsed from a bytearray are writable (the forward may update state in place)."""
    return data if isinstance(data, bytearray) else bytearray(data)
