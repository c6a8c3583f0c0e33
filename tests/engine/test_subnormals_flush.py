"""The subnormal policy (engine/fpmode.py): every thread that runs engine arithmetic flushes
subnormals to zero — the main thread, numba's workers, split_over_threads' workers and
OpenBLAS's — checked by what each thread computes, in a fresh process per case. A control run
with WARMLLM_SUBNORMALS=keep shows that the same probes see subnormals without the policy."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"),
                                reason="the policy knows x86 MXCSR and arm64 FPCR")

TINY = 1e-39  # an f32 subnormal (the smallest normal is 1.18e-38)

_PROBE = """
import json, sys
{preamble}
import engine
from engine import fpmode, threads
import numba
import numpy as np
from numba import njit, prange

cfg = threads.configure(2)
tiny = np.float32({tiny})
one = np.float32(float(sys.argv[1]))  # at run time, so nothing folds the products away

@njit(parallel=True)
def numba_probe(x, y, n):
    out = np.empty(n, np.float32)
    tid = np.empty(n, np.int64)
    for i in prange(n):
        out[i] = x * y            # a subnormal operand (DAZ)
        out[i] += (x * 1e20) * (y * np.float32(1e-20))  # and a subnormal result (FTZ)
        tid[i] = numba.get_thread_id()
    return out, tid

out, tid = numba_probe(tiny, one, 64)
res = {{"main": bool(fpmode.thread_flushes()),
        "main_product": float((np.float32([tiny]) * one)[0]),
        "numba_nonzero": int(np.count_nonzero(out)), "numba_threads": sorted(set(tid.tolist())),
        "numba_wanted": cfg.threads}}

seen = {{}}
def part(lo, hi):
    import threading
    v = np.full(4, tiny, np.float32) * one
    seen[threading.get_ident()] = (bool(fpmode.thread_flushes()), int(np.count_nonzero(v)))
threads.split_over_threads(part, 4)
res["split"] = sorted(seen.values())

# OpenBLAS's workers: a product big enough to be split over them, A subnormal (DAZ), and
# B scaled so each product is subnormal while the sums would be normal (FTZ)
from threadpoolctl import threadpool_info
res["blas_threads"] = [p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"]
A = np.full((512, 512), tiny, np.float32)
B = np.full((512, 512), one, np.float32)
res["blas_daz_nonzero"] = int(np.count_nonzero(A @ B))
C = np.full((512, 512), np.float32(1e-20), np.float32) * one
res["blas_ftz_nonzero"] = int(np.count_nonzero(C @ C))

# the DeltaNet's chunk products under decays strong enough to make them subnormal: with v = 0
# and e^-1.4 per token, every term of the state carried out of the first chunk is ~e^-89 (1e-39)
from engine.deltanet import gated_delta_chunked
rng = np.random.default_rng(0)
T, H, d = 128, 4, 16
q = rng.standard_normal((T, H, d)).astype(np.float32)
k = rng.standard_normal((T, H, d)).astype(np.float32)
k /= np.linalg.norm(k, axis=-1, keepdims=True)
v = np.zeros((T, H, d), np.float32)
g = np.full((T, H), -1.4, np.float32) * one
beta = np.full((T, H), 0.5, np.float32)
S0 = np.full((H, d, d), 1.0, np.float32)
o, S1, caps = gated_delta_chunked(q, k, v, g, beta, S0, capture=[64])
st = np.concatenate([caps[0].ravel(), S1.ravel(), o.ravel()])
res["deltanet_subnormals"] = int(np.count_nonzero((st != 0) & (np.abs(st) < np.finfo(np.float32).tiny)))
print("RESULT " + json.dumps(res))
"""


def _probe(preamble: str = "", env: dict | None = None) -> dict:
    code = _PROBE.format(preamble=preamble, tiny=TINY)
    r = subprocess.run([sys.executable, "-c", code, "1.0"], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _assert_flushing_everywhere(res: dict) -> None:
    assert res["main"] and res["main_product"] == 0.0
    assert res["numba_nonzero"] == 0, "a numba worker computed with subnormals"
    assert len(res["numba_threads"]) == res["numba_wanted"] >= 1
    assert res["split"] and all(flushes and nz == 0 for flushes, nz in res["split"]), res["split"]
    assert res["blas_daz_nonzero"] == 0, "an OpenBLAS worker took subnormal operands"
    assert res["blas_ftz_nonzero"] == 0, "an OpenBLAS worker produced subnormal results"
    assert res["deltanet_subnormals"] == 0


def test_every_compute_thread_flushes_subnormals():
    _assert_flushing_everywhere(_probe())


def test_policy_reaches_threads_started_before_the_engine():
    """numpy (so OpenBLAS's workers) and numba's pool started before `import engine`: the
    workers predate the policy, and threads.configure must still bring them under it."""
    preamble = ("import numpy as _np, numba as _nb\n"
                "@_nb.njit(parallel=True)\n"
                "def _warm(n):\n"
                "    s = 0.0\n"
                "    for i in _nb.prange(n):\n"
                "        s += i\n"
                "    return s\n"
                "_warm(100); _np.ones((512, 512), _np.float32) @ _np.ones((512, 512), _np.float32)\n")
    _assert_flushing_everywhere(_probe(preamble))


def test_without_the_policy_the_probes_see_subnormals():
    """The control: the probes above can fail (gradual underflow everywhere, as the CPU starts)."""
    res = _probe(env={"WARMLLM_SUBNORMALS": "keep"})
    assert not res["main"] and res["main_product"] != 0.0
    assert res["numba_nonzero"] == 64
    assert all(nz == 4 for _, nz in res["split"])
    assert res["blas_daz_nonzero"] == 512 * 512 and res["blas_ftz_nonzero"] == 512 * 512
    assert res["deltanet_subnormals"] > 0
