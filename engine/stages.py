"""Where a cold start's time goes: named stages that add up to the wall time, and how much of a
stretch of work numba spent compiling or loading kernels.

:class:`StageClock` cuts one span into consecutive stages (``mark("open")`` closes the stage that
began at the previous mark), so the stages of the init line sum to its wall time by construction.
:func:`kernel_work` watches numba's compiler lock: every kernel numba compiles or loads from its
cache takes it, so the time inside it is the kernel stage of a warm-up, and a request that takes it
at all paid for a kernel the warm-up missed.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["KernelWork", "StageClock", "kernel_work"]


@dataclass
class StageClock:
    """Consecutive named stages from the moment the clock is made (or ``start`` given)."""

    start: float = field(default_factory=time.perf_counter)
    stages: dict[str, float] = field(default_factory=dict)
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self._last = self.start

    def mark(self, name: str, at: float | None = None) -> float:
        """Close the stage ``name`` (it ran from the previous mark to now, or to ``at``, a
        ``time.perf_counter()`` taken earlier); its milliseconds. A name marked again adds to its
        stage."""
        now = time.perf_counter() if at is None else at
        ms = (now - self._last) * 1e3
        self.stages[name] = self.stages.get(name, 0.0) + ms
        self._last = now
        return ms

    def mark_parts(self, parts: dict[str, float]) -> None:
        """Close the current stage as ``parts``, measured by whoever ran it (milliseconds per
        name); what they leave of its wall time goes to ``other``, so the sum still holds."""
        now = time.perf_counter()
        rest = (now - self._last) * 1e3 - sum(parts.values())
        for name, ms in {**parts, "other": max(0.0, rest)}.items():
            self.stages[name] = self.stages.get(name, 0.0) + ms
        self._last = now

    @property
    def total_ms(self) -> float:
        return (self._last - self.start) * 1e3


@dataclass
class KernelWork:
    """What numba did inside a :func:`kernel_work` block: wall milliseconds holding its compiler
    lock (compiles and cache loads, nested ones counted once), and how many kernels it compiled."""

    ms: float = 0.0
    entries: int = 0
    compiled: int = 0


@contextlib.contextmanager
def kernel_work() -> Iterator[KernelWork]:
    """Record numba's kernel work (compiles and cache loads) in the block, from every thread."""
    from numba.core import event

    out = KernelWork()
    depth = 0
    began = 0.0

    class _Lock(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            nonlocal depth, began
            if depth == 0:
                began = time.perf_counter()
                out.entries += 1
            depth += 1

        def on_end(self, ev: event.Event) -> None:
            nonlocal depth
            depth -= 1
            if depth == 0:
                out.ms += (time.perf_counter() - began) * 1e3

    class _Compile(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            out.compiled += 1

        def on_end(self, ev: event.Event) -> None:
            pass

    lock, compile_ = _Lock(), _Compile()
    event.register("numba:compiler_lock", lock)
    event.register("numba:compile", compile_)
    try:
        yield out
    finally:
        event.unregister("numba:compiler_lock", lock)
        event.unregister("numba:compile", compile_)
