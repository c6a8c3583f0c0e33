"""bench.profile decode --by-matrix: every matrix a decode step reads is timed and counted once."""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader


def test_by_matrix_counts_each_matrix_once_per_step(model_factory):
    from bench.profile import decode_by_matrix
    from engine.generate import Engine
    from engine.weights import Linear

    path = model_factory("tiny", "Q8_0", 0)
    model = Engine.load(str(path)).model
    steps = 3
    total, rows = decode_by_matrix(model, np.arange(1, 40), steps)
    assert Linear.__call__.__name__ == "__call__"                     # put back
    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    seen = {n for r in rows for n in r.names}
    # the matrices a token multiplies: every Linear but the embedding (its row is a lookup),
    # unless the head is tied to it
    tied = "output.weight" not in sizes
    want = {n for n, t in ((t.name, t) for t in GGUFReader(path).tensors)
            if len(t.shape) == 2 and "conv1d" not in n and (n != "token_embd.weight" or tied)}
    assert seen == want
    assert sum(r.nbytes for r in rows) == steps * sum(sizes[n] for n in want)
    assert all(r.calls == steps * len(r.names) for r in rows)
    assert 0 < sum(r.seconds for r in rows) < total
