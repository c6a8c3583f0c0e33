"""The `.wsnap` wire format (version 1): a State captured at a token position, as bytes.

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
                         "<i>.conv", "<i>.S" (DeltaNet) or "<i>.k", "<i>.v" (attention, sliced
                         to n_tokens positions), all float32
      total-32   32 bytes  SHA-256 of every byte before it

No pickle anywhere: a snapshot read from S3 is parsed as JSON + numpy buffers and checked
(magic, version, sizes, checksum, model, prefix tokens, layer shapes) before use; a check that
fails raises SnapshotError with the reason the store logs.
"""
from __future__ import annotations

import hashlib
import json
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.state import LAYER_KINDS, LayerState, State

MAGIC = b"WLLMSNAP"
FORMAT_VERSION = 1
SUFFIX = ".wsnap"
_PRELUDE = struct.Struct("<8sHHI")  # magic, version, flags, header length
_ALIGN = 64
_DIGEST = 32
_MAX_HEADER = 1 << 20
_DTYPES = {"<f4": np.float32, "<i4": np.int32}

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


def owned(data: bytes | bytearray) -> bytearray:
    """Arrays parsed from a bytearray are writable (the forward may update state in place)."""
    return data if isinstance(data, bytearray) else bytearray(data)
