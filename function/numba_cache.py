"""Make numba find the kernels the image build compiled, before numba is imported.

numba only uses a cache directory it can write to (its locators create the directory and write a
temporary file in it first), and Lambda's code directory is read-only. So the image build
compiles the kernels into ``WARMLLM_NUMBA_CACHE_SRC`` (``/opt/numba-cache``) and, at cold
start, this copies that tree into ``NUMBA_CACHE_DIR`` (``/tmp/numba-cache``) once — a few MB,
milliseconds. Cache entries are keyed by the source file's absolute path and content hash and by
(target triple, ``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``), so the image sets the same CPU
name at build and run time, with ``NUMBA_CPU_FEATURES`` empty (the CPU's own feature set) so a
build under emulation produces the key a real Graviton looks up.

Without an image cache (the zip deployment with the layer) an arm64 process still compiles for
``neoverse-n1``, the target ``make test-arm64`` proves and the image uses, not for the Graviton
it lands on: numba's LLVM 22.1 miscompiles an SVE dot-product loop at Graviton3's 256-bit vector
length (llvm/llvm-project#204939, docs/arm64.md), and N1 code runs on every Graviton generation.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import time

MARKER = ".warmllm-copied"
CPU_FILE = "cpu.json"
ARM64_CPU = "neoverse-n1"


def prepare(environ=os.environ, machine: str | None = None) -> dict:
    info: dict = {"numba_cache_dir": None, "numba_cache_copied": False, "numba_cache_files": 0}
    dst = environ.get("NUMBA_CACHE_DIR")
    if not dst and environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        dst = "/tmp/numba-cache"               # the only writable place on Lambda
        environ["NUMBA_CACHE_DIR"] = dst
    info["numba_cache_dir"] = dst
    src = environ.get("WARMLLM_NUMBA_CACHE_SRC")
    # the CPU target the image compiled for (cpu.json, written by the Dockerfile): the run must use
    # the same name and features or every cache lookup misses
    target = os.path.join(src, CPU_FILE) if src else None
    if target and os.path.isfile(target):
        try:
            with open(target) as f:
                for k, v in json.load(f).items():
                    if k in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
                        environ.setdefault(k, str(v))
        except (OSError, ValueError):
            pass
    if "NUMBA_CPU_NAME" not in environ and (machine or platform.machine()) in ("aarch64", "arm64"):
        environ["NUMBA_CPU_NAME"] = ARM64_CPU
        environ.setdefault("NUMBA_CPU_FEATURES", "")
    info["numba_cpu_name"] = environ.get("NUMBA_CPU_NAME")
    if not (src and dst and os.path.isdir(src)) or os.path.abspath(src) == os.path.abspath(dst):
        return info
    if os.path.exists(os.path.join(dst, MARKER)):
        return info
    t0 = time.perf_counter()
    n = 0
    for root, _dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        out = os.path.join(dst, rel)
        os.makedirs(out, exist_ok=True)
        for name in files:
            target = os.path.join(out, name)
            if not os.path.exists(target):
                shutil.copy2(os.path.join(root, name), target)
                n += 1

    with open(os.path.join(dst, MARKER), "w") as f:
        f.write(src)
    info.update(numba_cache_copied=True, numba_cache_files=n,
                numba_cache_copy_ms=round((time.perf_counter() - t0) * 1000.0, 1))
    return info
