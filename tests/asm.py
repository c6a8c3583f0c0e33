"""The assembly numba makes of a kernel, for the tests that check which instructions it uses."""
from __future__ import annotations

import numba


def asm_of(dispatcher) -> list[str]:
    """The assembly of every compiled signature, compiled afresh: numba cannot inspect code it
    loaded from its on-disk cache, so the same Python function is compiled again, uncached, with
    the dispatcher's own options (parallel, fastmath, ...) for the same signatures."""
    assert dispatcher.signatures, f"{dispatcher.__name__} was never compiled"
    options = {k: v for k, v in dispatcher.targetoptions.items() if k not in ("cache", "nopython")}
    fresh = numba.njit(cache=False, **options)(dispatcher.py_func)
    out = []
    for sig in dispatcher.signatures:
        fresh.compile(sig)
        asm = fresh.inspect_asm(sig)
        assert len(asm.splitlines()) > 20, f"{dispatcher.__name__}: no assembly to inspect ({asm[:200]!r})"
        out.append(asm)
    return out
