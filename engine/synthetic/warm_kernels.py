"""Compile every numba kernel the handler will run into ``NUMBA_CACHE_DIR`` (image build step).

    NUMBA_CACHE_DIR=/opt/numba-cache NUMBA_CPU_NAME=neoverse-n1 NUMBA_CPU_FEATURES= \
        python -m engine warm-kernels [--weights Q4_K_M,Q8_0,F32,Q3_K_M,IQ4_XS]

For each weight scheme it builds a tiny factory model (same tensor formats and code paths as a
real Qwen3.5 GGUF of that scheme, a few MB), loads it (``Engine.load`` warms the kernels) and runs
a batched prefill, an extend and a few decode steps, so a cold start in the image loads compiled
kernels instead of compiling. Prints one JSON line per scheme with its compile time.

The default covers the files a function serves at 4B and 9B: Q4_K_M (Q4_K, Q6_K), Q8_0, F32, and
the two 9B downloads that fit Lambda's 10 GB with room for the KV cache, Q3_K_M (Q3_K, Q4_K,
Q5_K, Q6_K) and IQ4_XS (IQ4_XS, Q5_K, Q6_K); `covered_types` is what a test holds against the
4B/9B files' tensor types. Q2_K, IQ4_NL, IQ3_S, IQ3_XXS compile on first use (docs/function.md).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

DEFAULT_WEIGHTS = "Q4_K_M,Q8_0,F32,Q3_K_M,IQ4_XS,Q2_K,IQ4_NL,IQ3_S,Q5_K_M"


def covered_types(weights: list[str]) -> set:
    """The tensor types of the warm-up models for `weights` (the tiny preset, as `warm` builds)."""
    from engine.synthetic.factory import PRESETS, stored_types, tensor_specs

    p = PRESETS["tiny"]
    return {t for w in weights for t in stored_types(p, w, tensor_specs(p, 0))}


def warm(weights: list[str], workdir: Path) -> list[dict]:
    from engine.generate import Engine, SamplingParams
    from engine.settings import Settings
    from engine.synthetic.factory import make_model

    out = []
    for w in weights:
        t0 = time.perf_counter()
        path = make_model(workdir / f"warm-{w}.gguf", "tiny", w, 0, None)
        eng = Engine.load(str(path), settings=Settings.from_env(os.environ))
        greedy = SamplingParams(temperature=0.0)
        long_prompt = "warm the kernels " * 40
        eng.generate(long_prompt, max_tokens=3, sampling=greedy)                  # batched prefill + decode
        eng.generate(long_prompt + " and extend", max_tokens=3, sampling=greedy)  # extend path
        eng.generate(long_prompt + " and extend", max_tokens=2, sampling=SamplingParams(temperature=0.7, top_p=0.9,
                                                                                         top_k=20, seed=1))
        line = {"event": "warm_kernels", "weights": w, "compile_ms": round(eng.compile_ms, 1),
                "total_ms": round((time.perf_counter() - t0) * 1000.0, 1)}
        print(json.dumps(line), flush=True)
        out.append(line)
    return out
