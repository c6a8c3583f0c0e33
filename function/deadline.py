"""When generation must stop, as an absolute ``time.monotonic()`` value for ``Engine.generate``.

Two clocks run out on a request:
  * Lambda's: ``context.get_remaining_time_in_millis()`` (the function timeout);
  * API Gateway's: the HTTP API cuts the connection at 30 s (REST at 29 s) after *it* received
    the request. ``API_DEADLINE_S`` (default 28) counts from the event's ``timeEpoch`` /
    ``requestTimeEpoch`` when the event carries one (so time spent in a cold start counts),
    else from handler entry.
The earlier of the two, less ``DEADLINE_MARGIN_S`` (default 0.5 s) for building and sending the
response, is the deadline. Decoding stops there with ``finish_reason: "length"``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .settings import DEFAULT_API_DEADLINE_S, DEFAULT_MARGIN_S
# an event timestamp further than this from our clock is not trusted (clock skew, replayed events)
MAX_EVENT_AGE_S = 60.0


@dataclass
class Deadline:
    at: float                 # time.monotonic() value
    source: str               # "api" | "lambda"

    def remaining_s(self, now: float | None = None) -> float:
        """Seconds left (admission sets the prefill it would need against them)."""
        return self.at - (time.monotonic() if now is None else now)


def compute(context, received_epoch_ms: int | None, handler_start_mono: float, *,
            api_deadline_s: float = DEFAULT_API_DEADLINE_S, margin_s: float = DEFAULT_MARGIN_S,
            now_mono: float | None = None, now_wall: float | None = None) -> Deadline:
    now_mono = time.monotonic() if now_mono is None else now_mono
    now_wall = time.time() if now_wall is None else now_wall
    api_s, margin = api_deadline_s, margin_s

    api_start = handler_start_mono
    if received_epoch_ms is not None:
        age = now_wall - received_epoch_ms / 1000.0
        if 0.0 <= age <= MAX_EVENT_AGE_S:
            api_start = now_mono - age
    api_at = api_start + api_s

    lambda_at = None
    get_ms = getattr(context, "get_remaining_time_in_millis", None)
    if callable(get_ms):
        try:
            lambda_at = now_mono + float(get_ms()) / 1000.0
        except Exception:
            lambda_at = None
    if lambda_at is not None and lambda_at < api_at:
        return Deadline(lambda_at - margin, "lambda")
    return Deadline(api_at - margin, "api")
