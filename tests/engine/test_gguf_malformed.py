"""Malformed GGUF headers (issue 18 item 5): counts and sizes are capped before anything is
allocated, and every malformed file is a ModelLoadError naming the field, which the function
treats as permanent (no retry every 30 s)."""
from __future__ import annotations

import struct
import time

import pytest

from engine.errors import ModelLoadError
from engine.gguf_file import GGUFFile

U32, U64, STR, ARR = 4, 10, 8, 9


def s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def gguf(kvs: list[bytes], tensors: list[bytes] = (), n_tensors: int | None = None, n_kv: int | None = None,
         tail: int = 64) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    return head + b"".join(kvs) + b"".join(tensors) + b"\0" * tail


def tensor(name: str, dims: list[int], qtype: int = 0, offset: int = 0) -> bytes:
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", qtype, offset)


ARCH = kv("general.architecture", STR, s("qwen35"))

CASES = {
    "alignment_zero": (gguf([ARCH, kv("general.alignment", U32, struct.pack("<I", 0))], [tensor("t", [8])]),
                       "general.alignment"),
    "alignment_array": (gguf([ARCH, kv("general.alignment", ARR, struct.pack("<IQ", U32, 1) + b"\0\0\0\x08")],
                             [tensor("t", [8])]), "general.alignment"),
    "alignment_odd": (gguf([ARCH, kv("general.alignment", U32, struct.pack("<I", 24))]), "general.alignment"),
    "nested_arrays": (gguf([kv("x", ARR, struct.pack("<IQ", ARR, 1) * 200_000)]), "'x'"),
    "million_tensors": (gguf([ARCH], n_tensors=1_000_000), "tensor count"),
    "absurd_kv_count": (gguf([ARCH], n_kv=2 ** 63), "metadata count"),
    "array_count": (gguf([kv("tokens", ARR, struct.pack("<IQ", STR, 2 ** 40))]), "'tokens'"),
    "u32_array_count": (gguf([kv("ids", ARR, struct.pack("<IQ", U32, 10 ** 9))]), "'ids'"),
    "huge_string": (gguf([kv("k", STR, struct.pack("<Q", 2 ** 62))]), "'k'"),
    "huge_key": (gguf([struct.pack("<Q", 10 ** 9) + b"k"]), "metadata key #0"),
    "unknown_value_type": (gguf([kv("k", 99, b"")]), "'k'"),
    "array_of_unknown": (gguf([kv("k", ARR, struct.pack("<IQ", 77, 3))]), "'k'"),
    "many_dims": (gguf([ARCH], [s("t") + struct.pack("<I", 1000)]), "tensor 't'"),
    "zero_dim": (gguf([ARCH], [tensor("t", [0, 8])]), "tensor 't'"),
    "dims_overflow": (gguf([ARCH], [tensor("t", [2 ** 63, 2 ** 63, 2 ** 63])]), "truncated"),
    "cut_in_entry": (gguf([ARCH], [tensor("t", [8])[:10]], tail=0), "tensor"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_header_is_a_model_load_error_naming_the_field(tmp_path, name):
    data, field = CASES[name]
    p = tmp_path / f"{name}.gguf"
    p.write_bytes(data)
    t = time.perf_counter()
    with pytest.raises(ModelLoadError) as exc:
        GGUFFile(p)
    assert time.perf_counter() - t < 1.0
    assert field in str(exc.value), str(exc.value)


def test_malformed_model_metadata_is_permanent(tmp_path, tiny_model_path):
    from function.runtime import Runtime
    from function.settings import FunctionSettings
    data = bytearray(tiny_model_path.read_bytes())
    key = b"qwen35.attention.head_count"
    at = data.index(key + b"\x04\x00\x00\x00") + len(key) + 4      # the u32 value after the type
    data[at:at + 4] = struct.pack("<I", 0)                          # zero heads: a ZeroDivisionError
    p = tmp_path / "zero-heads.gguf"
    p.write_bytes(bytes(data))
    rt = Runtime(FunctionSettings(model_path=str(p), init_budget_s=60))
    rt.start_init()
    assert rt.engine is None and rt.error_permanent, rt.error
    assert "ModelLoadError" in (rt.error or "") and "ZeroDivisionError" in (rt.error or "")
