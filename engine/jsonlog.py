"""The process's one log writer: one JSON object per line on stdout (Lambda sends stdout to
CloudWatch Logs, and Logs Insights queries the fields).

Everything that logs — the request line (function/request_log.py), model downloads, the
snapshot store's background writer — goes through `emit`, so lines from two threads never
interleave and every line is encoded the same way. Code below the edge takes a `LogFn` as a
parameter (defaulting to `log_event`) instead of writing to stdout itself.
"""
from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from typing import Any

LogFn = Callable[..., None]  # log(event, **fields)

_lock = threading.Lock()


def emit(obj: dict) -> None:
    """One JSON object, one line, on stdout."""
    line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)
    with _lock:  # the snapshot writer thread logs while the request thread does
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def log_event(event: str, **fields: Any) -> None:
    """`emit({"event": event, **fields})`: the LogFn the engine uses unless given another."""
    emit({"event": event, **fields})
