"""Every x86 kernel level this host can run (engine/quant/paths.py), each in its own process
compiled for that level through NUMBA_CPU_NAME + NUMBA_CPU_FEATURES: the chooser names the level,
the decode rows and the prefill tiles of Q4_K, Q6_K and Q8_0 (and of the low-bit formats'
x86/lowbit.py, Q2_K, Q3_K, Q5_K, IQ4_XS, IQ4_NL, IQ3_S) match the exact product of the
reference-decoded weights (gguf.quants' numbers: test_quant_formats holds our decode to them)
with the activations rounded as llama.cpp rounds them, and the tiles contain the level's
instructions. An AVX2 build runs on any x86-64-v3 host, so the floor is checked everywhere. AVX-512
VNNI runs twice, compiled for an Intel and an AMD core name: their K-format prefill tiles differ."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engine.quant import paths

llvm = pytest.importorskip("llvmlite.binding")
HOST = {k for k, v in llvm.get_host_cpu_features().items() if v}
AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "evex512")
LEVELS = {
    "avx2": paths.X86_64_V3,
    "avxvnni": paths.X86_64_V3 + ("avxvnni",),
    "avx512bw": paths.X86_64_V3 + AVX512,
    "avx512vnni": paths.X86_64_V3 + AVX512 + ("avx512vnni",),
    "avx512vnni-znver": paths.X86_64_V3 + AVX512 + ("avx512vnni",),
    # the x86_64 image's AVX-512 level: compiled as the image does, for the name's own features
    # (NUMBA_CPU_NAME=cascadelake, NUMBA_CPU_FEATURES=""; function/numba_cache.py X86_LEVELS)
    "avx512vnni-image": paths.X86_CASCADELAKE,
}
# the CPU name each run compiles for: AMD's AVX-512 VNNI keeps x86/avx512.py's K-format tiles at
# every prompt length (traits.py, Int8Kernels.every_length), Intel's takes the panel tiles for
# Q4_K and Q6_K too (lowbit_kernels.PANEL)
CPU_NAME = {"avx512vnni-znver": "znver4", "avx512vnni-image": "cascadelake"}
EMPTY_FEATURES = {"avx512vnni-image"}
# instructions the K-format tile must contain, and ones it must not (register width)
TILE_ASM = {
    "avx2": (("vpmaddubsw", "vpmaddwd"), ("zmm", "vpdpbusd")),
    "avxvnni": (("vpdpbusd", "vpackssdw"), ("zmm",)),
    "avx512bw": (("vpmaddubsw", "zmm"), ("vpdpbusd",)),
    "avx512vnni": (("vpdpbusd", "zmm"), ("vpackssdw",)),  # the panel tile
    "avx512vnni-znver": (("vpdpbusd", "vpackssdw", "zmm"), ()),
    "avx512vnni-image": (("vpdpbusd", "zmm"), ("vpackssdw",)),
}

_CHILD = r"""
import json, sys
import numpy as np
import engine
from engine import threads
threads.configure(2)
from gguf import GGMLQuantizationType as T
from engine.quant import kernels as K, paths, traits, formats as F
from engine.quant.activations import round_activations
from tests.asm import asm_of
from tests.engine.test_quant_kernels import _random_blocks, RTOL

res = {"level": paths.target().level, "errors": {}, "int8": {}}
rng = np.random.default_rng(7)
for qt in (T.Q4_K, T.Q6_K, T.Q8_0):
    rows, cols = 40, 1024
    raw = _random_blocks(qt, rows, cols, 11)
    W = F.dequantize(raw, qt, (rows, cols)).astype(np.float64)
    plan = K.MatvecPlan(qt, raw, rows, cols)
    res["int8"][qt.name] = bool(plan.int8) and K.int8_prefill_wins(qt, 5)
    worst = 0.0
    for t in (1, 2, 5, 8, 67):
        x = rng.standard_normal((t, cols)).astype(np.float32)
        x[:, :256] *= 1e-3
        if t == 1:
            got = np.empty((1, rows), np.float32)
            plan(x[0], got[0])
        else:
            got = plan.tokens(x)
        xr = round_activations(x, qt).astype(np.float64)
        ref = xr @ W.T
        scale = np.abs(xr) @ np.abs(W).T
        worst = max(worst, float(np.max(np.abs(got - ref) / (RTOL * scale + 1e-30))))
    res["errors"][qt.name] = worst
