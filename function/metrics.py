"""The resident server's Prometheus metrics (/metrics, function/asgi.py), read from the same
request log line Lambda writes (function/request_log.py): one source for CloudWatch and Prometheus.

A registry of its own per server (prometheus_client's default one is process-global): gauges read
the server's queue when scraped; counters add each finished request's line.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily

__all__ = ["ServeMetrics"]


class _BatchCollector:
    """The batch scheduler's counts (engine/batch.py), read when scraped: decode rows / decode
    steps is the mean number of sequences a step decoded."""

    def __init__(self, engine: Callable[[], Any]) -> None:
        self.engine = engine

    def collect(self):
        stats = getattr(getattr(self.engine(), "scheduler", None), "stats", None)
        for name, doc, attr in (("warmllm_decode_steps", "Model steps that decoded at least one sequence",
                                 "decode_steps"),
                                ("warmllm_decode_rows", "Sequences decoded, summed over the steps", "decode_rows"),
                                ("warmllm_prefill_chunks", "Prompt chunks prefilled by the batch", "prefill_chunks")):
            yield CounterMetricFamily(name, doc, value=getattr(stats, attr, 0))


class ServeMetrics:
    def __init__(self, load: Any, engine: Callable[[], Any] = lambda: None) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        r.register(_BatchCollector(engine))
        Gauge("warmllm_queue_depth", "Generations waiting for the engine", registry=r).set_function(
            lambda: load.waiting)
        Gauge("warmllm_active_sequences", "Generations the engine is decoding", registry=r).set_function(
            lambda: load.running)
        self.requests = Counter("warmllm_requests", "Requests answered, by route and HTTP status",
                                ["route", "status"], registry=r)
        self.errors = Counter("warmllm_errors", "Error answers by error code (the OpenAI error's code)",
                              ["code"], registry=r)
        self.refusals = Counter("warmllm_refused", "Requests the server answered before the handler ran "
                                "(queue_full, request_timeout, request_too_large)", ["code"], registry=r)
        self.prompt_tokens = Counter("warmllm_prompt_tokens", "Prompt tokens of generations", registry=r)
        self.prefilled_tokens = Counter("warmllm_prefilled_tokens", "Prompt tokens prefilled (not reused)",
                                        registry=r)
        self.generated = Counter("warmllm_generated_tokens", "Tokens generated", registry=r)
        self.decode_rate = Gauge("warmllm_decode_tokens_per_second", "Decode speed of the last generation",
                                 registry=r)
        self.prefill_modes = Counter("warmllm_prefill", "Generations by prefill path", ["mode"], registry=r)
        self.snapshot_hits = Counter("warmllm_snapshot_hits", "Generations that restored a prefix snapshot, "
                                     "by tier", ["tier"], registry=r)
        self.snapshot_misses = Counter("warmllm_snapshot_misses", "Generations that found no snapshot",
                                       registry=r)

    def observe(self, line: dict) -> None:
        """One finished request's log line."""
        route, status = str(line.get("route") or "none"), int(line.get("status") or 0)
        self.requests.labels(route, str(status)).inc()
        if line.get("error_code"):
            self.errors.labels(str(line["error_code"])).inc()
        mode = line.get("prefill_mode")
        if not mode or mode == "none":
            return
        self.prefill_modes.labels(str(mode)).inc()
        self.prompt_tokens.inc(int(line.get("prompt_tokens") or 0))
        self.prefilled_tokens.inc(int(line.get("prefilled_tokens") or 0))
        self.generated.inc(int(line.get("tokens_out") or 0))
        if line.get("decode_tokens_per_s"):
            self.decode_rate.set(float(line["decode_tokens_per_s"]))
        if line.get("snapshot_tier"):
            self.snapshot_hits.labels(str(line["snapshot_tier"])).inc()
        else:
            self.snapshot_misses.inc()

    def refused(self, code: str) -> None:
        self.refusals.labels(code).inc()
        self.errors.labels(code).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
