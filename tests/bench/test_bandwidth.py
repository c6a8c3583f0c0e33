"""bench/bandwidth.py: the arithmetic of the decode-vs-bandwidth figure, and that the probe reads
what it says (not how fast: speed is a benchmark)."""
from __future__ import annotations

import numpy as np
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


def test_the_probes_read_their_array_with_each_thread_count():
    for threads in (1, 2, 3):
        both = B.read_bandwidths(threads, nbytes=8 << 20, rounds=1)
        assert set(both) == {"numpy", "numba_rows"} and min(both.values()) > 0
        assert B.read_bandwidth(threads, nbytes=8 << 20, rounds=1) > 0
    with pytest.raises(ValueError):
        B.read_bandwidth(0)


def test_the_numba_probe_checks_what_it_read():
    ones = np.ones((16, B.ROW_WORDS), np.float64).view(np.uint64)
    assert B._numba_probe(ones, 2, rounds=1) > 0
    ones[3, 7] = 0                          # one word the sum would miss
    with pytest.raises(RuntimeError, match="wrong amount"):
        B._numba_probe(ones, 2, rounds=1)
