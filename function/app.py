"""Lambda entry point: ``function.app.handler``.

Module scope is Lambda's init phase: point numba at the pre-built kernel cache (before anything
imports numba), then start loading the model into the one ``Runtime`` this process keeps — the
deliberate warm cache that later invocations reuse (``cold: false``). The handler only
translates events to engine calls; see ``function/runtime.py``.
"""
from __future__ import annotations

from . import numba_cache

NUMBA_CACHE = numba_cache.prepare()

import os  # noqa: E402

from .runtime import Runtime  # noqa: E402  (numba's cache directory must be set first)

RUNTIME = Runtime.from_env(os.environ)  # the one place the function's settings are read
RUNTIME.init_extra = NUMBA_CACHE
RUNTIME.start_init()


def handler(event, context):
    return RUNTIME.handle(event, context)


def stream_handler(event, context, stream) -> None:
    """function/stream_runtime.py's entry for invocations through a streaming integration."""
    RUNTIME.handle_stream(event, context, stream)
