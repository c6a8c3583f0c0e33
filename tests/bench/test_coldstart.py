"""bench.coldstart runs end to end (on the tiny model, one condition: the harness, not the figures)."""
from __future__ import annotations

import json

from bench import coldstart


def test_the_coldstart_bench_times_ready_first_and_warm_requests(tmp_path, capsys):
    out = tmp_path / "receipt.json"
    assert coldstart.main(["--models", "tiny", "--runs", "1", "--pages", "warm", "--kernels", "warm",
                           "--no-llama", "--words", "40", "--out", str(out)]) == 0
    receipt = json.loads(out.read_text())
    (row,) = receipt["models"]["tiny"]["rows"]
    assert "error" not in row, row
    # the init line's clock starts at the handler module's first line, after the child's
    assert row["init"]["init_ms"] > 0 and row["import_to_ready_ms"] >= row["init"]["init_ms"] - 0.1
    assert row["first_ms"] > 0 and row["warm_ms"] > 0 and row["prompt_tokens"] > 40
    assert row["init"]["phase"] == "init" and row["init"]["load_ms"] > 0
    s = receipt["models"]["tiny"]["summary"]["pages_warm_kernels_warm"]
    assert s["first_over_warm"] == row["first_over_warm"]

