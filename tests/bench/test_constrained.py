"""bench.constrained runs end to end (on the tiny model: the harness, not the figures)."""
from __future__ import annotations

import json


def test_the_constrained_bench_reports_both_rates_and_compile_times(tiny_model_path, capsys):
    from bench.constrained import main

    assert main(["--model", str(tiny_model_path), "--tokens", "6", "--rounds", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["free_tok_s"] > 0 and out["json_schema_tok_s"] > 0 and out["ratio"] > 0
    assert [r["kind"] for r in out["rounds"]] == ["free", "json_schema", "json_schema_thinking"]
    assert [r["tokens"] for r in out["rounds"]] == [6, 6, 6]   # end-of-generation banned: exact counts
    # thinking on: half the tokens reason unmasked by the schema, the answer is masked
    assert 0 < out["rounds"][2]["masked_steps"] < out["rounds"][1]["masked_steps"]
    assert out["thinking_ratio"] > 0
    assert out["tools"] == 5 and out["tools_compile_ms"] > out["tools_compile_cached_ms"]
    assert out["rounds"][1]["mask_ms"] > 0 and out["rounds"][0]["mask_ms"] == 0
