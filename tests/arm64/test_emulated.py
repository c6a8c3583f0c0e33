"""Host-driven arm64 checks under qemu user-mode (``make test-arm64``; marked slow, so not in ``make test``).

* The CPU targets agree with each other and with x86 within stated tolerances (outputs recorded by
  ``tests/arm64/test_targets.py`` inside each target's emulated run).
* The arm64 layer that ``layers/build.py`` builds imports and runs the engine and the handler in the
  arm64 userland with nothing else on the path.
* The image's kernel cache, built by ``python -m engine warm-kernels`` for ``neoverse-n1`` as the Dockerfile
  does, is loaded by a second emulated process without compiling (numba's cache hit counters).

Skipped, saying why, when the userland is not set up (``python scripts/arm64_userland.py``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from function import numba_cache

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import arm64_userland as U  # noqa: E402

pytestmark = pytest.mark.slow
CACHE = Path(os.environ.get("WARMLLM_ARM64_CACHE", U.DEFAULT_CACHE))
OUT = Path(os.environ.get("WARMLLM_ARM64_OUT", CACHE / "results"))
TARGETS = ["generic", "neoverse-n1", "neoverse-v1", "neoverse-v1-nosve", "neoverse-v2"]  # tests/arm64/run.py's

# Cross-target tolerances. numba's fastmath lets LLVM reassociate and contract (FMA) differently
# per CPU model, and OpenBLAS picks different GEMM kernels per CPU, so float results differ in the
# last bits; the bounds below are what every target must meet against every other and against x86.
MV_RTOL = 4e-5        # |a - b| <= MV_RTOL * sum_j |w_ij x_j|  (2x the 2e-5 each kernel meets vs exact)
F32_LOGITS = 1e-4     # F32 model: max|Δlogit| <= F32_LOGITS * max|logit|  (llama.cpp parity allows 1e-3)
# quantized models: cosine of last-position logits, and argmax identical. The bound is llama.cpp
# parity's (0.999), not tighter: a last-bit difference upstream can flip one Q8_K rounding of an
# activation (a whole quantization step) and the random-weight model amplifies it. Measured
# 2026-12-01 at 9a290ca+ (the factory's new bytes): the targets fall in two clusters, {x86, v1}
# and {generic, n1, v2}, equal to 1e-13 within each; between them 3 of the 4 prompts agree to
# 1e-13 and the 5-token one differs by 1 - cos 2.6e-4 (argmax equal) — an all-or-nothing jump,
# not a spread. (On the earlier bytes the worst was 6.0e-5, and 0.9999 had been set from it.)
# F32 logits, where nothing is rounded to int8, agree to 2.4e-6 and greedy decoding is identical.
QUANT_COSINE = 0.999


def _need_userland():
    if not (CACHE / "root" / "usr" / "bin" / f"python{U.PYTHON}").exists() or not (CACHE / "site").is_dir():
        pytest.skip(f"arm64 userland not set up in {CACHE}: run python scripts/arm64_userland.py (make test-arm64)")
    if not shutil.which(U.QEMU):
        pytest.skip(f"{U.QEMU} not installed (apt-get install qemu-user-static)")


def _emulated(code: str, env: dict, paths: list[Path] | None = None, timeout: int = 1800) -> subprocess.CompletedProcess:
    cmd = ["nice", "-n", "10", *U.python_cmd(CACHE), "-c", code]
    return subprocess.run(cmd, cwd=ROOT, env=U.python_env(CACHE, paths, **env), capture_output=True, text=True,
                          timeout=timeout)


# ----------------------------------------------------------------------------- targets agree

def test_targets_agree_with_each_other_and_with_x86(model_factory):
    from engine.generate import Engine
    from tests.arm64.outputs import WEIGHTS, matvec_cases, record

    runs = {t: dict(np.load(OUT / f"{t}.npz")) for t in TARGETS if (OUT / f"{t}.npz").exists()}
    if not runs:
        pytest.skip(f"no per-target outputs in {OUT}: run python tests/arm64/run.py")
    runs["x86_64 (host)"] = record(lambda w: Engine.load(str(model_factory("tiny", w)), warm_up=False))
    scale = {name: np.abs(W.astype(np.float64)) @ np.abs(x.astype(np.float64))
             for name, _qt, _raw, W, x in matvec_cases()}
    names = list(runs)
    worst: dict[str, float] = {}
    failures = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            A, B = runs[a], runs[b]
            for q, s in scale.items():
                r = float(np.max(np.abs(A[f"mv_{q}"].astype(np.float64) - B[f"mv_{q}"]) / s))
                worst[f"mv_{q}"] = max(worst.get(f"mv_{q}", 0.0), r)
                if r > MV_RTOL:
                    failures.append(f"{a} vs {b}: matvec {q} differs by {r:.2e} of sum|wx| > {MV_RTOL}")
            for w in WEIGHTS:
                la, lb = A[f"logits_{w}"].astype(np.float64), B[f"logits_{w}"].astype(np.float64)
                if w == "F32":
                    r = float(np.max(np.abs(la - lb)) / np.abs(lb).max())
                    worst["logits_F32"] = max(worst.get("logits_F32", 0.0), r)
                    if r > F32_LOGITS:
                        failures.append(f"{a} vs {b}: F32 logits max|Δ| {r:.2e}·max|logit| > {F32_LOGITS}")
                else:
                    cos = min(float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(la, lb))
                    worst[f"1-cos_{w}"] = max(worst.get(f"1-cos_{w}", 0.0), 1 - cos)
                    if cos < QUANT_COSINE or not np.array_equal(la.argmax(1), lb.argmax(1)):
                        failures.append(f"{a} vs {b}: {w} logits cosine {cos:.7f} (bound {QUANT_COSINE}), argmax "
                                        f"{'equal' if np.array_equal(la.argmax(1), lb.argmax(1)) else 'DIFFERS'}")
            if not np.array_equal(A["greedy_F32"], B["greedy_F32"]):
                failures.append(f"{a} vs {b}: F32 greedy continuations differ")
    print(json.dumps({"compared": names, "worst": {k: float(f"{v:.3g}") for k, v in worst.items()}}))
    assert len(runs) >= 2 and not failures, failures


# ----------------------------------------------------------------------------- the layer

def test_arm64_layer_runs_the_engine_and_handler_under_emulation(tmp_path):
    """The layer build (layers/build.py --arch arm64: manylinux aarch64 wheels, slimmed, llvmlite
    stripped) is complete: the arm64 engine imports only from it and answers the chat event.
    Built for CPython 3.11, the arm64 userland's Python (Debian has no arm64 3.12)."""
    _need_userland()
    spec = __import__("importlib.util").util.spec_from_file_location("layer_build", ROOT / "layers" / "build.py")
    build = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(build)
    try:
        report = build.build("arm64", U.PYTHON, CACHE / "layer", do_zip=False)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"layer build failed: {exc}")
    layer = Path(report["path"]) / "python"
    assert not (layer / "numba" / "tests").exists()
    assert any(layer.glob("numpy/_core/_multiarray_umath.cpython-311-aarch64-linux-gnu.so"))
    model = tmp_path / "tiny-Q4_K_M.gguf"
    code = f"""
import json, os, platform, sys
assert platform.machine() == "aarch64"
import numpy, numba, gguf, jinja2, tokenizers
for m in (numpy, numba, gguf, jinja2, tokenizers):
    assert m.__file__.startswith({str(layer)!r}), m.__file__
from engine.synthetic.factory import make_model
make_model({str(model)!r}, "tiny", "Q4_K_M", 0)
os.environ["MODEL_PATH"] = {str(model)!r}
os.environ["POWERTOOLS_METRICS_DISABLED"] = "true"
# the first request waits for the load: under emulation an empty kernel cache compiles for
# minutes, past the 28 s API deadline (the request would be a 503 "still loading")
os.environ["API_DEADLINE_S"] = "1700"
from function.app import handler
r = handler(json.load(open({str(ROOT / "events" / "chat_http_api.json")!r})), None)
assert r["statusCode"] == 200, r
print("LAYER_OK", json.dumps({{"completion_tokens": json.loads(r["body"])["usage"]["completion_tokens"],
                               "numba_cpu": numba.config.CPU_NAME}}))
"""
    r = _emulated(code, {"NUMBA_CPU_NAME": "neoverse-n1", "NUMBA_CPU_FEATURES": "",
                         "NUMBA_CACHE_DIR": str(CACHE / "numba" / "layer")}, paths=[layer, ROOT])
    assert "LAYER_OK" in r.stdout, (r.stdout[-2000:], r.stderr[-4000:])
    print(r.stdout.strip().splitlines()[-1], json.dumps({"layer_mb_unzipped": round(report["slimmed_bytes"] / 1e6, 1)}))


