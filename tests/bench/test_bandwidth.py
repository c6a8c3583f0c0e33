"""bench/bandwidth.py: the arithmetic of the decode-vs-bandwidth figure, and that the probe reads
what it says (not how fast: speed is a benchmark)."""
from __future__ import annotations

import pytest

from bench import bandwidth as B
from engine.gguf_file import GGUFFile


def test_fraction_is_bytes_times_rate_over_bandwidth():
    assert B.fraction(500e6, 40.0, 25e9) == 0.8
    assert B.fraction(1e6, 1.0, 4e6) == 0.25
    with pytest.raises(ValueError):
        B.fraction(1.0, 1.0, 0.0)


def test_decode_reads_every_weight_and_one_embedding_row(model_factory):
    for head in ("tied", "separate"):
        path = model_factory("tiny", "Q8_0", 0, head)
        f = GGUFFile(str(path))
        total = sum(f.tensor(n).nbytes for n in f.tensor_names)
        emb = f.tensor(B.EMBEDDING)
        expected = total if not f.has_tensor(B.HEAD) else total - emb.nbytes + emb.nbytes // emb.shape[0]
        assert B.decode_bytes_per_token(path) == expected
    assert f.has_tensor(B.HEAD)            # the last one had its own head


def test_the_probe_reads_its_array_with_each_thread_count():
    for threads in (1, 2, 3):
        assert B.read_bandwidth(threads, nbytes=8 << 20, rounds=1) > 0
    with pytest.raises(ValueError):
        B.read_bandwidth(0)
