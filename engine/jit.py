"""One numba kernel, two launch modes: parallel for big work, serial for small.

A `parallel=True` kernel pays a thread-pool hand-off on every call (40–100 µs measured here with
OMP_WAIT_POLICY=PASSIVE, the setting that keeps decode from fighting BLAS). Decode calls ~500
kernels per token on tiny inputs (one token's norm, activation rounding, the 16-row DeltaNet
beta/alpha projections), so on the tiny model 2.1 ms of every layer's 2.1 ms was launch
overhead. `kernel(*args)` below picks the serial twin when the work is small.
"""
from __future__ import annotations

import types
from collections.abc import Callable
from functools import cache
from typing import Any

from numba import njit

# Below this many elements of work a serial call beats a parallel launch.
SERIAL_BELOW = 1 << 16


@cache
def serial_twin(dispatcher: Any) -> Any:
    """A serial njit copy of a `parallel=True` dispatcher (same options otherwise); one per
    dispatcher, so the plans of one format share its compiled twin."""
    fn = dispatcher.py_func
    options = {k: v for k, v in dispatcher.targetoptions.items() if k not in ("parallel", "nopython")}
    # `cache` is not among targetoptions: ask for it explicitly, or every process recompiles the
    # twins (measured: 2.5-8 s of each cold start)
    options["cache"] = True
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__,
                              fn.__closure__)
    twin.__qualname__ = fn.__qualname__ + "_serial"
    twin.__module__ = fn.__module__
    return njit(**options)(twin)


class Kernel:
    """`parallel(*a)` / `serial(*a)` compiled from the same Python function; `__call__(size, *a)`."""

    def __init__(self, fn: Callable, **options: Any) -> None:
        self.parallel = njit(parallel=True, **options)(fn)
        # a distinct qualname keeps the two in separate entries of numba's on-disk cache
        self.serial = serial_twin(self.parallel)
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        _KERNELS.append(self)

    def __call__(self, size: int, *args: Any) -> Any:
        return (self.serial if size < SERIAL_BELOW else self.parallel)(*args)


# Every Kernel, appended once when its module defines it (at import): what warm_twins walks.
_KERNELS: list[Kernel] = []


def warm_twins() -> int:
    """For every kernel that has run in one launch mode, load (or compile) the other for the same
    argument types, without running it: which twin a request takes depends on its size (a long
    prompt's sigmoid over 16 gates per token goes parallel only past 4,096 tokens), and a twin
    first met in a request would load there. Returns how many were loaded."""
    n = 0
    for k in _KERNELS:
        for ran, other in ((k.serial, k.parallel), (k.parallel, k.serial)):
            for sig in list(ran.signatures):
                if sig not in other.signatures:
                    other.compile(sig)
                    n += 1
    return n


# numba's default error model raises ZeroDivisionError, so every float division in a loop carries
# a zero test, and LLVM does not vectorise the loop: SiLU · up over 3584 values (one token's FFN)
# took 11.9 us scalar against 2.2 with `error_model="numpy"` (IEEE inf/nan instead of the raise),
# Zen 3. The kernels here divide by 1 + e^-x, sqrt(.. + eps) and softmax sums: never zero.
_ERROR_MODEL = "numpy"


def kernel(**options: Any) -> Callable[[Callable], Kernel]:
    """Decorator: `@kernel(fastmath=True, cache=True)` over a function that uses `prange`; its
    divisions follow IEEE (`error_model="numpy"`, unless given), so its loops vectorise."""
    return lambda fn: Kernel(fn, **{"error_model": _ERROR_MODEL, **options})
