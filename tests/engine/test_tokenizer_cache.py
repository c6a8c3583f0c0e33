"""Issue 53 (2): the tokenizer as built, cached (engine/tokenizer_cache.py), and the GGUF string
arrays it would otherwise decode left in the file until read (engine/gguf_file.StringArray)."""
from __future__ import annotations

import os
import struct

import pytest

from engine.errors import ModelLoadError
from engine.gguf_file import LAZY_STRINGS, GGUFFile, StringArray
from engine.settings import Settings, tokenizer_cache_dir
from engine.tokenizer import Tokenizer
from tests.engine.test_gguf_malformed import ARCH, ARR, STR, gguf, kv, s, tensor

CORPUS = ["Hello, world!", "<|im_start|>user\nWhat is 2+2?<|im_end|>", "<think>\nhmm\n</think>\n\nfour",
          "日本語のテキスト 🙂", "    indented code\n\tx = 1", ""]


def _long(strings: list[str]) -> bytes:
    return struct.pack("<IQ", STR, len(strings)) + b"".join(s(t) for t in strings)


def test_a_long_string_array_is_left_in_the_file_and_reads_as_the_list(tmp_path):
    strings = [f"tok{i}-é" if i % 7 else "" for i in range(LAZY_STRINGS + 5)]
    p = tmp_path / "long.gguf"
    p.write_bytes(gguf([ARCH, kv("tokens", ARR, _long(strings)), kv("short", ARR, _long(["a", "b"]))],
                       [tensor("t", [8])]))
    f = GGUFFile(p)
    arr = f.metadata["tokens"]
    assert isinstance(arr, StringArray) and isinstance(f.metadata["short"], list)
    assert len(arr) == len(strings) and arr[1] == strings[1] and arr[-1] == strings[-1] and arr[7] == ""
    assert arr[3:9] == strings[3:9] and list(arr) == strings and arr == strings
    with pytest.raises(IndexError):
        arr[len(strings)]
    assert f.tensor("t").shape == (8,)        # the walk ended where the tensor table starts


@pytest.mark.parametrize("damage", ["cut", "huge"])
def test_a_damaged_long_string_array_is_a_model_load_error(tmp_path, damage):
    strings = [f"t{i}" for i in range(LAZY_STRINGS + 1)]
    body = _long(strings)
    if damage == "cut":
        data = gguf([ARCH, kv("tokens", ARR, body[:len(body) // 2])], tail=0)
    else:   # the last string claims 2**62 bytes
        data = gguf([ARCH, kv("tokens", ARR, body[:-len(s(strings[-1]))] + struct.pack("<Q", 2 ** 62))])
    p = tmp_path / f"{damage}.gguf"
    p.write_bytes(data)
    with pytest.raises(ModelLoadError, match="'tokens'"):
        GGUFFile(p)


@pytest.fixture(scope="module")
def real_vocab_file(model_factory):
    return model_factory("tiny", "F32", 0, vocab="qwen35")


def test_the_cached_tokenizer_is_the_built_one(real_vocab_file, tmp_path):
    cache = str(tmp_path / "tok")
    built = Tokenizer.from_gguf_metadata(GGUFFile(real_vocab_file).metadata, cache_dir=cache)
    assert not built.cache_hit and len(os.listdir(cache)) == 1
    loaded = Tokenizer.from_gguf_metadata(GGUFFile(real_vocab_file).metadata, cache_dir=cache)
    assert loaded.cache_hit
    assert loaded.n_vocab == built.n_vocab == 248320 and loaded.eog_ids == built.eog_ids
    assert loaded.marker_texts == built.marker_texts
    for text in CORPUS:
        for special in (True, False):
            assert loaded.encode(text, parse_special=special) == built.encode(text, parse_special=special), text
        assert loaded.encode_text(text) == built.encode_text(text)
    ids = built.encode("\n".join(CORPUS))
    assert loaded.decode(ids) == built.decode(ids)


def test_another_vocabulary_or_a_damaged_entry_is_a_miss(real_vocab_file, model_factory, tmp_path):
    cache = str(tmp_path / "tok")
    Tokenizer.from_gguf_metadata(GGUFFile(real_vocab_file).metadata, cache_dir=cache)
    other = Tokenizer.from_gguf_metadata(GGUFFile(model_factory("tiny", "F32", 0, vocab="text-markers")).metadata,
                                         cache_dir=cache)
    # a factory vocabulary (2,048 tokens) is below LAZY_STRINGS: read whole, never cached
    assert other.n_vocab < LAZY_STRINGS and not other.cache_hit
    (entry,) = os.listdir(cache)
    with open(os.path.join(cache, entry), "r+b") as f:
        f.truncate(1000)
    again = Tokenizer.from_gguf_metadata(GGUFFile(real_vocab_file).metadata, cache_dir=cache)
    assert not again.cache_hit                    # unreadable: rebuilt, and written again
    assert Tokenizer.from_gguf_metadata(GGUFFile(real_vocab_file).metadata, cache_dir=cache).cache_hit


def test_metadata_built_in_memory_is_never_cached(real_vocab_file, tmp_path):
    meta = {k: (list(v) if isinstance(v, StringArray) else v) for k, v in GGUFFile(real_vocab_file).metadata.items()}
    cache = tmp_path / "tok"
    assert not Tokenizer.from_gguf_metadata(meta, cache_dir=str(cache)).cache_hit
    assert not cache.exists()


def test_the_cache_directory_setting():
    assert tokenizer_cache_dir({}) is None
    assert tokenizer_cache_dir({"NUMBA_CACHE_DIR": "/tmp/nc"}) == os.path.join("/tmp/nc", "tokenizers")
    assert tokenizer_cache_dir({"NUMBA_CACHE_DIR": "/tmp/nc", "TOKENIZER_CACHE_DIR": "/mnt/efs/tok"}) == "/mnt/efs/tok"
    assert tokenizer_cache_dir({"NUMBA_CACHE_DIR": "/tmp/nc", "TOKENIZER_CACHE_DIR": "off"}) is None
    assert Settings.from_env({"TOKENIZER_CACHE_DIR": "/x"}).tokenizer_cache_dir == "/x"

