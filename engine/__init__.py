"""warmllm engine: GGUF loading, quant kernels, the Qwen3.5 forward, sessions and generation.

Importable without AWS. Data flows one way: tokens -> session -> forward -> logits -> sampling.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

_CACHE_TAG = "engine-"


def _version_the_kernel_cache() -> None:
    """Give each version of the engine's sources its own numba cache subdirectory.

    numba invalidates a cached kernel when the kernel's own source file changes, not when an
    intrinsic or helper it inlines from another module does (engine/quant/int8_dot.py,
    engine/llvm_ops.py): a persistent NUMBA_CACHE_DIR (the Makefile's .numba_cache, a mounted
    directory) would serve stale machine code after such a change. Runs before any engine
    module defines a cached kernel (numba reads the directory when a kernel is decorated).
    Costs ~2 ms at import (hashing the package's sources).
    """
    base = os.environ.get("NUMBA_CACHE_DIR")
    if not base:
        return
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    tag = _CACHE_TAG + digest.hexdigest()[:12]
    if Path(base).name == tag:  # a child process given the versioned path
        return
    from numba.core import config

    # both: numba re-reads NUMBA_* variables when one changes, and child processes inherit it
    os.environ["NUMBA_CACHE_DIR"] = config.CACHE_DIR = os.path.join(base, tag)


from engine.allocator import keep_freed_memory  # noqa: E402
from engine.fpmode import flush_subnormals  # noqa: E402  (llvmlite only: no numpy, no numba)
from engine.threads import apply_env_defaults  # noqa: E402  (no numpy in engine.threads)

# First of all: OpenBLAS reads its environment once, when numpy loads it, and the cache
# versioning below imports numba, which imports numpy. Run after it (until 2026-12-01), the
# defaults came too late whenever NUMBA_CACHE_DIR was set (the Makefile, Lambda): OpenBLAS kept
# its ~0.1 s spin after every product, measured as 0.10 s of CPU burnt in a 0.3 s sleep after
# one GEMM (0.00 s with the timeout applied).
apply_env_defaults()
# Before numpy starts OpenBLAS's workers and numba its pool, so that they copy the bits
# (engine/fpmode.py: subnormal operands cost Intel cores a microcode assist each).
flush_subnormals()
_version_the_kernel_cache()
keep_freed_memory()
