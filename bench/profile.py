"""Where the time goes: ``python -m bench.profile {decode,prefill,extend} --model M [--top N]``.

decode   ms per decode step (10 steps after an 8-token prompt), then a cProfile of 10 more
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

import numpy as np


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["decode", "prefill", "extend"])
    ap.add_argument("--model", default="models/0.8b-Q4_K_M.gguf")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--top", type=int, default=16)
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
