"""The one place that configures threads for numba kernels and BLAS.

``configure(threads=None)`` picks the thread count (argument — ``Settings.threads``, from
``WARMLLM_THREADS`` at the edge — else the CPUs this process may run on), sets numba's count and caps the BLAS pool (threadpoolctl) to the
same number so prefill (numba dequant -> BLAS GEMM) and decode (numba matvec) share N cores.

Chosen setup (applied before the first parallel kernel launch; env vars already set win):

* numba threading layer ``omp`` (GNU OpenMP; ``tbb`` is not installed here and ``workqueue``
  pays ~100 us per launch, see below), with ``OMP_WAIT_POLICY=PASSIVE`` and a short spin,
  ``GOMP_SPINCOUNT`` (5000 on x86_64, ``_SPIN``): an idle numba thread waits ~0.1 ms for the next
  launch, then sleeps, so it does not take a core from OpenBLAS during a prefill GEMM. Decode
  launches ~190 kernels per token ~20-50 us apart: with no spin every launch paid a wake-up.
  Measured 2026-12-01 (0.8B Q4_K_M, AVX-512 host, 2 threads, ``python -m engine bench -p 512
  -n 64``, two rounds per value): tg 40.0-40.7 tok/s with no spin, 50-55 at 2000, 58.7-61.6 at
  5000, 57.3-64.1 at 10000, 54-58 at 20000; pp512 stayed at 270-312 tok/s up to 20000 and fell
  to 229 at 100000 and 150-159 at 1000000 (the spinning threads take BLAS's core);
* ``OPENBLAS_THREAD_TIMEOUT=4`` (OpenBLAS workers stop spinning almost at once). OpenBLAS reads
  it once, when numpy loads it, so ``import engine`` sets these defaults (``apply_env_defaults``)
  before anything imports numpy — numba included, which the kernel-cache versioning imports;
  a program that imports numpy before the engine keeps OpenBLAS's default (workers spin for
  ~2^28 cycles, ~0.1 s, after every product: 0.10 s of CPU burnt in a 0.3 s sleep after one
  GEMM). Until 2026-12-01 the defaults were applied after numpy had loaded, so the timeout never
  applied and the earlier measurements of spinning (below) were taken with OpenBLAS spinning too;
* BLAS threads = numba threads = N; runs of many small products split over Python threads with
  one-thread BLAS each (``split_over_threads``).

Earlier (before the timeout applied), on the 2-core build machine (``/tmp``-style alternating experiment: numba Q4_K matvec
64x256 launches, and matvec + a 64x256x256 GEMM alternating; median over 2000/500 calls). The
host was heavily oversubscribed while measuring (load average 6-9 from a parallel C++ build on
2 cores), so the numbers show the hazard more than the Lambda steady state:

=============================================  ===========  ==================
numba layer / env                              launch (us)  matvec+GEMM (us)
=============================================  ===========  ==================
omp, defaults (active spin)                    15990        60294
omp, OMP_WAIT_POLICY=PASSIVE                   29           31993 / 11999 [1]
omp, GOMP_SPINCOUNT=20000                      1355 / 9.7   32003 / 15970 [1]
workqueue                                      101          340 / 16004 [1]
=============================================  ===========  ==================

[1] second figure: same run with ``OPENBLAS_THREAD_TIMEOUT=4``. Alternating times are dominated
by 4-16 ms scheduler slices on the oversubscribed host and varied between runs; the robust
findings are (a) default spinning OpenMP is catastrophic whenever cores are shared (16 ms per
launch), (b) PASSIVE keeps a launch near 30 us, (c) workqueue launches cost ~3x more.
Dequantize 3 x (3584x1024 Q4_K) then GEMM with 64 rows each, same session: omp default 320 ms,
omp PASSIVE 204 ms, workqueue 128 ms; BLAS threads 1 vs 2 under that load: 67 vs 204 ms.
Re-measure on a quiet machine / on Lambda with ``python -m engine.threads`` (prints both).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

# libgomp's spin before an idle numba thread sleeps, in loop iterations: a `pause` (~65-140
# cycles) on x86_64, a compiler barrier (~1-2 ns) on arm64, so arm64 gets 20x the count for about
# the same ~0.1-0.3 ms window (not measured on a Graviton: emulation says nothing about timing).
_SPIN = {"x86_64": "5000", "AMD64": "5000", "aarch64": "100000", "arm64": "100000"}
_DEFAULT_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "OPENBLAS_THREAD_TIMEOUT": "4",
    "GOMP_SPINCOUNT": _SPIN.get(platform.machine(), "5000"),
}
_DEFAULT_LAYER = "omp"
_blas_limiter = None  # keeps the threadpoolctl limit object alive


@dataclass(frozen=True)
class ThreadConfig:
    threads: int
    numba_layer: str
    blas_threads: int | None  # None when no BLAS pool was found


def available_cpus() -> int:
    """CPUs this process may run on (affinity mask when the OS exposes it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _requested(threads: int | None) -> int:
    threads = available_cpus() if threads is None else int(threads)
    if threads < 1:
        raise ValueError(f"thread count must be >= 1, got {threads}")
    return threads


def apply_env_defaults() -> None:
    """The thread environment of the module docstring, where the user has not set it; to take
    effect it must run before numpy loads OpenBLAS (``engine/__init__.py`` calls it)."""
    for key, value in _DEFAULT_ENV.items():
        os.environ.setdefault(key, value)


def configure(threads: int | None = None) -> ThreadConfig:
    """Set numba's and BLAS's thread counts to one value (see module docstring for the setup)."""
    global _blas_limiter
    n = _requested(threads)
    apply_env_defaults()  # OMP_WAIT_POLICY still counts here: libgomp loads at numba's first launch

    import numba
    from numba.np.ufunc import parallel as _parallel

    if not getattr(_parallel, "_is_initialized", False):
        # the layer can only be chosen before the first parallel launch
        if not os.environ.get("NUMBA_THREADING_LAYER"):
            numba.config.THREADING_LAYER = _DEFAULT_LAYER
    n_numba = min(n, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(n_numba)
    try:
        layer = numba.threading_layer()
    except ValueError:  # not launched yet: report what will be used
        layer = numba.config.THREADING_LAYER

    _subnormal_policy_everywhere(n_numba)

    blas = None
    try:
        from threadpoolctl import threadpool_limits, threadpool_info

        _blas_limiter = threadpool_limits(limits=n, user_api="blas")
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        blas = pools[0]["num_threads"] if pools else None
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency of dev/bench
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(n))
    return ThreadConfig(threads=n_numba, numba_layer=str(layer), blas_threads=blas)


def _subnormal_policy_everywhere(n_numba: int) -> None:
    """engine/fpmode.py's policy in threads that may predate it: numba's workers get the bits
    set in place; OpenBLAS's are restarted, to be started again by a thread that has them (both
    only exist early when the program used numpy or numba before importing the engine)."""
    from engine import fpmode

    if not fpmode.policy_wanted() or not fpmode.flush_mask():
        return
    fpmode.flush_subnormals()
    from engine.llvm_ops import fp_control_or_in_workers

    fp_control_or_in_workers(fpmode.flush_mask(), 4 * n_numba)
    fpmode.restart_blas_threads()


_controller = None
_pool: ThreadPoolExecutor | None = None  # worker threads for split_over_threads, made on first use and kept (the warm process reuses them)
_pool_size = 0


def split_over_threads(fn: Callable[[int, int], None], n_items: int) -> None:
    """Run ``fn(lo, hi)`` over contiguous parts of ``range(n_items)``, one part per configured
    thread (numba's count), each calling BLAS on one thread: for runs of many small products
    (the DeltaNet chunk loop, 16 heads of 64x128x128 per step). A BLAS pool of 2 threads paid a
    hand-off per product (180 ms vs 27-47 ms per 512-token layer on one thread); one thread left
    the second core idle; two Python threads of 8 heads each (numpy releases the GIL in matmul)
    measured 3.1 vs 5.9 ms for a 512-token chunk loop of the 0.8B model (AVX-512 host, 2 cores)."""
    global _controller, _pool, _pool_size
    import numba

    parts = max(1, min(numba.get_num_threads(), n_items))
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    bounds = [(n_items * i // parts, n_items * (i + 1) // parts) for i in range(parts)]
    with _controller.limit(limits=1, user_api="blas"):
        if parts == 1:
            fn(0, n_items)
            return
        if _pool_size < parts - 1:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(max_workers=parts - 1, thread_name_prefix="warmllm-split")
            _pool_size = parts - 1
        assert _pool is not None
        futures = [_pool.submit(fn, lo, hi) for lo, hi in bounds[1:]]
        fn(*bounds[0])
        for f in futures:
            f.result()


def _experiment() -> None:  # pragma: no cover - manual measurement helper
    import time

    import numpy as np
    from gguf import GGMLQuantizationType as T

    from engine.quant import kernels as K

    cfg = configure()
    W = K._bench_weights(T.Q4_K, 64, 256)
    x = np.ones(256, np.float32)
    o = np.empty(64, np.float32)
    A = np.ones((64, 256), np.float32)
    B = np.ones((256, 256), np.float32)
    K.matvec(T.Q4_K, W, x, o)
    A @ B

    def med(f, n):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts)) * 1e6

    def alt():
        K.matvec(T.Q4_K, W, x, o)
        A @ B

    print(cfg, f"launch {med(lambda: K.matvec(T.Q4_K, W, x, o), 2000):.1f} us, "
               f"matvec+gemm {med(alt, 500):.1f} us")


if __name__ == "__main__":  # pragma: no cover
    _experiment()
