"""Issue 53 (1): a SnapStart snapshot keeps the model in memory (its /tmp is capped at 512 MB),
so the engine loads a GGUF from a buffer as well as from a path."""
from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ModelLoadError
from engine.generate import Engine
from engine.gguf_file import GGUFFile, StringArray


def test_a_model_loads_from_its_bytes_as_from_its_file(model_factory):
    # the same header, fingerprint and logits as from the file
    path = model_factory("tiny", "Q4_K_M", 0)
    data = bytearray(path.read_bytes())
    a = Engine.load(str(path), warm_up=False)
    b = Engine.load("s3://bucket/models/" + path.name, warm_up=False, data=data)
    assert b.model_id == a.model_id and b.fingerprint == a.fingerprint
    assert isinstance(b.model.file.metadata["tokenizer.ggml.merges"], (list, StringArray))
    ids = np.asarray(a.tokenizer.encode("The warm Lambda says hello to the cold one"), dtype=np.int64)
    la = a.model.forward(ids, a.model.new_state(), logits="all")
    lb = b.model.forward(ids, b.model.new_state(), logits="all")
    assert np.array_equal(la, lb)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        GGUFFile("memory", b"NOPE" + bytes(64))
