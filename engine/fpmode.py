"""The engine's subnormal policy: every thread computes with subnormals flushed to zero.

Why: the DeltaNet state decays by e^g per token, so over many chunks its products reach
subnormal magnitudes, and Intel cores take a microcode assist for every subnormal operand or
result (AMD's barely notice). On a 2-core Emerald Rapids VM a 512-token 0.8B prefill took 17.4 s
with subnormals and 5.1 s flushed (issue 21; a Zen 5 ran both at the same speed). Flushing
changes nothing a model can see: the values are below 1.2e-38, against activations of order 1
and a state of order 1e-2.

How: flush-to-zero and denormals-are-zero are per-thread control bits (x86 MXCSR FTZ bit 15 |
DAZ bit 6; arm64 FPCR.FZ bit 24, which flushes inputs and outputs of single and double precision;
FZ16 stays off so f16 block scales still decode exactly). Linux copies them into every thread
a thread creates, so setting them in the importing thread before numpy loads OpenBLAS (which
starts its workers at load) and before numba's pool starts reaches every compute thread: the
main thread, numba's OpenMP workers, `threads.split_over_threads`' workers and OpenBLAS's.
`engine/__init__` calls `flush_subnormals()` first thing; where numpy was imported before the
engine, OpenBLAS's workers predate the policy, so `threads.configure` restarts them
(`restart_blas_threads`) and sets the bits in numba's workers explicitly.

The bits are set by a few instructions JIT-compiled with llvmlite (no numpy, no numba: this runs
before either loads). `WARMLLM_SUBNORMALS=keep` leaves the CPU's default (IEEE gradual
underflow), for comparing against it.
"""
from __future__ import annotations

import ctypes
import os
import platform
from functools import cache
from typing import Any

X86_FTZ, X86_DAZ = 1 << 15, 1 << 6
ARM_FZ = 1 << 24
_X86 = {"x86_64", "AMD64", "i686"}
_ARM = {"aarch64", "arm64"}


def flush_mask() -> int:
    """The control-register bits the policy sets on this machine (0 where it knows none)."""
    m = platform.machine()
    return X86_FTZ | X86_DAZ if m in _X86 else ARM_FZ if m in _ARM else 0


def policy_wanted(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get("WARMLLM_SUBNORMALS", "flush").strip().lower() != "keep"


_IR_X86 = """
declare void @llvm.x86.sse.stmxcsr(ptr)
declare void @llvm.x86.sse.ldmxcsr(ptr)
define i64 @get_mode() {
  %p = alloca i32, align 4
  call void @llvm.x86.sse.stmxcsr(ptr %p)
  %v = load i32, ptr %p
  %w = zext i32 %v to i64
  ret i64 %w
}
define void @or_mode(i64 %bits) {
  %p = alloca i32, align 4
  call void @llvm.x86.sse.stmxcsr(ptr %p)
  %v = load i32, ptr %p
  %b = trunc i64 %bits to i32
  %n = or i32 %v, %b
  store i32 %n, ptr %p
  call void @llvm.x86.sse.ldmxcsr(ptr %p)
  ret void
}
"""

# LLVM's FPCR intrinsics, not inline asm: llvmlite's JIT (and numba's) has no asm parser for
# aarch64 ("Inline asm not supported by this streamer", an abort under make test-arm64)
_IR_ARM = """
declare i64 @llvm.aarch64.get.fpcr()
declare void @llvm.aarch64.set.fpcr(i64)
define i64 @get_mode() {
  %v = call i64 @llvm.aarch64.get.fpcr()
  ret i64 %v
}
define void @or_mode(i64 %bits) {
  %v = call i64 @llvm.aarch64.get.fpcr()
  %n = or i64 %v, %bits
  call void @llvm.aarch64.set.fpcr(i64 %n)
  ret void
}
"""


@cache
def _functions() -> tuple[Any, Any, object] | None:
    """(get_mode, or_mode, the engine that owns their code) for this machine, or None."""
    m = platform.machine()
    ir = _IR_X86 if m in _X86 else _IR_ARM if m in _ARM else None
    if ir is None:
        return None
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple().create_target_machine()
    module = llvm.parse_assembly(ir)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, target)
    engine.finalize_object()
    get_mode = ctypes.CFUNCTYPE(ctypes.c_uint64)(engine.get_function_address("get_mode"))
    or_mode = ctypes.CFUNCTYPE(None, ctypes.c_uint64)(engine.get_function_address("or_mode"))
    return get_mode, or_mode, engine


def thread_mode() -> int:
    """This thread's floating-point control register (MXCSR / FPCR), 0 where unknown."""
    fns = _functions()
    return int(fns[0]()) if fns else 0


def thread_flushes() -> bool:
    """Whether this thread computes with the policy's bits set."""
    mask = flush_mask()
    return mask != 0 and thread_mode() & mask == mask


def flush_subnormals() -> bool:
    """Set flush-to-zero / denormals-are-zero on the calling thread (and so on every thread it
    starts from now on). Returns whether the policy is in force on this thread."""
    fns = _functions()
    if fns is None or not policy_wanted():
        return False
    fns[1](flush_mask())
    return thread_flushes()


def restart_blas_threads() -> bool:
    """Stop OpenBLAS's workers so that its next threaded call starts them again from a thread
    that flushes (a worker copies its creator's control bits). For a process that loaded numpy
    before the engine. Returns whether an OpenBLAS was found and stopped."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - a dependency
        return False
    stopped = False
    for pool in threadpool_info():
        if pool.get("internal_api") != "openblas":
            continue
        try:
            lib = ctypes.CDLL(pool["filepath"])
            lib.blas_thread_shutdown_()
            stopped = True
        except (OSError, AttributeError):
            continue
    return stopped
