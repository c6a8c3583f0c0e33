"""What an operator queries: a `timeout` line before Lambda's deadline kills a request, the
README's Logs Insights queries use only fields the function really writes (numbers where they
add or average), and the API Gateway access-log format is JSON that joins the function's lines."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from cfnlint.decode import decode_str

from function.runtime import Runtime
from function.watchdog import Watchdog

ROOT = Path(__file__).resolve().parents[2]


class Ctx:
    def __init__(self, remaining_ms: int, rid: str = "req-wd"):
        self.aws_request_id = rid
        self._end = time.monotonic() + remaining_ms / 1000.0

    def get_remaining_time_in_millis(self):
        return int((self._end - time.monotonic()) * 1000)


def event(name: str) -> dict:
    return json.loads((ROOT / "events" / name).read_text())


def out_lines(capsys) -> list[dict]:
    return [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


@pytest.fixture(scope="module")
def runtime(tiny_model_path):
    r = Runtime.from_env({**os.environ, "MODEL_PATH": str(tiny_model_path), "WATCHDOG_MARGIN_S": "0.8"})
    r.start_init(budget_s=600)
    assert r.engine is not None
    return r


def test_a_request_still_running_near_lambdas_timeout_writes_a_timeout_line(runtime, capsys, monkeypatch):
    real = runtime.wait_for_engine

    def slow(until):                  # a load that outlives the function's remaining time
        time.sleep(1.2)
        return real(until)
    monkeypatch.setattr(runtime, "wait_for_engine", slow)
    capsys.readouterr()
    runtime.handle(event("chat_http_api.json"), Ctx(remaining_ms=1500))
    got = out_lines(capsys)
    (t,) = [x for x in got if x["event"] == "timeout"]
    assert t["request_id"] == "req-wd" and t["route"] == "chat" and t["stage"] == "load_ms"
    assert 500 <= t["elapsed_ms"] <= 1200 and t["timeouts"] == 1
    cw = t["_aws"]["CloudWatchMetrics"][0]
    assert cw["Dimensions"] == [["service", "route"], ["service"]] and cw["Metrics"][0]["Name"] == "timeouts"
    assert got.index(t) < [x["event"] for x in got].index("request")     # written before the request ended


def test_a_request_that_ends_in_time_cancels_its_watchdog(runtime, capsys):
    capsys.readouterr()
    runtime.handle(event("models.json"), Ctx(remaining_ms=1000))
    time.sleep(0.5)                                   # past when the timer would have fired (0.2 s)
    assert [x["event"] for x in out_lines(capsys)] == ["request"]
    assert Watchdog.start(object(), None) is None       # no deadline in the context: no watchdog


# ------------------------------------------------------------------------------ Logs Insights

KEYWORDS = {"filter", "stats", "by", "as", "and", "or", "not", "in", "like", "fields", "sort", "desc", "asc",
            "limit", "display", "parse", "dedup", "true", "false"}


def readme_queries() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## CloudWatch Logs Insights queries", 1)[1].split("\n## ", 1)[0]
    return [q.strip() for q in re.findall(r"```\n(.*?)```", section, re.S)]


def access_line(fmt: str) -> dict:
    """An access-log line as API Gateway writes it: quoted variables may be "-", unquoted ones are numbers."""
    return json.loads(re.sub(r"\$context\.[A-Za-z.]+", "504", re.sub(r'"\$context\.[A-Za-z.]+"', '"-"', fmt)))


def emitted(runtime, capsys) -> dict[str, dict]:
    """event type → {field: an example value} over real lines of that type."""
    from function.request_log import init_line
    capsys.readouterr()
    runtime.handle(event("chat_http_api.json"), Ctx(60_000))
    runtime.handle(event("health.json"), Ctx(60_000))
    runtime.handle(event("bad_json.json"), Ctx(60_000))
    init_line({"phase": "init", "ok": True, "load_ms": 1.0, "compile_ms": 2.0, "download_ms": 0.0, "init_ms": 3.0})
    from function.request_log import RequestLog
    log = RequestLog("r", cold=False)
    log.set(route="chat")
    with log.stage("prefill_ms"):
        Watchdog(log, remaining_s=1.0, margin=1.0)._fire()      # the line it writes, without waiting
    lines = out_lines(capsys)
    t, _ = decode_str((ROOT / "template.yaml").read_text())
    fmt = t["Resources"]["HttpApi"]["Properties"]["AccessLogSettings"]["Format"]
    lines.append(access_line(fmt))
    fields: dict[str, dict] = {}
    for line in lines:                  # a value some line of that type has (a chat's, not a health check's None)
        known = fields.setdefault(line["event"], {})
        for k, v in line.items():
            if known.get(k) is None:
                known[k] = v
    return fields


def query_fields(q: str) -> tuple[str, set[str], set[str], set[str], set[str]]:
    """(event, fields used, aliases, fields under sum/avg/pct, group-by fields) of one query."""
    ev = re.search(r'event\s*=\s*"(\w+)"', q)
    no_strings = re.sub(r'"[^"]*"', '""', q)
    aliases = set(re.findall(r"\bas\s+(\w+)", no_strings))
    numeric = set(re.findall(r"\b(?:sum|avg|pct|min|max)\(\s*([A-Za-z_]\w*)", no_strings))
    by = set()
    for clause in re.findall(r"\bby\s+([^|]+)", no_strings):
        by |= {w for w in re.findall(r"[A-Za-z_]\w*", re.sub(r"\w+\([^)]*\)", "", clause))}
    used = set()
    for m in re.finditer(r"(@?[A-Za-z_][\w.]*)(\s*\()?", no_strings):
        word, call = m.group(1), m.group(2)
        if call or word.startswith("@") or word in KEYWORDS or word in aliases or re.fullmatch(r"\d+\w*", word):
            continue
        used.add(word)
    # bin(1h) and pct(x, 95): the unit and percent are no fields
    used -= {"h", "m", "s", "d"}
    return (ev.group(1) if ev else ""), used, aliases, numeric, by


def test_readme_queries_use_only_emitted_fields(runtime, capsys):
    fields = emitted(runtime, capsys)
    queries = readme_queries()
    assert len(queries) >= 6
    seen_events = set()
    for q in queries:
        ev, used, aliases, numeric, by = query_fields(q)
        assert ev in fields, f"query filters on event {ev!r}, which no line has:\n{q}"
        seen_events.add(ev)
        known = fields[ev]
        missing = sorted(u for u in used if u not in known)
        assert not missing, f"fields {missing} are not in '{ev}' lines:\n{q}"
        for n in numeric:            # sum() of a JSON boolean is no number in Logs Insights
            v = known[n]
            assert isinstance(v, (int, float)) and not isinstance(v, bool), f"{n}={v!r} is not a number:\n{q}"
        clash = sorted(a for a in aliases if a in known or a in by)
        assert not clash, f"aliases {clash} shadow a field or the group-by:\n{q}"
    assert {"request", "init", "timeout", "api_access"} <= seen_events


def test_the_query_checker_catches_what_the_old_readme_had(runtime, capsys):
    fields = emitted(runtime, capsys)["request"]
    _, _, aliases, numeric, by = query_fields(
        'filter event = "request"\n| stats count(*) as n, sum(cold_start) as cold, sum(deadline_hit) as cut by cold')
    assert "cold" in aliases & by
    assert isinstance(fields["deadline_hit"], bool) and "deadline_hit" in numeric


def test_access_log_format_is_json_that_joins_the_function_log():
    t, _ = decode_str((ROOT / "template.yaml").read_text())
    fmt = t["Resources"]["HttpApi"]["Properties"]["AccessLogSettings"]["Format"]
    line = access_line(fmt)                                     # valid JSON with "-" in every string
    assert isinstance(line["status"], int) and isinstance(line["latency_ms"], int)   # numbers for >=, pct()
    assert line["event"] == "api_access"
    assert "$context.integration.requestId" in fmt and "lambda_request_id" in line   # = the function's request_id
    assert "$context.integration.error" in fmt and "$context.status" in fmt
    assert t["Resources"]["HttpApi"]["Properties"]["AccessLogSettings"]["DestinationArn"] == {
        "Fn::GetAtt": ["ApiAccessLogGroup", "Arn"]}
