"""Inside the emulated arm64 userland, once per CPU target (``make test-arm64``): numba really
compiles for the requested ``NUMBA_CPU_NAME``, and this target's outputs (matvec of every format,
the tiny models' logits and F32 greedy continuations) are recorded to
``$WARMLLM_ARM64_OUT/<target>.npz`` so ``tests/arm64/test_emulated.py`` can compare the targets
with each other and with x86 under stated tolerances."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(platform.machine() not in ("aarch64", "arm64"),
                                reason="runs in the emulated arm64 userland (make test-arm64)")

CPU = os.environ.get("NUMBA_CPU_NAME") or "generic"
TARGET = os.environ.get("WARMLLM_ARM64_TARGET") or CPU  # a level with features of its own has its own name


def test_numba_compiles_for_the_requested_cpu():
    from numba.core.registry import cpu_target

    cg = cpu_target.target_context.codegen()
    assert cg._get_host_cpu_name() == CPU
    assert cg._get_host_cpu_features() == os.environ.get("NUMBA_CPU_FEATURES", cg._get_host_cpu_features())
    assert cg._tm.triple.startswith("aarch64")


def test_record_outputs(model_factory):
    from engine.generate import Engine
    from tests.arm64.outputs import record

    out_dir = os.environ.get("WARMLLM_ARM64_OUT")
    if not out_dir:
        pytest.skip("WARMLLM_ARM64_OUT not set (the runner sets it)")
    data = record(lambda w: Engine.load(str(model_factory("tiny", w)), warm_up=False))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    np.savez(Path(out_dir) / f"{TARGET}.npz", **data)
