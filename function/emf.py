"""CloudWatch Embedded Metric Format: the ``_aws`` block that turns a log line's own numeric fields
into metrics.

Each metric *family* has one dimension set, always the same whatever the line (a route with no
generation has ``prefill_mode: "none"``, never a missing dimension), plus the ``[service]``
roll-up, so an error rate per route or for the whole service is one metric, no metric math over
dimension combinations. Written here rather than with Powertools' provider, which serializes one
dimension set per record.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

UNITS = {"Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
         "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
         "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
         "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None"}
MAX_METRICS = 100          # per directive (CloudWatch's EMF limit)
MAX_DIMENSIONS = 30        # per dimension set


@dataclass(frozen=True)
class Family:
    """Metrics (name = log field → unit) published under one dimension set and the service roll-up."""
    name: str
    metrics: dict
    dimensions: tuple          # e.g. ("service", "route"); always starts with "service"

    def dimension_sets(self) -> list[list[str]]:
        sets = [list(self.dimensions)]
        if list(self.dimensions) != ["service"]:
            sets.append(["service"])
        return sets


def disabled(environ=os.environ) -> bool:
    return environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() in ("1", "true")


def service_name(environ=os.environ) -> str:
    return environ.get("POWERTOOLS_SERVICE_NAME", "warmllm")


def emf_block(values: dict, families: list[Family], environ=os.environ) -> dict:
    """``{"_aws": ..., "service": ...}`` for the numeric ``values`` of each family; ``{}`` if disabled
    or nothing to publish. Dimension values are read from ``values`` (they are fields of the line)."""
    if disabled(environ):
        return {}
    root = {**values, "service": service_name(environ)}
    directives = []
    for fam in families:
        metrics = []
        for name, unit in fam.metrics.items():
            if unit not in UNITS:
                raise ValueError(f"metric {name}: unit {unit!r} is not a CloudWatch unit")
            v = root.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                metrics.append({"Name": name, "Unit": unit})
        if not metrics:
            continue
        if len(metrics) > MAX_METRICS or len(fam.dimensions) > MAX_DIMENSIONS:
            raise ValueError(f"metric family {fam.name} exceeds CloudWatch's EMF limits")
        for d in fam.dimensions:
            if not isinstance(root.get(d), str) or not root[d]:
                raise ValueError(f"metric family {fam.name}: dimension {d!r} must be a non-empty string field, "
                                 f"got {root.get(d)!r}")
        directives.append({"Namespace": environ.get("POWERTOOLS_METRICS_NAMESPACE", "warmllm"),
                           "Dimensions": fam.dimension_sets(), "Metrics": metrics})
    if not directives:
        return {}
    return {"_aws": {"Timestamp": int(time.time() * 1000), "CloudWatchMetrics": directives},
            "service": root["service"]}