# the low-bit formats' rows and tiles (x86/lowbit.py: the same AVX2 code compiled for every level)
from tests.engine.test_quant_lowbit import X86_INT8, _exact, _random_blocks as _lowbit_blocks
for qt in X86_INT8:
    rows, cols = 24, 512
    raw = _lowbit_blocks(qt, rows, cols, 12)
    W = F.dequantize(raw, qt, (rows, cols)).astype(np.float64)
    plan = K.MatvecPlan(qt, raw, rows, cols)
    res["int8"][qt.name] = bool(plan.int8) and K.int8_prefill_wins(qt, 5)
    worst = 0.0
    for t in (1, 5):
        x = rng.standard_normal((t, cols)).astype(np.float32)
        if t == 1:
            got = np.empty((1, rows), np.float32)
            plan(x[0], got[0])
        else:
            got = plan.tokens(x)
        xr = round_activations(x, qt).astype(np.float64)
        ref = _exact(W, raw, qt, x)   # Q4_1 / Q5_1: with Q8_1's f16-rounded block sums, as llama.cpp
        worst = max(worst, float(np.max(np.abs(got - ref) / (RTOL * (np.abs(xr) @ np.abs(W).T) + 1e-30))))
    res["errors"][qt.name] = worst
# IQ4_XS's, Q3_K's and Q5_K's tiles: 512-bit vpdpbusd at avx512vnni only (x86/lowbit.py), AVX2 elsewhere
res["vnni512_tiles"] = {qt.name: "vpdpbusd" in "\n".join(asm_of(traits.int8_row(qt).tile)) for qt in (T.IQ4_XS, T.Q3_K, T.Q5_K)}
asm = "\n".join(asm_of(traits.int8_row(T.Q4_K).tile))
res["asm"] = {op: op in asm for op in sys.argv[1].split(",") if op}
# the Q8_0 decode row and tile: the block scale converted without a merge into a live register
plan = K.MatvecPlan(T.Q8_0, _random_blocks(T.Q8_0, 4096, 256, 3), 4096, 256)
plan(np.ones(256, np.float32), np.empty(4096, np.float32))
q8 = "\n".join(asm_of(plan.kernel) + asm_of(traits.int8_row(T.Q8_0).tile))
res["q8_0_merges"] = [line.strip() for line in q8.splitlines() if "vpinsrw" in line]
print("RESULT " + json.dumps(res))
"""


def _runnable(level: str) -> bool:
    return platform.machine() in paths.X86 and all(f in HOST for f in LEVELS[level] if f != "evex512")


@pytest.mark.parametrize("level", list(LEVELS))
def test_level_kernels_match_the_exact_product(level, tmp_path):
    if not _runnable(level):
        pytest.skip(f"this host cannot run {level} code")
    features = tuple(f for f in LEVELS[level] if f in HOST or f != "evex512")
    want, banned = TILE_ASM[level]
    env = dict(os.environ, NUMBA_CPU_NAME=CPU_NAME.get(level, "haswell"),
               NUMBA_CPU_FEATURES="" if level in EMPTY_FEATURES else paths.features_flag_string(features))
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", _CHILD, ",".join(want + banned)], capture_output=True, text=True,
                       env=env, cwd=root, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    assert res["level"] == level.removesuffix("-znver").removesuffix("-image")
    assert all(res["int8"].values()), res["int8"]
    # 1.0 = the tolerance test_quant_kernels holds every integer kernel to
    assert all(e <= 1.0 for e in res["errors"].values()), res["errors"]
    assert all(res["asm"][op] for op in want), res["asm"]
    assert not any(res["asm"][op] for op in banned), res["asm"]
    assert all(v == level.startswith("avx512vnni") for v in res["vnni512_tiles"].values()), res["vnni512_tiles"]
    # a scalar f16 load merged into the accumulator's register (vpinsrw) chained every Q8_0 block
    # to the previous block's FMA: 3.3 GB/s instead of 6-15 on AVX2 (int8_dot.half_at)
    assert not res["q8_0_merges"], res["q8_0_merges"]


def test_target_levels_from_features():
    def level(*feats: str, machine: str = "x86_64") -> str:
        return paths.Target(machine, "x", frozenset(feats)).level

    base = ("avx2", "fma", "f16c")
    assert level(*base) == "avx2"
    assert level(*base, "avxvnni") == "avxvnni"
    assert level(*base, "avx512bw", "avx512vl") == "avx512bw"
    assert level(*base, "avx512bw", "avx512vl", "avx512vnni", "avxvnni") == "avx512vnni"
    assert level("sse4.2") == "portable"
    assert level(*base, machine="aarch64") == "portable"


def test_features_flag_string_turns_off_everything_else():
    flags = paths.features_flag_string(paths.X86_64_V3).split(",")
    assert "+avx2" in flags and "+fma" in flags
    assert not any(f.startswith("+avx512") or f.startswith("+avxvnni") or f.startswith("+amx") for f in flags)
    if "avx512f" in HOST:
        assert "-avx512f" in flags


@pytest.mark.skipif(platform.machine() not in paths.X86, reason="the x86_64 image's targets")
@pytest.mark.parametrize("name,level,iq4_xs_prefill", [("x86-64-v3", "avx2", "dequantize+blas"),
                                                       ("cascadelake", "avx512vnni", "avx512vnni-int8")])
def test_image_targets_with_empty_features_run_their_levels_int8_kernels(name, level, iq4_xs_prefill):
    """The x86_64 image compiles and runs with NUMBA_CPU_NAME=<level> and NUMBA_CPU_FEATURES=""
    (function/numba_cache.py X86_LEVELS, cpu.json): LLVM takes the name's features, and so must the
    kernel chooser; read as "no features" it put the image on the portable float kernels. Only
    reads the target (no kernel runs), so it holds on any x86 host."""
    from function.numba_cache import X86_LEVELS

    assert name in dict(X86_LEVELS) and name in paths.X86_CPU_FEATURES
    code = ("import json; from engine.quant import choice, paths; from gguf import GGMLQuantizationType as T; "
            "print(json.dumps([paths.target().level, choice.decode_path(T.Q4_K) != 'float', choice.decode_path(T.IQ4_XS) != 'float', "
            "choice.prefill_path(T.IQ4_XS)]))")
    env = dict(os.environ, NUMBA_CPU_NAME=name, NUMBA_CPU_FEATURES="")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [level, True, True, iq4_xs_prefill]


def test_image_levels_require_the_flags_of_the_features_they_compile_for():
    """A level's `requires` (/proc/cpuinfo names) must cover the ISA features LLVM compiles its name
    for (paths.X86_CPU_FEATURES), or a Lambda CPU without one would die of SIGILL at cold start."""
    from function.numba_cache import X86_LEVELS

    cpuinfo = {"avx512vnni": "avx512_vnni", "bmi": "bmi1", "sse4.1": "sse4_1", "sse4.2": "sse4_2"}
    # features every x86-64-v3 CPU has, so the levels do not list them
    base = {"64bit", "cmov", "cx8", "cx16", "fxsr", "mmx", "sahf", "sse", "sse2", "sse3", "ssse3", "sse4.1",
            "sse4.2", "crc32", "popcnt", "avx", "bmi", "lzcnt", "movbe", "xsave"}
    for name, requires in X86_LEVELS:
        need = {cpuinfo.get(f, f) for f in paths.X86_CPU_FEATURES[name] if f not in base}
        assert need <= set(requires), (name, need - set(requires))
