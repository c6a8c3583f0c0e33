"""Open a GGUF file memory-mapped and expose its metadata and typed tensor views.

Knows nothing about Qwen: the model module asks for names and shapes. Weights stay in the
mmap (no heap copy at load), so resident memory after load is far below the file size.

The header is parsed here rather than with gguf.GGUFReader: the reader builds numpy views for
every field part, which took 10–45 s on a 248k-entry vocabulary (cProfile: 3M memmap
__getitem__/__array_finalize__ calls) — far beyond Lambda's ~10 s init. This parser reads the
same format in well under a second; tests check it against GGUFReader on every factory model.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
from numba import njit
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types → (struct code, numpy dtype) for the fixed-size ones.
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
    5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "<u1"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7


@dataclass(frozen=True)
class TensorView:
    """One tensor as stored: `data` is a uint8 view of the mmap, one row per output row."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: (rows, cols) for matrices, cols = row length
    data: np.ndarray  # uint8, shape (rows, row_bytes) for 2-D tensors
    offset: int  # absolute byte offset in the file

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


# Caps checked before anything is allocated (a header claiming a million tensors took 27 s and
# 1.2 GB to parse in full). Real Qwen3.5 files: < 1,000 tensors, ~40 keys, 248k-entry arrays.
MAX_TENSORS = 65_536
MAX_KV = 65_536
MAX_ARRAY_LEN = 1 << 24
MAX_ARRAY_DEPTH = 4             # GGUF allows arrays of arrays; nobody nests them deeper
MAX_KEY_BYTES = 65_536
MAX_STRING_BYTES = 64 << 20     # a chat template is ~20 KB; a string this long is damage
MAX_ALIGNMENT = 1 << 20
# the smallest encoding of one element: a string is its 8-byte length, an array its 12-byte header
_MIN_SIZE = {_STRING: 8, _ARRAY: 12}


# A string array this long (a vocabulary, its merges) is walked in numba and decoded only when
# read: a tokenizer loaded from its cache (engine/tokenizer_cache.py) never reads it, and decoding
# Qwen3.5's 248k tokens and 248k merges one by one was ~0.45 s of every open.
LAZY_STRINGS = 4096


class _Malformed(Exception):
    """A header field that breaks the format; `GGUFFile` turns it into a ModelLoadError."""


