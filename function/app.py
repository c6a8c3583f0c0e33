"""Lambda entry point: ``function.app.handler``.

Module scope is Lambda's init phase: point numba at the pre-built kernel cache (before anything
imports numba), then start loading the model into the one ``Runtime`` this process keeps — the
deliberate warm cache that later invocations reuse (``cold: false``). The handler only
translates events to engine calls; see ``function/runtime.py``.
"""
from __future__ import annotations

import time

T0 = time.perf_counter()   # the init line's stages start here and sum to the time until ready

from . import numba_cache  # noqa: E402

NUMBA_CACHE = numba_cache.prepare()
PREPARED = time.perf_counter()

from engine.stages import StageClock  # noqa: E402  (engine reads NUMBA_CACHE_DIR when imported)

CLOCK = StageClock(start=T0)
CLOCK.mark("numba_cache", at=PREPARED)

import os  # noqa: E402

from .runtime import Runtime  # noqa: E402  (numba's cache directory must be set first)

RUNTIME = Runtime.from_env(os.environ)  # the one place the function's settings are read
RUNTIME.init_extra = NUMBA_CACHE
RUNTIME.init_clock = CLOCK
CLOCK.mark("handler")   # the function's own modules and settings
RUNTIME.start_init()

from . import snapstart  # noqa: E402

SNAPSTART_HOOKS = snapstart.register(RUNTIME)   # registered at import, as Lambda requires


def handler(event, context):
    return RUNTIME.handle(event, context)


def stream_handler(event, context, stream) -> None:
    """function/stream_runtime.py's entry for invocations through a streaming integration."""
    RUNTIME.handle_stream(event, context, stream)
