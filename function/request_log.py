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

import json
import os
import sys
import time
from contextlib import contextmanager

STAGES = ("load_ms", "parse_ms", "template_ms", "tokenize_ms", "restore_ms", "prefill_ms", "decode_ms",
          "respond_ms")
TOLERANCE_MS = 10.0
TOLERANCE_FRAC = 0.03

# metric name (= log field) → CloudWatch unit
REQUEST_METRICS = {
    "total_ms": "Milliseconds", "load_ms": "Milliseconds", "restore_ms": "Milliseconds",
    "prefill_ms": "Milliseconds", "decode_ms": "Milliseconds", "prompt_tokens": "Count",
    "prefilled_tokens": "Count", "reused_tokens": "Count", "tokens_out": "Count",
    "decode_tokens_per_s": "Count/Second", "prefill_tokens_per_s": "Count/Second",
}
INIT_METRICS = {"init_ms": "Milliseconds", "download_ms": "Milliseconds", "load_ms": "Milliseconds",
                "compile_ms": "Milliseconds"}


def emit(obj: dict) -> None:
    """One JSON object, one line, on stdout (Lambda sends stdout to CloudWatch Logs)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


def _round(v):
    return round(v, 2) if isinstance(v, float) else v


def emf_block(values: dict, units: dict[str, str], dimensions: dict[str, str]) -> dict:
    """The ``_aws`` EMF metadata plus dimension values for ``values`` (names → numbers).

    Empty when POWERTOOLS_METRICS_DISABLED is true. Built with Powertools' provider so the
    namespace, units and schema are validated the way Powertools validates them.
    """
    if os.environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() in ("1", "true"):
        return {}
    from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

    provider = AmazonCloudWatchEMFProvider(
        namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "warmllm"),
        service=os.environ.get("POWERTOOLS_SERVICE_NAME", "warmllm"))
    for name, unit in units.items():
        v = values.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            provider.add_metric(name=name, unit=unit, value=v)
    for name, value in dimensions.items():
        provider.add_dimension(name=name, value=str(value))
    if not provider.metric_set:
        return {}
    out = provider.serialize_metric_set()
    # Powertools writes each value as a one-element list; the line keeps the scalar fields.
    return {k: v for k, v in out.items() if k not in units}


class RequestLog:
    """Collects one request's fields and stage timings; ``finish`` prints the line once."""

    def __init__(self, request_id: str, cold: bool, clock=time.perf_counter) -> None:
        self._clock = clock
        self._t0 = clock()
        self._done = False
        self.fields: dict = {
            "event": "request", "request_id": request_id, "kind": None, "route": None, "method": None,
            "path": None, "model": None, "cold": cold, "stream": False, "prefill_mode": None,
            "prompt_tokens": 0, "reused_tokens": 0, "prefilled_tokens": 0,
            **{s: 0.0 for s in STAGES},
            "tokens_out": 0, "max_tokens": None, "finish_reason": None, "deadline_hit": False,
            "snapshot_tier": None, "snapshot_bytes": 0, "status": None, "error_code": None,
        }

    def set(self, **kw) -> None:
        self.fields.update(kw)

    @contextmanager
    def stage(self, name: str):
        assert name in STAGES, name
        t = self._clock()
        try:
            yield
        finally:
            self.fields[name] += (self._clock() - t) * 1000.0

    def add_ms(self, name: str, ms: float) -> None:
        assert name in STAGES, name
        self.fields[name] += float(ms)

    def add_generation(self, result) -> None:
        """Copy the engine's figures from a GenerationResult."""
        f = self.fields
        f["prefill_mode"] = result.prefill_mode
        f["prompt_tokens"] = int(result.prompt_tokens)
        f["reused_tokens"] = int(result.reused_tokens)
        f["prefilled_tokens"] = int(result.prefilled_tokens)
        f["tokens_out"] = int(result.completion_tokens)
        for s in ("tokenize_ms", "restore_ms", "prefill_ms", "decode_ms"):
            f[s] += float(getattr(result, s) or 0.0)
        f["snapshot_tier"] = getattr(result, "snapshot_tier", None)
        f["snapshot_bytes"] = int(getattr(result, "snapshot_bytes", 0) or 0)

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
        dims = {"route": f["route"] or "none"}
        if f["prefill_mode"]:
            dims["prefill_mode"] = f["prefill_mode"]
        units = {k: u for k, u in REQUEST_METRICS.items() if f.get(k) is not None}
        if not f["prefill_mode"]:
            units = {"total_ms": "Milliseconds"}
        units = {**units, "requests": "Count", "errors_4xx": "Count", "errors_5xx": "Count",
                 "cold_start": "Count"}
        values = {**f, "requests": 1, "errors_4xx": int(400 <= status < 500),
                  "errors_5xx": int(status >= 500), "cold_start": int(bool(f["cold"]))}
        line = dict(f)
        try:
            emf = emf_block(values, units, dims)
        except Exception as exc:        # metrics must never break a request
            emf = {}
            line["emf_error"] = f"{type(exc).__name__}: {exc}"
        for k in ("requests", "errors_4xx", "errors_5xx", "cold_start"):
            if emf:
                line[k] = values[k]
        line.update(emf)
        emit(line)
        return line


def init_line(fields: dict) -> dict:
    """The cold-start line: model source, download/load/compile timings, where init finished."""
    line = {"event": "init", **{k: _round(v) for k, v in fields.items()}}
    try:
        line.update(emf_block(line, {k: u for k, u in INIT_METRICS.items() if line.get(k) is not None},
                              {"phase": line.get("phase") or "init"}))
    except Exception as exc:
        line["emf_error"] = f"{type(exc).__name__}: {exc}"
    emit(line)
    return line
