"""The request line is one JSON object, an EMF record whose metrics are its own scalar fields,
with stage timings that add up to total_ms within the stated tolerance."""
from __future__ import annotations

import json
import time

import numpy as np

from engine.generate import GenerationResult
from engine.session import PrefillResult
from function import request_log
from function.request_log import STAGES, TOLERANCE_FRAC, TOLERANCE_MS, RequestLog, init_line


def lines(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def result(deadline_hit: bool = False) -> GenerationResult:
    """What Engine.generate returns for an extend of 41 tokens and a 32-token reply."""
    pre = PrefillResult(mode="extend", reused_tokens=380, prefilled_tokens=41, prefill_ms=310.2, restore_ms=0.0,
                        logits=np.zeros(8, np.float32), checkpoints=[421], checkpoint_bytes=4096)
    return GenerationResult(text="x" * 32, token_ids=list(range(32)), finish_reason="length", prompt_tokens=421,
                            max_tokens=64, deadline_hit=deadline_hit, tokenize_ms=0.5, decode_ms=880.5, prefill=pre)


def check_emf(line):
    for cw in line["_aws"]["CloudWatchMetrics"]:
        assert cw["Namespace"] == "warmllm"
        for m in cw["Metrics"]:
            assert isinstance(line[m["Name"]], (int, float)) and not isinstance(line[m["Name"]], bool), m
        for dims in cw["Dimensions"]:
            for d in dims:
                assert isinstance(line[d], str)
        assert ["service"] in cw["Dimensions"]           # the roll-up
    assert isinstance(line["_aws"]["Timestamp"], int)


def families(line) -> dict:
    """metric name → its dimension sets, over every directive of the line"""
    return {m["Name"]: cw["Dimensions"] for cw in line["_aws"]["CloudWatchMetrics"] for m in cw["Metrics"]}


def test_one_line_with_engine_figures_and_emf(capsys):
    log = RequestLog("req-1", cold=False)
    log.set(route="chat", kind="http_api_v2")
    with log.stage("parse_ms"):
        time.sleep(0.002)
    log.add_generation(result())
    out = log.finish(200)
    log.finish(200)                                  # idempotent: still one line
    got = lines(capsys)
    assert len(got) == 1 and got[0] == json.loads(json.dumps(out))
    line = got[0]
    for key in ("event", "request_id", "route", "cold", "prefill_mode", "prompt_tokens", "reused_tokens",
                "prefilled_tokens", "load_ms", "restore_ms", "prefill_ms", "decode_ms", "tokens_out", "total_ms",
                "finish_reason", "status"):
        assert key in line, key
    assert line["event"] == "request" and line["prefill_mode"] == "extend" and line["tokens_out"] == 32
    assert (line["prompt_tokens"], line["reused_tokens"], line["prefilled_tokens"]) == (421, 380, 41)
    assert (line["max_tokens"], line["snapshot_tier"], line["snapshot_bytes"]) == (64, None, 4096)  # its captures
    assert (line["prefill_ms"], line["decode_ms"], line["tokenize_ms"]) == (310.2, 880.5, 0.5)
    assert line["decode_tokens_per_s"] == round(32 / 880.5 * 1000, 2)
    check_emf(line)
    fam = families(line)
    assert {"prefill_ms", "decode_ms", "tokens_out", "decode_tokens_per_s", "requests"} <= set(fam)
    assert fam["prefill_ms"] == [["service", "route", "prefill_mode"], ["service"]]
    assert fam["requests"] == fam["errors_5xx"] == fam["deadline_hit_n"] == [["service", "route"], ["service"]]


def test_stage_sum_within_tolerance_and_gap_is_visible(capsys):
    t = [0.0]
    log = RequestLog("r", cold=True, clock=lambda: t[0])
    with log.stage("parse_ms"):
        t[0] += 0.010
    with log.stage("respond_ms"):
        t[0] += 0.020
    t[0] += 0.100                                    # time spent in no stage
    line = log.finish(200)
    assert line["parse_ms"] == 10.0 and line["respond_ms"] == 20.0 and line["total_ms"] == 130.0
    assert line["unaccounted_ms"] == 100.0
    assert abs(sum(line[s] for s in STAGES) - line["total_ms"]) > TOLERANCE_MS + TOLERANCE_FRAC * line["total_ms"]


def test_non_generation_request_metrics_and_disable(capsys, monkeypatch):
    log = RequestLog("r", cold=False)
    log.set(route="health")
    line = log.finish(404, "not_found")
    check_emf(line)
    assert line["errors_4xx"] == 1 and line["prefill_mode"] == "none"
    fam = families(line)
    # the same dimension sets as a generation's line: one metric per family, whatever the route
    assert fam["requests"] == fam["errors_4xx"] == [["service", "route"], ["service"]]
    assert fam["total_ms"] == [["service", "route", "prefill_mode"], ["service"]]
    assert "prefill_ms" not in fam and "decode_ms" not in fam     # no zeros in the generation roll-ups
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    line = RequestLog("r2", cold=False).finish(200)
    assert "_aws" not in line
    assert len(lines(capsys)) == 2


def test_metrics_failure_never_breaks_the_line(capsys, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("emf down")
    monkeypatch.setattr(request_log, "emf_block", boom)
    line = RequestLog("r", cold=False).finish(200)
    assert line["emf_error"] == "RuntimeError: emf down" and len(lines(capsys)) == 1


def test_init_line(capsys):
    init_line({"phase": "init", "ok": True, "load_ms": 120.0, "compile_ms": 800.0, "download_ms": 0.0,
               "init_ms": 950.0, "model_id": "m"})
    (line,) = lines(capsys)
    assert line["event"] == "init" and line["phase"] == "init" and line["compile_ms"] == 800.0
    check_emf(line)


def test_booleans_have_numeric_twins(capsys):
    log = RequestLog("r", cold=True)
    log.set(route="chat")
    log.add_generation(result(deadline_hit=True))
    line = log.finish(200)
    assert line["deadline_hit"] is True and line["deadline_hit_n"] == 1 and line["cold_start"] == 1
    line = RequestLog("r2", cold=False).finish(200)
    assert line["deadline_hit_n"] == 0 and line["cold_start"] == 0


def test_emf_refuses_what_cloudwatch_would_drop():
    import pytest
    from function.emf import Family, emf_block
    fam = Family("f", {"x_ms": "Milliseconds"}, ("service", "route"))
    with pytest.raises(ValueError, match="dimension 'route'"):
        emf_block({"x_ms": 1.0, "route": None}, [fam])
    with pytest.raises(ValueError, match="not a CloudWatch unit"):
        emf_block({"x_ms": 1.0, "route": "chat"}, [Family("g", {"x_ms": "ms"}, ("service",))])
    assert emf_block({"x_ms": True, "route": "chat"}, [fam]) == {}       # a bool is no metric