# ----------------------------------------------------------------------------- kernel cache

_STATS = """
import json, sys, numba
from numba.core.registry import CPUDispatcher
hits = misses = 0; kernels = []
for name, mod in list(sys.modules.items()):
    if name.startswith("engine") and mod is not None:
        for k, obj in list(vars(mod).items()):
            if isinstance(obj, CPUDispatcher) and obj.signatures and obj.__module__ == name:
                kernels.append(name + "." + k)
                hits += sum(obj.stats.cache_hits.values()); misses += sum(obj.stats.cache_misses.values())
print("STATS", json.dumps({"kernels": sorted(set(kernels)), "cache_hits": hits, "cache_misses": misses,
                           "cpu": numba.config.CPU_NAME}))
"""


def _stats(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("STATS ")][-1]
    return json.loads(line[len("STATS "):])


def test_second_process_loads_the_neoverse_n1_cache_without_compiling(tmp_path):
    """As the image: build the cache with `python -m engine warm-kernels` for neoverse-n1 (empty features),
    write cpu.json, then a cold start copies it to a fresh NUMBA_CACHE_DIR (function.numba_cache) and
    runs the model: every kernel is a cache hit, none is compiled."""
    _need_userland()
    image, run = tmp_path / "opt-numba-cache", tmp_path / "tmp-numba-cache"
    image.mkdir()
    # what numba_cache.build writes on arm64 (it compiles by starting `python`, which needs binfmt_misc
    # under qemu user-mode: the compile is done here instead, with the same environment)
    (image / "cpu.json").write_text(json.dumps({"levels": [numba_cache.level_spec(numba_cache.ARM64_CPU)]}))
    build_code = "import sys\nfrom engine.cli import main\nmain(['warm-kernels', '--weights', 'Q4_K_M'])\n" + _STATS
    first = _stats(_emulated(build_code, {"NUMBA_CPU_NAME": "neoverse-n1", "NUMBA_CPU_FEATURES": "",
                                          "NUMBA_CACHE_DIR": str(image)}))
    assert first["cache_misses"] > 0, first               # it compiled
    cold_start = f"""
from function import numba_cache
info = numba_cache.prepare()
import json, time, numba
assert numba.config.CPU_NAME == "neoverse-n1", numba.config.CPU_NAME   # taken from the image's cpu.json
from engine.generate import Engine, SamplingParams
from engine.synthetic.factory import make_model
p = make_model({str(tmp_path / 'm.gguf')!r}, "tiny", "Q4_K_M", 0)
t0 = time.perf_counter()
e = Engine.load(str(p))
e.generate("warm the kernels " * 40, max_tokens=3, sampling=SamplingParams(temperature=0.0))
print("COLD", json.dumps({{"compile_ms": e.compile_ms, "load_generate_ms": (time.perf_counter() - t0) * 1e3,
                          "copied_files": info["numba_cache_files"]}}))
""" + _STATS
    r = _emulated(cold_start, {"NUMBA_CACHE_DIR": str(run), "WARMLLM_NUMBA_CACHE_SRC": str(image),
                               "NUMBA_DEBUG_CACHE": "1"})
    second = _stats(r)
    cold = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("COLD ")][-1][5:])
    saved = [ln for ln in r.stdout.splitlines() if "data saved" in ln]
    print(json.dumps({"first": {k: first[k] for k in ("cache_hits", "cache_misses")},
                      "second": {k: second[k] for k in ("cache_hits", "cache_misses")}, **cold}))
    assert cold["copied_files"] > 0
    assert second["cpu"] == "neoverse-n1"
    assert second["kernels"] and second["cache_hits"] > 0, second
    assert second["cache_misses"] == 0 and not saved, (second, saved[:3])


def test_factory_writes_the_same_bytes_on_arm64():
    """Not required for the engine (the emulated runs use host-built models, see tests/arm64/plugin.py),
    but the factory promises "same arguments → byte-identical file": recorded per target, compared here."""
    from tests.arm64.outputs import WEIGHTS, factory_sha256

    runs = {t: dict(np.load(OUT / f"{t}.npz")) for t in TARGETS if (OUT / f"{t}.npz").exists()}
    if not runs:
        pytest.skip(f"no per-target outputs in {OUT}: run python tests/arm64/run.py")
    host = {w: factory_sha256(w) for w in WEIGHTS}
    differ = [f"{t} {w}" for t, r in runs.items() for w in WEIGHTS if str(r[f"factory_sha256_{w}"]) != host[w]]
    if differ:
        pytest.xfail("factory output differs on arm64 (1-ulp ssm_dt.bias from float64 exp/log/expm1): "
                     + ", ".join(differ))
