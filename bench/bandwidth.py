"""How close decode runs to the host's memory bandwidth.

Decode reads every weight once per token (the embedding table only for its one row, unless the
head is tied to it), so its ceiling is bandwidth ÷ bytes per token. ``read_bandwidth`` measures
the read side of that ceiling: a sum over an array of at least 1 GiB (beyond any cache) with the
bench's thread count, best of a few rounds; ``fraction`` puts a decode rate against it.

    python -m bench.bandwidth --threads 2 [--model M.gguf --tok-s 40]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

GIB = 1 << 30
EMBEDDING = "token_embd.weight"
HEAD = "output.weight"


def read_bandwidth(threads: int, nbytes: int = GIB, rounds: int = 3) -> float:
    """Bytes per second read by `threads` threads summing disjoint slices of one `nbytes` array
    (numpy releases the GIL inside the sum); best of `rounds` after one untimed pass."""
    if threads < 1 or nbytes < 1 << 20:
        raise ValueError("threads >= 1 and at least 1 MiB to read")
    a = np.ones(nbytes // 8, dtype=np.float64)          # written once: every page is resident
    bounds = np.linspace(0, a.size, threads + 1).astype(np.int64)
    slices = [a[bounds[i]:bounds[i + 1]] for i in range(threads)]
    best = 0.0
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(np.sum, slices))
        for _ in range(rounds):
            t = time.perf_counter()
            total = sum(pool.map(np.sum, slices))
            elapsed = time.perf_counter() - t
            if total != a.size:                           # the sum is the check that all was read
                raise RuntimeError("the bandwidth probe read the wrong amount")
            best = max(best, a.nbytes / elapsed)
    return best


def decode_bytes_per_token(model: str | Path) -> int:
    """Bytes of weights one decode step reads: every tensor, the embedding table for one row
    only unless no output.weight exists (then it is the tied head and read whole)."""
    from engine.gguf_file import GGUFFile

    f = GGUFFile(str(model))
    total = 0
    for name in f.tensor_names:
        t = f.tensor(name)
        if name == EMBEDDING and f.has_tensor(HEAD):
            total += t.nbytes // max(1, t.shape[0])         # one row
        else:
            total += t.nbytes
    return total


def fraction(bytes_per_token: float, tok_s: float, bandwidth: float) -> float:
    """Share of the measured read bandwidth a decode rate uses (1.0: at the wire)."""
    if bandwidth <= 0:
        raise ValueError("bandwidth must be positive")
    return round(bytes_per_token * tok_s / bandwidth, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--model")
    ap.add_argument("--tok-s", type=float)
    a = ap.parse_args(argv)
    bw = read_bandwidth(a.threads, int(a.gib * GIB))
    out: dict = {"threads": a.threads, "read_gb_s": round(bw / 1e9, 2)}
    if a.model:
        out["decode_bytes_per_token"] = decode_bytes_per_token(a.model)
        if a.tok_s:
            out["fraction_of_bandwidth"] = fraction(out["decode_bytes_per_token"], a.tok_s, bw)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
