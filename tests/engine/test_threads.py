"""engine.threads: one thread count for numba and BLAS, WARMLLM_THREADS honoured."""

import numba
import pytest

from engine import threads
from engine.settings import Settings


def test_warmllm_threads_reaches_configure():
    cfg = threads.configure(Settings.from_env({"WARMLLM_THREADS": "1"}).threads)
    assert cfg.threads == 1
    assert numba.get_num_threads() == 1
    assert cfg.blas_threads in (None, 1)


def test_argument_wins_and_default_is_cpu_count(monkeypatch):
    monkeypatch.setenv("WARMLLM_THREADS", "1")  # the environment is read at the edges only
    n = min(2, numba.config.NUMBA_NUM_THREADS)
    assert threads.configure(n).threads == n
    cfg = threads.configure()
    assert cfg.threads == min(threads.available_cpus(), numba.config.NUMBA_NUM_THREADS)
    assert numba.get_num_threads() == cfg.threads
    assert cfg.numba_layer in ("omp", "tbb", "workqueue")


@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_bad_env_rejected(bad):
    with pytest.raises(ValueError, match="WARMLLM_THREADS=.* is invalid: set it to a whole number >= 1"):
        Settings.from_env({"WARMLLM_THREADS": bad})
    if bad != "many":
        with pytest.raises(ValueError, match=">= 1"):
            threads.configure(int(bad))


_NUMPY_SEES = """
import os, sys
seen = []
class Spy:  # records the environment at the moment numpy (and with it OpenBLAS) is first imported
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not seen:
            seen.append((os.environ.get("OPENBLAS_THREAD_TIMEOUT"), os.environ.get("GOMP_SPINCOUNT")))
        return None
sys.meta_path.insert(0, Spy())
import {module}
print("TIMEOUT", seen[0][0], "SPIN", seen[0][1])
"""


@pytest.mark.parametrize("cache_dir", ["inherited", "fresh"])
@pytest.mark.parametrize("module", ["engine.generate", "engine.cli"])
def test_openblas_thread_timeout_is_set_before_numpy_loads(module, cache_dir, tmp_path):
    """OpenBLAS reads OPENBLAS_THREAD_TIMEOUT once, at load: the engine's entry points must set it
    before their first numpy import, or the setup engine.threads documents is not the one that runs
    (OpenBLAS's own default lets its workers spin ~0.1 s after every product). A user's value wins.
    "fresh": a process started with an unversioned NUMBA_CACHE_DIR (the Makefile's, Lambda's) runs
    the cache versioning, which imports numba and so numpy: until 2026-12-01 that came first and
    the timeout never applied there; the inherited (already versioned) directory skipped it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "GOMP_SPINCOUNT")}
    if cache_dir == "fresh":
        env["NUMBA_CACHE_DIR"] = str(tmp_path)
    code = _NUMPY_SEES.format(module=module)
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert "TIMEOUT 4" in out.stdout, (out.stdout, out.stderr[-2000:])
    # the numba threads' short spin (libgomp reads it at numba's first launch, later still)
    assert f"SPIN {threads._DEFAULT_ENV['GOMP_SPINCOUNT']}" in out.stdout, out.stdout
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**env, "OPENBLAS_THREAD_TIMEOUT": "9"},
                         capture_output=True, text=True, timeout=120)
    assert "TIMEOUT 9" in out.stdout, (out.stdout, out.stderr[-2000:])

