"""Lambda SnapStart (issue 53): the runtime hooks around the snapshot of an initialized environment.

With SnapStart on (template-zip.yaml, ``SnapStart=Enabled``), Lambda runs the init phase once when
a version is published, snapshots the environment's memory and disk, and starts every new
environment of that version from the snapshot. The hooks are registered when the handler module
is imported (``snapshot_restore_py``, which Lambda's Python 3.12+ managed runtimes include; the
layer does not ship a copy, whose registry the runtime would never read):

- before the snapshot: the model loaded (from memory: ``MODEL_IN_MEMORY``, on in a SnapStart
  init), the tokenizer built, every kernel loaded and run once, llguidance's trie built -- the
  init path -- then the network clients dropped, since a snapshot's open connections are dead
  after a restore;
- after a restore (Lambda gives it and the runtime's own start 10 s, or raises
  ``SnapStartTimeoutException``): every random source re-seeded from the OS, as the snapshot holds
  one state for every environment restored from it; the S3 clients made anew on first use; the
  CPU checked against the kernels' level (a restore may land on another CPU of the architecture:
  the zip deployment compiles for the portable level, ``neoverse-n1`` on arm64, never the
  snapshotting host's own); and an ``init`` line with ``phase: "restore"`` and ``restore_ms``.
"""
from __future__ import annotations

import os
import random
import time
from typing import TYPE_CHECKING

from engine.jsonlog import emit

from .request_log import init_line

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["after_restore", "before_snapshot", "register"]

SNAPSHOT_LOAD_BUDGET_S = 600.0   # SnapStart's init may run up to 15 minutes; the model must be in


def register(runtime: Runtime) -> bool:
    """Register the hooks for ``runtime`` (False where there is no SnapStart library: not Lambda)."""
    try:
        import snapshot_restore_py as srp
    except ImportError:
        return False
    srp.register_before_snapshot(before_snapshot, runtime)
    srp.register_after_restore(after_restore, runtime)
    return True


def before_snapshot(runtime: Runtime) -> None:
    """The snapshot holds a ready engine and no open connection."""
    t0 = time.perf_counter()
    runtime.wait_for_engine(time.monotonic() + SNAPSHOT_LOAD_BUDGET_S)
    runtime.drop_network_clients()
    emit({"event": "snapstart", "hook": "before_snapshot", "ms": round((time.perf_counter() - t0) * 1e3, 1)})


def reseed() -> None:
    """Every process-wide random source from the OS's entropy (numpy's legacy global generator,
    Python's ``random``); per-request samplers already seed from the OS or the request."""
    import numpy as np

    random.seed(os.urandom(32))
    np.random.seed(int.from_bytes(os.urandom(4), "little"))


def after_restore(runtime: Runtime) -> None:
    """Make a restored environment its own: new random state, new clients, the CPU checked."""
    t0 = time.perf_counter()
    reseed()
    runtime.drop_network_clients()
    cpu = runtime.check_cpu()
    line = {"phase": "restore", "restored": True, "restores": 1, "ok": runtime.engine is not None, **cpu,
            "restore_ms": (time.perf_counter() - t0) * 1e3}
    init_line(line)
