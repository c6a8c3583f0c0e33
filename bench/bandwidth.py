"""How close decode runs to the host's memory bandwidth.

Decode reads every weight once per token (the embedding table only for its one row, unless the
head is tied to it), so its ceiling is bandwidth ÷ bytes per token. ``read_bandwidth`` measures
the read side of that ceiling: an array of at least 1 GiB (beyond any cache) read with the
bench's thread count, best of a few rounds, by two probes; the faster one is the figure.

* numpy: the threads sum disjoint halves (numpy releases the GIL inside the sum).
* numba rows: a parallel kernel shaped like a decode product (one sum per 4 KiB row, rows split
  between the threads, 256-bit integer adds). On a Zen 3 VM with 2 threads it read 27.6-32.7
  GB/s where numpy read 27.1-28.8, the same minutes (and ik_llama.cpp's decode on a Zen 4 read
  more than numpy's figure there: issue 51): a ceiling a decode can beat is no ceiling.

``fraction`` puts a decode rate against the figure.

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
from numba import njit, prange

GIB = 1 << 30
EMBEDDING = "token_embd.weight"
HEAD = "output.weight"
ROW_WORDS = 512  # the numba probe's rows: 4 KiB, a decode product's few-KiB rows
ONE_BITS = int(np.float64(1.0).view(np.uint64))  # what the numba probe adds per word of ones


def read_bandwidth(threads: int, nbytes: int = GIB, rounds: int = 3) -> float:
    """Bytes per second one `nbytes` array is read at by `threads` threads: the faster of the two
    probes (`read_bandwidths`)."""
    return max(read_bandwidths(threads, nbytes, rounds).values())


def read_bandwidths(threads: int, nbytes: int = GIB, rounds: int = 3) -> dict[str, float]:
    """Each probe's bytes per second over one `nbytes` array of ones (written once: every page
    resident), best of `rounds` after one untimed pass: {"numpy": .., "numba_rows": ..}. Each
    probe's sum is checked, so nothing is skipped."""
    if threads < 1 or nbytes < 1 << 20:
        raise ValueError("threads >= 1 and at least 1 MiB to read")
    a = np.ones(nbytes // 8 // ROW_WORDS * ROW_WORDS, dtype=np.float64)
    return {"numpy": _numpy_probe(a, threads, rounds),
            "numba_rows": _numba_probe(a.view(np.uint64).reshape(-1, ROW_WORDS), threads, rounds)}


def _numpy_probe(a: np.ndarray, threads: int, rounds: int) -> float:
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


@njit(parallel=True, cache=True)
def _row_sums(a, out):
    # one sum per row, the rows split between the threads as a decode product's are; integer
    # adds, so LLVM vectorizes and interleaves them without fastmath
    for r in prange(a.shape[0]):
        s = np.uint64(0)
        for i in range(a.shape[1]):
            s += a[r, i]
        out[r] = s


def _numba_probe(rows: np.ndarray, threads: int, rounds: int) -> float:
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    out = np.empty(rows.shape[0], np.uint64)
    best = 0.0
    try:
        _row_sums(rows, out)
        for _ in range(rounds):
            t = time.perf_counter()
            _row_sums(rows, out)
            elapsed = time.perf_counter() - t
            if int(out.sum()) != rows.size * ONE_BITS % (1 << 64):
                raise RuntimeError("the bandwidth probe read the wrong amount")
            best = max(best, rows.nbytes / elapsed)
    finally:
        numba.set_num_threads(before)
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
    bw = read_bandwidths(a.threads, int(a.gib * GIB))
    out: dict = {"threads": a.threads, "read_gb_s": round(max(bw.values()) / 1e9, 2),
                 "probes_gb_s": {k: round(v / 1e9, 2) for k, v in bw.items()}}
    if a.model:
        out["decode_bytes_per_token"] = decode_bytes_per_token(a.model)
        if a.tok_s:
            out["fraction_of_bandwidth"] = fraction(out["decode_bytes_per_token"], a.tok_s, max(bw.values()))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
