"""Micro-benchmark of the decode matrix-vector kernels: ``python -m bench.kernels``.

Prints weight-bytes GB/s per format and shape: per CPU-second on 1 thread (``time.process_time``,
best of N, so other load on a shared machine distorts it less) and wall-clock on all threads.
``--baseline REV`` also runs the kernels of that git revision (default 5287d5b, before this
rewrite) for an old-vs-new column. Shapes: 1024x3584, 3584x1024 and the 248320x1024 LM head
(that one streams from DRAM; the small ones are L3-resident when repeated).
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

SHAPES = [(1024, 3584), (3584, 1024), (248320, 1024)]
FORMATS = ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_K", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16", "F32"]
ROOT = Path(__file__).resolve().parents[1]


def _baseline_module(rev: str):
    src = subprocess.run(["git", "show", f"{rev}:engine/quant/kernels.py"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    name = "engine.quant._kernels_baseline"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "engine.quant"
    sys.modules[name] = mod
    exec(compile(src.replace("cache=True", "cache=False"), f"<{rev}:kernels.py>", "exec"), mod.__dict__)
    return mod


def _rate(fn, nbytes: int, clock, reps: int) -> float:
    fn()  # compile / warm
    n = max(1, int(3e8 // nbytes))
    best = float("inf")
    for _ in range(reps):
        t0 = clock()
        for _ in range(n):
            fn()
        best = min(best, (clock() - t0) / n)
    return nbytes / best / 1e9


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="Q4_K,Q6_K,Q8_0,Q4_0,Q5_K")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--baseline", default="5287d5b", help="git rev of the old kernels ('' = skip)")
    ap.add_argument("--threads", type=int, default=None, help="threads for the wall column")
    args = ap.parse_args(argv)

    from engine import threads
    cfg_all = threads.configure(args.threads)
    import numba
    import numpy as np
    from gguf import GGMLQuantizationType as T

    from engine.quant import kernels as K
    old = _baseline_module(args.baseline) if args.baseline else None

    print(f"threads (wall column): {cfg_all.threads}; GB/s of weight bytes; best of {args.reps}")
    hdr = f"{'format':6} {'shape':>12} {'new 1T cpu':>11} {'new wall':>9}"
    if old:
        hdr += f" {'old 1T cpu':>11} {'old wall':>9}"
    print(hdr + f" {'prep ms':>8} {'prep MB':>8}")
    for fname in args.formats.split(","):
        qt = T[fname]
        for rows, cols in SHAPES:
            raw = K._bench_weights(qt, rows, cols)
            x = np.random.default_rng(1).standard_normal(cols, dtype=np.float32)
            out = np.empty(rows, np.float32)
            t0 = time.perf_counter()
            plan = K.MatvecPlan(qt, raw, rows, cols)
            prep_ms = (time.perf_counter() - t0) * 1e3
            prep = plan.prepared
            new = lambda plan=plan, x=x, out=out: plan(x, out)  # noqa: E731
            cols_out = []
            fns = [new] + ([lambda qt=qt, raw=raw, x=x, out=out: old.matvec(qt, raw, x, out)] if old else [])
            for fn in fns:
                numba.set_num_threads(1)
                one = _rate(fn, raw.nbytes, time.process_time, args.reps)
                numba.set_num_threads(cfg_all.threads)
                wall = _rate(fn, raw.nbytes, time.perf_counter, args.reps)
                cols_out += [f"{one:11.2f}", f"{wall:9.2f}"]
            mb = 0.0 if prep is None else prep.nbytes / 1e6
            print(f"{fname:6} {f'{rows}x{cols}':>12} {' '.join(cols_out)} {prep_ms:8.1f} {mb:8.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
