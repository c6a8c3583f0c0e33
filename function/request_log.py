"""The one JSON line per request, its CloudWatch metrics (EMF), and the cold-start init line.

The request line *is* the Embedded Metric Format record: the metric values are the same
top-level fields a reader queries in Logs Insights (``prefill_ms``, ``decode_ms``…), and the
``_aws`` block (built with Powertools' EMF provider) tells CloudWatch which of them are metrics
and which fields (``route``, ``prefill_mode``) are dimensions. One place, one line.

Stage fields, in order, are measured back to back and do not overlap::

    load_ms      waiting for the model (cold start that spilled past Lambda's init phase)
    parse_ms     event normalisation, JSON and field validation
    template_ms  chat template rendering
    tokenize_ms  \
    restore_ms    |  reported by the engine for its generate() call
    prefill_ms    |
    decode_ms    /
    respond_ms   output parsing (reasoning, tool calls), response/SSE building and serialisation

``total_ms`` is measured separately, handler entry to the log line. ``unaccounted_ms`` =
total − Σ stages is printed so a gap is visible; it is within ``TOLERANCE_MS`` +
``TOLERANCE_FRAC`` × total (tests enforce it).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from engine.jsonlog import emit

from .emf import Family, emf_block

if TYPE_CHECKING:  # the engine loads in the init thread, never at import (cold start)
    from engine.generate import GenerationResult

STAGES = ("load_ms", "parse_ms", "template_ms", "tokenize_ms", "restore_ms", "prefill_ms", "decode_ms",
          "respond_ms")
TOLERANCE_MS = 10.0
TOLERANCE_FRAC = 0.03

# The metric families (metric name = log field → CloudWatch unit), each with one dimension set and
# the [service] roll-up (function/emf.py). Counts are per route; timings and token rates per route
# and prefill path ("none" when no generation ran, so the set never changes).
REQUEST_COUNTS = Family("request_counts", {
    "requests": "Count", "errors_4xx": "Count", "errors_5xx": "Count", "cold_start": "Count",
    "deadline_hit_n": "Count"}, ("service", "route"))
REQUEST_TIMINGS = Family("request_timings", {
    "total_ms": "Milliseconds", "load_ms": "Milliseconds", "restore_ms": "Milliseconds",
    "prefill_ms": "Milliseconds", "decode_ms": "Milliseconds", "prompt_tokens": "Count",
    "prefilled_tokens": "Count", "reused_tokens": "Count", "tokens_out": "Count",
    "decode_tokens_per_s": "Count/Second", "prefill_tokens_per_s": "Count/Second", "ttft_ms": "Milliseconds",
}, ("service", "route", "prefill_mode"))
INIT = Family("init", {"init_ms": "Milliseconds", "download_ms": "Milliseconds", "load_ms": "Milliseconds",
                       "compile_ms": "Milliseconds", "cold_starts": "Count", "init_failures": "Count",
                       # the stages that vary between cold starts (engine/stages.py; all are in the line)
                       "import_ms": "Milliseconds", "threads_ms": "Milliseconds", "open_ms": "Milliseconds",
                       "tokenizer_ms": "Milliseconds", "kernels_ms": "Milliseconds", "warmup_ms": "Milliseconds",
                       "grammar_ms": "Milliseconds",
                       # SnapStart (function/snapstart.py): environments restored from a snapshot
                       "restores": "Count", "restore_ms": "Milliseconds"},
              ("service", "phase"))
NO_PREFILL = "none"        # prefill_mode of a request that generated nothing (health, models, errors)


def _round(v):
    return round(v, 2) if isinstance(v, float) else v


class RequestLog:
    """Collects one request's fields and stage timings; ``finish`` prints the line once."""

    def __init__(self, request_id: str, cold: bool, clock=time.perf_counter,
                 observers: Sequence[Callable[[dict], None]] = ()) -> None:
        self._clock = clock
        self._observers = observers     # e.g. the resident server's Prometheus counters (function/metrics.py)
        self._t0 = clock()
        self._done = False
        self.current_stage: str | None = None       # for the timeout watchdog's line
        self.fields: dict = {
            "event": "request", "request_id": request_id, "kind": None, "route": None, "method": None,
            "path": None, "model": None, "cold": cold, "stream": False, "prefill_mode": NO_PREFILL,
            "prompt_tokens": 0, "reused_tokens": 0, "prefilled_tokens": 0,
            **{s: 0.0 for s in STAGES},
            "tokens_out": 0, "max_tokens": None, "finish_reason": None, "deadline_hit": False, "deadline_hit_n": 0,
            "snapshot_tier": None, "snapshot_bytes": 0, "status": None, "error_code": None,
            "ttft_ms": None,
        }

    def set(self, **kw) -> None:
        self.fields.update(kw)

    @contextmanager
    def stage(self, name: str):
        assert name in STAGES, name
        t = self._clock()
        self.current_stage = name
        try:
            yield
        finally:
            self.fields[name] += (self._clock() - t) * 1000.0
            self.current_stage = None

    def mark_ttft(self) -> None:
        """Time to first token: handler entry to the first piece of generated text (not a stage:
        it overlaps them; on a stream it is when the first content chunk went out)."""
        if self.fields["ttft_ms"] is None:
            self.fields["ttft_ms"] = (self._clock() - self._t0) * 1000.0

    def add_ms(self, name: str, ms: float) -> None:
        assert name in STAGES, name
        self.fields[name] += float(ms)

    def add_generation(self, result: GenerationResult) -> None:
        """The engine's figures from a GenerationResult and the prefill it holds."""
        f = self.fields
        pre = result.prefill
        f["prefill_mode"] = pre.mode
        f["prompt_tokens"] = result.prompt_tokens
        f["reused_tokens"] = pre.reused_tokens
        f["prefilled_tokens"] = pre.prefilled_tokens
        f["tokens_out"] = result.completion_tokens
        f["max_tokens"] = result.max_tokens
        f["deadline_hit"] = result.deadline_hit
        f["tokenize_ms"] += result.tokenize_ms
        f["restore_ms"] += pre.restore_ms
        f["prefill_ms"] += pre.prefill_ms
        f["decode_ms"] += result.decode_ms
        f["snapshot_tier"] = pre.snapshot_tier
        f["snapshot_bytes"] = pre.snapshot_or_checkpoint_bytes
        g = result.grammar_timings
        if "grammar_ms" in g:   # a constrained request: compile (inside tokenize_ms) and mask cost
            f["grammar_ms"] = g["grammar_ms"]
            f["mask_ms"] = g.get("mask_ms", 0.0)
            f["masked_steps"] = int(g.get("masked_steps", 0))

    def finish(self, status: int, error_code: str | None = None) -> dict:
        """Compute totals, print the line (once) and return it."""
        if self._done:
            return self.fields
        self._done = True
        f = self.fields
        f["status"] = status
        f["error_code"] = error_code
        f["total_ms"] = (self._clock() - self._t0) * 1000.0
        f["unaccounted_ms"] = f["total_ms"] - sum(f[s] for s in STAGES)
        f["decode_tokens_per_s"] = (f["tokens_out"] / f["decode_ms"] * 1000.0) if f["decode_ms"] > 0 else None
        f["prefill_tokens_per_s"] = ((f["prefilled_tokens"] / f["prefill_ms"] * 1000.0)
                                     if f["prefill_ms"] > 0 and f["prefilled_tokens"] else None)
        for k, v in list(f.items()):
            f[k] = _round(v)
        # numeric twins: Logs Insights' sum() and CloudWatch metrics cannot add JSON booleans
        f["deadline_hit_n"] = int(bool(f["deadline_hit"]))
        f.update(requests=1, errors_4xx=int(400 <= status < 500), errors_5xx=int(status >= 500),
                 cold_start=int(bool(f["cold"])))
        f["route"] = f["route"] or "none"           # a dimension: always a string
        line = dict(f)
        # a request that generated nothing publishes its total time only: its zero prefill/decode
        # figures would drag the [service] roll-up of the generation metrics down
        values = line if f["prefill_mode"] != NO_PREFILL else {
            k: v for k, v in line.items() if k not in REQUEST_TIMINGS.metrics or k == "total_ms"}
        try:
            emf = emf_block(values, [REQUEST_COUNTS, REQUEST_TIMINGS])
        except Exception as exc:        # metrics must never break a request
            emf = {}
            line["emf_error"] = f"{type(exc).__name__}: {exc}"
        line.update(emf)
        emit(line)
        for observe in self._observers:
            try:
                observe(line)
            except Exception as exc:        # an observer must never break a request either
                emit({"event": "observer_error", "request_id": line["request_id"],
                      "error": f"{type(exc).__name__}: {exc}"})
        return line


def init_line(fields: dict) -> dict:
    """The cold-start line: model source, download/load/compile timings, where init finished."""
    line = {"event": "init", **{k: _round(v) for k, v in fields.items()}}
    line.setdefault("phase", "init")
    line.update(cold_starts=1, init_failures=int(not line.get("ok", True)))
    try:
        line.update(emf_block(line, [INIT]))
    except Exception as exc:
        line["emf_error"] = f"{type(exc).__name__}: {exc}"
    emit(line)
    return line
