"""engine.threads: one thread count for numba and BLAS, WARMLLM_THREADS honoured."""

import numba
import pytest

from engine import threads


def test_env_overrides_default(monkeypatch):
    monkeypatch.setenv("WARMLLM_THREADS", "1")
    cfg = threads.configure()
    assert cfg.threads == 1
    assert numba.get_num_threads() == 1
    assert cfg.blas_threads in (None, 1)


def test_argument_wins_over_env_and_default_is_cpu_count(monkeypatch):
    monkeypatch.setenv("WARMLLM_THREADS", "1")
    n = min(2, numba.config.NUMBA_NUM_THREADS)
    assert threads.configure(n).threads == n
    monkeypatch.delenv("WARMLLM_THREADS")
    cfg = threads.configure()
    assert cfg.threads == min(threads.available_cpus(), numba.config.NUMBA_NUM_THREADS)
    assert numba.get_num_threads() == cfg.threads
    assert cfg.numba_layer in ("omp", "tbb", "workqueue")


@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_bad_env_rejected(monkeypatch, bad):
    monkeypatch.setenv("WARMLLM_THREADS", bad)
    with pytest.raises(ValueError, match="WARMLLM_THREADS|>= 1"):
        threads.configure()
