"""pytest plugin for the emulated runs (``-p tests.arm64.plugin``): factory models come from the host.

The llama.cpp fixtures were recorded on factory models built on x86_64, and the parity test checks
the file's sha256. Built under arm64 the factory writes 1-ulp different ``ssm_dt.bias`` values
(float64 ``exp``/``log`` differ between numpy's x86 SIMD and arm64 libm), so the emulated run
would test different bytes. With ``WARMLLM_ARM64_MODELS`` set, ``make_model`` copies the host-built
file for the same (preset, weights, seed, tied) when one exists: arm64 runs the engine on exactly
the bytes llama.cpp saw. The difference itself is recorded by ``tests/arm64/outputs.py``.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def model_name(preset: str, weights: str, seed: int, tied) -> str:
    return f"{preset}-{weights}-{seed}-{'default' if tied is None else ('tied' if tied else 'untied')}.gguf"


def pytest_configure(config):
    src = os.environ.get("WARMLLM_ARM64_MODELS")
    if not src:
        return
    from engine.synthetic import factory

    original = factory.make_model
    if getattr(original, "_from_host", False):
        return

    def make_model(path, preset="tiny", weights="F32", seed=0, tied=None, *a, **k):
        host = Path(src) / model_name(preset, weights, seed, tied)
        if host.exists() and not a and not k:
            shutil.copyfile(host, path)
            return Path(path)
        return original(path, preset, weights, seed, tied, *a, **k)

    make_model._from_host = True
    make_model._original = original
    factory.make_model = make_model
