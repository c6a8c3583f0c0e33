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


def _line(obj: dict) -> str:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:      # a lone surrogate (a hostile path or header): escape it as \udXXX
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), default=str)
    return text


def emit(obj: dict) -> None:
    """One JSON object, one line, on stdout. Never raises: a log line must not turn a request
    into an error (a value that cannot be serialised leaves a line that says so, with the
    event name)."""
    try:
        line = _line(obj)
    except Exception as exc:        # e.g. a circular value, or a default=str that raises
        line = json.dumps({"event": str(obj.get("event", "unknown")) if isinstance(obj, dict) else "unknown",
                           "log_error": f"{type(exc).__name__}: {exc}"}, ensure_ascii=True)
    with _lock:  # the snapshot writer thread logs while the request thread does
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except Exception:           # stdout closed or unwritable: nowhere left to say it
            pass


def log_event(event: str, **fields: Any) -> None:
    """`emit({"event": event, **fields})`: the LogFn the engine uses unless given another."""
    emit({"event": event, **fields})
