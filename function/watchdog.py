"""A log line before Lambda's timeout kills the function.

When Lambda's timeout ends an invocation, the process is frozen or killed mid-request and the
request line is never written; CloudWatch shows only Lambda's own "Task timed out". The watchdog
is a timer per invocation, set ``WATCHDOG_MARGIN_S`` (default 1.0 s) before the remaining time the
context reports; if the request is still running then, it writes a ``timeout`` line naming the
request, its route, the stage it was in and how long it had run (with its own EMF metric
``timeouts``). A request that finishes first cancels it. Generation normally stops well before
(the API deadline, function/deadline.py); what reaches the watchdog is a prefill that cannot be
interrupted, a slow model download or load, or a FunctionTimeout set below the API deadline.
"""
from __future__ import annotations

import threading
import time

from engine.jsonlog import emit

from .emf import Family, emf_block

TIMEOUTS = Family("timeouts", {"timeouts": "Count"}, ("service", "route"))
DEFAULT_MARGIN_S = 1.0


class Watchdog:
    def __init__(self, log, remaining_s: float, margin: float) -> None:
        self.log = log                  # may be attached after start (the request's RequestLog)
        self._t0 = time.monotonic()
        self._remaining_s = remaining_s
        self._timer = threading.Timer(max(0.0, remaining_s - margin), self._fire)
        self._timer.daemon = True
        self._timer.name = "warmllm-watchdog"

    @classmethod
    def start(cls, context, log=None, margin: float = DEFAULT_MARGIN_S) -> Watchdog | None:
        """A running watchdog, or None when the context has no deadline (a local call)."""
        get_ms = getattr(context, "get_remaining_time_in_millis", None)
        if not callable(get_ms):
            return None
        try:
            remaining = float(get_ms()) / 1000.0
        except Exception:
            return None
        w = cls(log, remaining, margin)
        w._timer.start()
        return w

    def cancel(self) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        f = self.log.fields if self.log is not None else {}
        elapsed = time.monotonic() - self._t0
        line = {"event": "timeout", "request_id": f.get("request_id"), "route": f.get("route") or "none",
                "stage": getattr(self.log, "current_stage", None), "elapsed_ms": round(elapsed * 1000.0, 1),
                "remaining_ms": round(max(0.0, self._remaining_s - elapsed) * 1000.0, 1),
                "prompt_tokens": f.get("prompt_tokens"), "max_tokens": f.get("max_tokens"), "timeouts": 1}
        try:
            line.update(emf_block(line, [TIMEOUTS]))
        except Exception as exc:
            line["emf_error"] = f"{type(exc).__name__}: {exc}"
        emit(line)
