"""Issue 53 (4): what operators get without writing a query. Both templates ship the README's Logs
Insights queries as saved query definitions, a dashboard over the EMF metrics the function really
publishes, and an alarm on failed cold starts -- the same block in each (cfn-lint and
`sam validate --lint` are run on both by test_template_yaml.py and test_deploy_zip.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cfnlint.decode import decode_str

from function.request_log import INIT, REQUEST_COUNTS, REQUEST_TIMINGS
from function.watchdog import TIMEOUTS
from tests.function.test_observability import readme_queries

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ("template.yaml", "template-zip.yaml")
KINDS = ("AWS::Logs::QueryDefinition", "AWS::CloudWatch::Dashboard", "AWS::CloudWatch::Alarm")
PREFILL_MODES = {"batched", "extend", "cached", "snapshot_memory", "snapshot_efs", "snapshot_s3", "none"}


def _load(name: str) -> dict:
    t, errs = decode_str((ROOT / name).read_text())
    assert not errs, errs
    return t


def observability(t: dict) -> dict:
    return {k: v for k, v in t["Resources"].items() if v["Type"] in KINDS}


@pytest.fixture(scope="module")
def tpls() -> dict[str, dict]:
    return {n: _load(n) for n in TEMPLATES}


def test_both_templates_ship_the_same_block(tpls):
    a, b = (observability(tpls[n]) for n in TEMPLATES)
    assert a == b and {v["Type"] for v in a.values()} == set(KINDS)
    for t in tpls.values():
        assert {"DashboardUrl", "InitFailureAlarmName"} <= set(t["Outputs"])


def test_every_readme_query_is_saved_on_its_log_group(tpls):
    defs = [v["Properties"] for v in observability(tpls["template.yaml"]).values()
            if v["Type"] == "AWS::Logs::QueryDefinition"]
    saved = {d["QueryString"].strip(): d["LogGroupNames"] for d in defs}
    queries = readme_queries()
    assert len(queries) >= 6 and sorted(saved) == sorted(queries)
    for q, groups in saved.items():
        want = "ApiAccessLogGroup" if 'event = "api_access"' in q else "FunctionLogGroup"
        assert groups == [{"Ref": want}], q


def _published() -> dict[str, set[tuple[str, ...]]]:
    """metric name -> the dimension sets it is published under (each family's and [service])."""
    out: dict[str, set[tuple[str, ...]]] = {}
    for fam in (INIT, REQUEST_COUNTS, REQUEST_TIMINGS, TIMEOUTS):
        for name in fam.metrics:
            out.setdefault(name, set()).update(tuple(d) for d in fam.dimension_sets())
    return out


def test_the_dashboard_reads_only_metrics_the_function_publishes(tpls):
    body = observability(tpls["template.yaml"])["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    widgets = json.loads(body.replace("${AWS::Region}", "us-east-1"))["widgets"]
    published = _published()
    named, searched = [], []
    for w in widgets:
        for row in w["properties"]["metrics"]:
            if isinstance(row[0], dict):
                expr = row[0]["expression"]
                for dims, metric, rest in re.findall(r"SEARCH\('\{warmllm,([^}]*)\} MetricName=\"(\w+)\"([^']*)'", expr):
                    searched.append((tuple(dims.split(",")), metric))
                    assert set(re.findall(r'prefill_mode="(\w+)"', rest)) <= PREFILL_MODES, expr
            else:
                ns, metric, *dims = row[:-1]
                assert ns == "warmllm" and dims == ["service", "warmllm"], row
                named.append(metric)
    assert {"cold_starts", "init_failures", "ttft_ms", "tokenizer_ms", "kernels_ms", "grammar_ms"} <= set(named)
    for metric in named:
        assert ("service",) in published.get(metric, set()), f"{metric} is not published under [service]"
    assert searched, "the prefill-mode and snapshot widgets search the per-mode metrics"
    for dims, metric in searched:
        assert dims in published.get(metric, set()), (dims, metric)


def test_the_alarm_watches_failed_cold_starts(tpls):
    alarm = observability(tpls["template.yaml"])["InitFailureAlarm"]["Properties"]
    assert alarm["MetricName"] == "init_failures" and "init_failures" in INIT.metrics
    assert alarm["Dimensions"] == [{"Name": "service", "Value": "warmllm"}]
    assert alarm["Statistic"] == "Sum" and alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    env = tpls["template.yaml"]["Resources"]["WarmLlmFunction"]["Properties"]["Environment"]["Variables"]
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == alarm["Namespace"] == "warmllm"
    assert env["POWERTOOLS_SERVICE_NAME"] == "warmllm"