@njit(cache=True, nogil=True)
def _string_spans(buf: np.ndarray, pos: int, count: int, cap: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Where each of ``count`` length-prefixed strings from ``pos`` starts and how long it is, and
    the end of the last; the end is -1 when the file ends first, -2 for a string over ``cap``."""
    starts = np.empty(count, dtype=np.int64)
    lens = np.empty(count, dtype=np.int64)
    n = buf.size
    for i in range(count):
        if pos + 8 > n:
            return starts, lens, -1
        length = np.uint64(0)
        for b in range(8):
            length |= np.uint64(buf[pos + b]) << np.uint64(8 * b)
        if length > np.uint64(cap):
            return starts, lens, -2
        pos += 8
        size = int(length)
        if pos + size > n:
            return starts, lens, -1
        starts[i] = pos
        lens[i] = size
        pos += size
    return starts, lens, pos


class StringArray(Sequence[str]):
    """A GGUF array of strings left in the file: its items are decoded on first read (all of them
    at once when iterated), and :meth:`raw` is its bytes as stored (for a cache key)."""

    def __init__(self, buf: np.ndarray, starts: np.ndarray, lens: np.ndarray, span: tuple[int, int]) -> None:
        self._buf, self._starts, self._lens, self._span = buf, starts, lens, span
        self._items: list[str] | None = None

    def _decode(self, i: int) -> str:
        s = int(self._starts[i])
        return bytes(self._buf[s:s + int(self._lens[i])]).decode("utf-8", errors="replace")

    def items(self) -> list[str]:
        if self._items is None:
            mv = memoryview(self._buf)  # type: ignore[arg-type]  # numpy: buffer typed for 3.12+
            self._items = [bytes(mv[s:s + n]).decode("utf-8", errors="replace")
                           for s, n in zip(self._starts.tolist(), self._lens.tolist())]
        return self._items

    def raw(self) -> memoryview:
        return memoryview(self._buf)[self._span[0]:self._span[1]]  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return self.items()[i]
        if self._items is not None:
            return self._items[i]
        n = len(self._starts)
        if not -n <= i < n:
            raise IndexError("string array index out of range")
        return self._decode(i % n)

    def __iter__(self) -> Iterator[str]:
        return iter(self.items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self.items() == other.items()
        if isinstance(other, (list, tuple)):
            return self.items() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-like, as a list

    def __repr__(self) -> str:
        return f"StringArray({len(self)} strings)"


class _Cursor:
    def __init__(self, buf: memoryview, arr: np.ndarray | None = None) -> None:
        self.buf = buf
        self.arr = arr      # the same bytes as a uint8 array, for the numba walk of long string arrays
        self.pos = 0

    def left(self) -> int:
        return len(self.buf) - self.pos

    def scalar(self, code: str) -> Any:
        size = struct.calcsize(code)
        if self.pos + size > len(self.buf):
            raise struct.error("the header runs past the end of the file")
        v = struct.unpack_from(code, self.buf, self.pos)[0]
        self.pos += size
        return v

    def string(self, cap: int = MAX_STRING_BYTES) -> str:
        n = self.scalar("<Q")
        if n > cap:
            raise _Malformed(f"a string of {n} bytes (at most {cap})")
        end = self.pos + n
        if end > len(self.buf):
            raise struct.error("string runs past the end of the file")
        s = bytes(self.buf[self.pos:end]).decode("utf-8", errors="replace")
        self.pos = end
        return s

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise _Malformed(f"arrays nested more than {MAX_ARRAY_DEPTH} deep")
            etype = self.scalar("<I")
            count = self.scalar("<Q")
            if etype not in _SCALARS and etype not in _MIN_SIZE:
                raise _Malformed(f"an array of unknown value type {etype}")
            min_size = _MIN_SIZE.get(etype) or struct.calcsize(_SCALARS[etype][0])
            if count > MAX_ARRAY_LEN or count * min_size > self.left():
                raise _Malformed(f"an array of {count} elements (at most {MAX_ARRAY_LEN}, and "
                                 f"{self.left()} bytes are left in the file)")
            if etype == _STRING:
                if count >= LAZY_STRINGS and self.arr is not None:
                    start = self.pos
                    starts, lens, end = _string_spans(self.arr, self.pos, count, MAX_STRING_BYTES)
                    if end == -1:
                        raise struct.error("string runs past the end of the file")
                    if end == -2:
                        raise _Malformed(f"a string of more than {MAX_STRING_BYTES} bytes")
                    self.pos = int(end)
                    return StringArray(self.arr, starts, lens, (start, self.pos))
                return [self.string() for _ in range(count)]
            if etype in _SCALARS:
                dt = np.dtype(_SCALARS[etype][1])
                end = self.pos + count * dt.itemsize
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
                self.pos = end
                return arr.astype(bool).tolist() if etype == _BOOL else arr.tolist()
            return [self.value(etype, depth + 1) for _ in range(count)]
        if vtype in _SCALARS:
            v = self.scalar(_SCALARS[vtype][0])
            return bool(v) if vtype == _BOOL else v
        raise _Malformed(f"unknown GGUF value type {vtype}")


class GGUFFile:
    """A memory-mapped GGUF: `metadata` (key → Python value) and `tensor(name)` views. Every
    malformed file is a ModelLoadError naming the field (permanent: retrying cannot fix it)."""

    def __init__(self, path: str | os.PathLike[str], data: bytes | bytearray | memoryview | None = None) -> None:
        """``path``: the file, memory-mapped; or, with ``data`` (the file's bytes, already in memory:
        a SnapStart snapshot holds the model in memory, not in /tmp), only the name errors use."""
        self.path = os.fspath(path)
        if data is not None:
            self._mm = np.frombuffer(data, dtype=np.uint8)
            size, magic = self._mm.size, bytes(self._mm[:4])
        else:
            if not os.path.isfile(self.path):
                raise ModelLoadError(f"model file not found: {self.path}; set MODEL_PATH to a .gguf file")
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as fh:
                magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ModelLoadError(f"{self.path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        self.file_size = size
        if data is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._field = "the header"
        try:
            self._parse(memoryview(self._mm), np.asarray(self._mm))  # type: ignore[arg-type]  # numpy: buffer typed for 3.12+
        except ModelLoadError:
            raise
        except _Malformed as exc:
            raise ModelLoadError(f"{self.path}: GGUF {self._field} is malformed: {exc} — "
                                 "re-download or rebuild the model") from None
        except (struct.error, ValueError, OverflowError, UnicodeDecodeError, TypeError, RecursionError,
                ZeroDivisionError) as exc:
            raise ModelLoadError(
                f"{self.path} is truncated or its GGUF header is damaged at {self._field} ({exc}); "
                f"file size {size} bytes — re-download or rebuild the model"
            ) from None

    def _parse(self, buf: memoryview, arr: np.ndarray | None = None) -> None:
        c = _Cursor(buf, arr)
        c.pos = 4
        self._field = "version"
        self.version = c.scalar("<I")
        if self.version not in (2, 3):
            raise ModelLoadError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        self._field = "tensor count"
        n_tensors = c.scalar("<Q")
        self._field = "metadata count"
        n_kv = c.scalar("<Q")
        # each key is at least 12 bytes (length + value type), each tensor entry at least 24
        if n_tensors > MAX_TENSORS or n_tensors * 24 > c.left():
            self._field = "tensor count"
            raise _Malformed(f"{n_tensors} tensors (at most {MAX_TENSORS}, and the file has room for "
                             f"{c.left() // 24})")
        if n_kv > MAX_KV or n_kv * 12 > c.left():
            raise _Malformed(f"{n_kv} metadata keys (at most {MAX_KV}, and the file has room for {c.left() // 12})")
        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            self._field = f"metadata key #{i}"
            key = c.string(MAX_KEY_BYTES)
            self._field = f"metadata value {key!r}"
            self.metadata[key] = c.value(c.scalar("<I"))
        infos = []
        for i in range(n_tensors):
            self._field = f"tensor entry #{i}"
            name = c.string(MAX_KEY_BYTES)
            self._field = f"tensor {name!r}"
            n_dims = c.scalar("<I")
            if n_dims > 8:
                raise _Malformed(f"{n_dims} dimensions (at most 8)")
            dims = [c.scalar("<Q") for _ in range(n_dims)]
            raw_type = c.scalar("<I")
            offset = c.scalar("<Q")
            infos.append((name, dims, raw_type, offset))
        self._field = "metadata value 'general.alignment'"
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(align, bool) or not isinstance(align, int) or not 0 < align <= MAX_ALIGNMENT \
                or align & (align - 1):
            raise _Malformed(f"{align!r:.40} is not a power of two from 1 to {MAX_ALIGNMENT}")
        data_start = (c.pos + align - 1) // align * align
        self._tensors: dict[str, TensorView] = {}
        for name, dims, raw_type, offset in infos:
            self._field = f"tensor {name!r}"
            try:
                qtype = GGMLQuantizationType(raw_type)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelLoadError(f"{self.path}: tensor {name} has unknown type id {raw_type}") from None
            shape = tuple(int(d) for d in reversed(dims))
            if any(d == 0 for d in shape):
                raise _Malformed(f"shape {shape} has a zero dimension")
            n_elems = math.prod(shape) if shape else 1      # Python ints: no int64 wrap-around
            if shape and shape[-1] % block:
                raise ModelLoadError(f"{self.path}: tensor {name} row length {shape[-1]} is not a multiple of "
                                     f"the {qtype.name} block size {block}")
            n_bytes = n_elems // block * type_size
            start = data_start + offset
            if start + n_bytes > self.file_size:
                raise ModelLoadError(
                    f"{self.path} is truncated: tensor {name} ends at byte {start + n_bytes} "
                    f"but the file has {self.file_size} bytes — re-download or rebuild the model"
                )
            raw = self._mm[start:start + n_bytes]
            if len(shape) >= 2:
                raw = raw.reshape(math.prod(shape[:-1]), -1)
            self._tensors[name] = TensorView(name, qtype, shape, raw, start)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> TensorView:
        try:
            return self._tensors[name]
        except KeyError:
            raise ModelLoadError(f"{self.path}: missing tensor {name!r}") from None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelLoadError(f"{self.path}: missing metadata key {key!r}")
        return self.metadata[key]

    def fingerprint(self) -> str:
        """Model identity (snapshot keys, `info`): hash of the whole header (metadata + tensor
        table), the file size and 4 KiB at the start, middle and end of every tensor — so two
        files with the same shapes but other weights differ, without reading the whole file."""
        mv = memoryview(self._mm)  # type: ignore[arg-type]  # numpy: buffer typed for 3.12+
        first = min((t.offset for t in self._tensors.values()), default=self.file_size)
        h = hashlib.sha256(mv[:first])
        h.update(str(self.file_size).encode())
        for t in self._tensors.values():
            raw = t.data.reshape(-1)
            n = raw.size
            for at in (0, max(0, n // 2 - 2048), max(0, n - 4096)):
                h.update(raw[at:at + 4096])  # type: ignore[arg-type]  # numpy: buffer typed for 3.12+
        return h.hexdigest()[:32]
