"""One prefill matrix product, the int8 tile against dequantize + BLAS: ``python -m bench.prefill_matrix``.

``--format IQ4_XS --rows 4096 --cols 4096 --tokens 512``: random blocks (sane f16 scales), the
activations quantized to Q8_K once (as a forward shares them between the projections that read
one input), then `MatvecPlan.tokens_q8k` (the tile this CPU runs: x86.lowbit's panel tiles on
AVX-512 VNNI) and `dequantize_rows_into` + ``x @ W.T`` alternating in one process, min and
median of N rounds. The machines here are shared: compare the two columns of one run, not runs.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType as T

from engine.quant import kernels
from engine.quant.activations import quantize_q8_k_tokens
from engine.quant.formats import get_format

# byte offsets of each format's f16 scales in a block (set to 0.01 so no product overflows)
_F16_SCALES = {T.IQ4_XS: (0,), T.Q5_K: (0, 2), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q6_K: (208,), T.IQ3_S: (0,),
               T.Q2_K: (80, 82)}


def run(fmt: str, rows: int, cols: int, tokens: int, rounds: int) -> dict:
    qt = T[fmt]
    if qt not in _F16_SCALES:
        raise SystemExit(f"--format {fmt}: choose one of {', '.join(q.name for q in _F16_SCALES)}")
    bpb = get_format(qt).type_size
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (rows, cols // 256 * bpb), dtype=np.uint8)
    for o in _F16_SCALES[qt]:
        raw.reshape(rows, cols // 256, bpb)[:, :, o:o + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    plan = kernels.MatvecPlan(qt, raw, rows, cols)
    acts = quantize_q8_k_tokens(x, kernels.WIDE_TILE)
    wf = np.empty((rows, cols), np.float32)

    def blas():
        kernels.dequantize_rows_into(qt, raw, wf)
        return x @ wf.T

    paths = {"tile": lambda: plan.tokens_q8k(acts), "dequantize+blas": blas}
    ref = blas()
    err = float(np.abs(paths["tile"]() - ref).max() / np.abs(ref).max())
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for k, f in paths.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    macs = rows * cols * tokens
    out = {"format": fmt, "shape": [rows, cols, tokens], "tile_rel_err_vs_blas": err}
    for k, v in times.items():
        v.sort()
        out[k] = {"min_ms": round(v[0] * 1e3, 1), "median_ms": round(v[len(v) // 2] * 1e3, 1),
                  # three significant figures: a small product on a loaded host is well under
                  # 0.05 GMAC/s, which one decimal rounded to 0.0
                  "gmac_s": float(f"{macs / v[0] / 1e9:.3g}")}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="IQ4_XS")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    r = run(a.format, a.rows, a.cols, a.tokens, a.rounds)
    print(f"{r['format']} {a.rows}x{a.cols} T={a.tokens} (tile vs dequantize+blas, rel. diff "
          f"{r['tile_rel_err_vs_blas']:.1e}: the activations' int8 rounding)")
    for k in ("tile", "dequantize+blas"):
        print(f"  {k:16s} min {r[k]['min_ms']:8.1f} ms  median {r[k]['median_ms']:8.1f} ms  {r[k]['gmac_s']:6.1f} GMAC/s")


if __name__ == "__main__":
    main()
