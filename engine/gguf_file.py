"""Open a GGUF file memory-mapped and expose its metadata and typed tensor views.

Knows nothing about Qwen: the model module asks for names and shapes. Weights stay in the
mmap (no heap copy at load), so resident memory after load is far below the file size.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from engine.errors import ModelLoadError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class TensorView:
    """One tensor as stored: `data` is a uint8 view of the mmap, one row per output row."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: (rows, cols) for matrices, cols = row length
    data: np.ndarray  # uint8, shape (rows, row_bytes) for 2-D tensors

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def _field_value(field: Any) -> Any:
    types = field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        sub = types[1] if len(types) > 1 else None
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        # numeric arrays: one part per element; concatenate without Python per-element work
        if not field.data:
            return []
        parts = [field.parts[i] for i in field.data]
        return np.concatenate(parts).tolist()
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    value = field.parts[field.data[0]]
    return value.item() if hasattr(value, "item") and value.size == 1 else value.tolist()


class GGUFFile:
    """A memory-mapped GGUF: `metadata` (key → Python value) and `tensor(name)` views."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ModelLoadError(f"model file not found: {self.path}; set MODEL_PATH to a .gguf file")
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ModelLoadError(
                f"{self.path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')"
            )
        try:
            self._reader = GGUFReader(self.path, "r")
        except Exception as exc:  # gguf-py raises bare numpy/struct errors on damaged headers
            raise ModelLoadError(
                f"{self.path} is truncated or its GGUF header is damaged ({type(exc).__name__}: {exc}); "
                f"file size {size} bytes — re-download or rebuild the model"
            ) from exc
        self.file_size = size
        self.metadata: dict[str, Any] = {
            name: _field_value(field) for name, field in self._reader.fields.items()
            if not name.startswith("GGUF.")
        }
        self._tensors: dict[str, TensorView] = {}
        for t in self._reader.tensors:
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise ModelLoadError(
                    f"{self.path} is truncated: tensor {t.name} ends at byte {end} "
                    f"but the file has {size} bytes — re-download or rebuild the model"
                )
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            data = t.data
            if data.size != int(t.n_bytes) // max(1, data.itemsize):
                raise ModelLoadError(f"{self.path}: tensor {t.name} data is shorter than its shape {shape}")
            raw = data.view(np.uint8)
            if len(shape) >= 2:
                raw = raw.reshape(int(np.prod(shape[:-1])), -1)
            self._tensors[t.name] = TensorView(t.name, GGMLQuantizationType(t.tensor_type), shape, raw)

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

    def header_fingerprint(self) -> str:
        """Hash of metadata + tensor table (names, types, shapes, offsets): cheap model identity."""
        import hashlib

        h = hashlib.sha256()
        for name in sorted(self.metadata):
            h.update(name.encode())
            h.update(repr(self.metadata[name]).encode()[:4096])
        for t in self._reader.tensors:
            h.update(f"{t.name}:{int(t.tensor_type)}:{t.shape.tolist()}:{int(t.data_offset)}".encode())
        h.update(str(self.file_size).encode())
        return h.hexdigest()[:32]
