"""Where the time goes: ``python -m bench.profile {decode,prefill,extend} --model M [--top N]``.

decode   ms per decode step (10 steps after an 8-token prompt), then a cProfile of 10 more;
         `--by-matrix`: instead, each step's time per matrix format and role against the bytes
         it reads (GB/s), and what the rest of the step takes (DeltaNet, attention, norms,
         sampling, Python between kernels)
prefill  seconds for a 512-token batched prefill, then its cProfile
extend   ms for an 18-token extend after a 569-token prefix (a chat turn), then its cProfile

numba kernels show up under their Python names (`_mv_k_q8k`, `_mm_k_q8k`, `_dq_q6_k`, ...); BLAS
calls made with ``@`` / np.matmul are counted in the caller's own time, so after the cProfile
table a per-kernel summary names them: `weights.py __call__` is the prefill GEMMs
(dequantize + BLAS), `_heads` the DeltaNet chunk products, `causal_attention` attention's. The
first lines say which CPU level and kernels ran (engine/quant/paths.py). The figures in the
performance notes were taken with this (2 threads, 0.8B-shaped Q4_K_M factory model).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from dataclasses import dataclass

import numpy as np


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["decode", "prefill", "extend"])
    ap.add_argument("--model", default="models/0.8b-Q4_K_M.gguf")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--by-matrix", action="store_true", help="decode: time and bytes per matrix format and role")
    ap.add_argument("--steps", type=int, default=20, help="decode steps timed with --by-matrix")
    a = ap.parse_args(argv)

    from engine import threads
    threads.configure(a.threads)
    from engine.generate import Engine
    from engine.settings import Settings

    eng = Engine.load(a.model, settings=Settings.from_env(os.environ))
    model = eng.model
    from engine.quant import paths
    print(f"cpu: {paths.summary()}  kernels: {eng.kernel_paths}")
    ids = np.random.default_rng(0).integers(0, 4000, 600)
    if a.what == "decode" and a.by_matrix:
        _print_by_matrix(*decode_by_matrix(model, ids, a.steps), a.steps)
        return
    if a.what == "decode":
        state = model.new_state()
        model.forward(ids[:8], state, logits="last")
        run = lambda: [model.forward(ids[8:9], state, logits="last") for _ in range(10)]  # noqa: E731
        run()
        t = time.perf_counter()
        run()
        print(f"decode: {(time.perf_counter() - t) * 100:.1f} ms/token")
    elif a.what == "prefill":
        model.forward(ids[:64], model.new_state(), logits="last")
        run = lambda: model.forward(ids[:512], model.new_state(), logits="last")  # noqa: E731
        t = time.perf_counter()
        run()
        print(f"prefill 512: {time.perf_counter() - t:.2f} s")
    else:
        prefix = model.new_state()
        model.forward(ids[:569], prefix, logits="none")
        run = lambda: model.forward(ids[569:587], prefix.copy(), logits="last")  # noqa: E731
        run()
        t = time.perf_counter()
        run()
        print(f"extend 18 after 569: {(time.perf_counter() - t) * 1e3:.0f} ms")
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(a.top)
    _kernel_summary(stats, a.top)


@dataclass
class MatrixTime:
    """The products of one matrix format and role (e.g. "Q4_K ffn_up") over the timed steps."""

    group: str
    calls: int
    seconds: float
    nbytes: int            # bytes read: each single-token product reads its matrix once
    names: frozenset[str]  # the tensors


def _role(tensor: str) -> str:
    parts = tensor.split(".")
    return parts[-2] if tensor.startswith("blk.") and len(parts) >= 3 else parts[0]


def decode_by_matrix(model, ids: np.ndarray, steps: int = 20) -> tuple[float, list[MatrixTime]]:
    """Wall seconds of `steps` decode steps (after an 8-token prompt and one untimed step, so every
    plan and kernel is made) and each matrix group's share: every `Linear` product of one token
    is timed around its call (its Python included) and counted at its matrix's bytes."""
    from engine.weights import Linear

    acc: dict[str, list] = {}
    original = Linear.__call__

    def timed(self, x):
        t = time.perf_counter()
        try:
            return original(self, x)
        finally:
            if np.shape(x)[0] == 1:
                r = acc.setdefault(f"{self.qtype.name} {_role(self.name)}", [0, 0.0, 0, set()])
                r[0] += 1
                r[1] += time.perf_counter() - t
                r[2] += self.nbytes
                r[3].add(self.name)

    state = model.new_state()
    model.forward(ids[:8], state, logits="last")
    model.forward(ids[8:9], state, logits="last")
    Linear.__call__ = timed  # the profile's process only; put back below
    try:
        t0 = time.perf_counter()
        for k in range(steps):
            model.forward(ids[9 + k:10 + k], state, logits="last")
        total = time.perf_counter() - t0
    finally:
        Linear.__call__ = original
    rows = [MatrixTime(g, c, s, b, frozenset(n)) for g, (c, s, b, n) in acc.items()]
    return total, sorted(rows, key=lambda r: -r.seconds)


def _print_by_matrix(total: float, rows: list[MatrixTime], steps: int) -> None:
    step_ms = 1e3 * total / steps
    print(f"decode: {step_ms:.2f} ms/step over {steps} steps ({steps / total:.1f} tok/s)")
    print(f"  {'matrices':24s} {'calls':>5s} {'ms':>7s} {'share':>6s} {'MB':>7s} {'GB/s':>6s}")
    for r in rows:
        ms, mb = 1e3 * r.seconds / steps, r.nbytes / steps / 1e6
        print(f"  {r.group:24s} {r.calls // steps:5d} {ms:7.2f} {100 * ms / step_ms:5.1f}% {mb:7.1f} "
              f"{mb / max(ms, 1e-9):6.1f}")
    mat_ms = 1e3 * sum(r.seconds for r in rows) / steps
    mat_mb = sum(r.nbytes for r in rows) / steps / 1e6
    print(f"  {'all matrices':24s} {'':5s} {mat_ms:7.2f} {100 * mat_ms / step_ms:5.1f}% {mat_mb:7.1f} "
          f"{mat_mb / max(mat_ms, 1e-9):6.1f}")
    rest = step_ms - mat_ms
    print(f"  {'the rest of the step':24s} {'':5s} {rest:7.2f} {100 * rest / step_ms:5.1f}%  "
          "(DeltaNet step, attention, norms, conv, sampling, Python between kernels)")


# what a function's own time is, where BLAS runs inside it (see the module docstring)
_BLAS_IN = {("weights.py", "__call__"): "prefill GEMMs (dequantize + BLAS x @ W.T)",
            ("deltanet.py", "_heads"): "DeltaNet chunk products (BLAS)",
            ("attention.py", "causal_attention"): "attention products (BLAS)",
            ("kernels.py", "tokens_q8k"): "Q4_K mins product (BLAS)"}


def _kernel_summary(stats: pstats.Stats, top: int) -> None:
    """Own time per kernel, with the functions that hold BLAS time named for what they do."""
    rows = []
    total = 0.0
    for (path, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tottime
        base = path.rsplit("/", 1)[-1]
        if "/engine/" not in path and not name.startswith("<"):
            continue
        rows.append((tottime, f"{base}:{name}", _BLAS_IN.get((base, name), "")))
    rows.sort(reverse=True)
    print(f"per kernel (own time, of {total:.3f} s profiled):")
    for t, where, what in rows[:top]:
        print(f"  {t:8.3f} s {100 * t / max(total, 1e-9):5.1f} %  {where:45s} {what}")


if __name__ == "__main__":
    main()
