"""`engine bench --depth N` (llama-bench's -d): what is measured, not how fast. pp extends N
tokens of context by p, tg decodes after N, and the rates are tokens over the timed seconds."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine import bench


def test_depth_measures_after_the_context(tiny_model_path):
    out = bench.run(str(tiny_model_path), p=8, n=4, depth=40, tbt=0, ttft=False, repeat=1)
    assert out["depth"] == 40 and out["tg_context_tokens"] == 40
    # tg_s is rounded to 0.1 ms: on a fast host 4 tiny-model tokens take ~5 ms, so the rounding
    # alone moves the quotient by ~1 % (898.8 vs 888.9 seen)
    assert out["tg_tokens"] == 4 and out["tg_tok_s"] == pytest.approx(4 / out["tg_s"], rel=1e-2 + 5e-5 / out["tg_s"])
    assert out["pp_tokens"] == 8 and out["pp_tok_s"] > 0
    plain = bench.run(str(tiny_model_path), p=8, n=4, tbt=0, ttft=False, repeat=1)
    assert "depth" not in plain and plain["tg_context_tokens"] == 8


def test_pp_at_depth_extends_the_context(tiny_model_path, monkeypatch):
    seen = []
    real = bench.Session.prefill

    def spy(self, prompt, *a, **k):
        res = real(self, prompt, *a, **k)
        seen.append((len(prompt), res.mode, res.reused_tokens, res.prefilled_tokens))
        return res

    monkeypatch.setattr(bench.Session, "prefill", spy)
    bench.run(str(tiny_model_path), p=8, n=2, depth=24, tbt=0, ttft=False, repeat=2)
    assert seen[0] == (24, "batched", 0, 24)                  # the context, once
    extends = [s for s in seen if s[1] == "extend"]
    assert len(extends) == 3 and all(s == (32, "extend", 24, 8) for s in extends)   # warm-up + 2 repeats


def test_rate_and_a_negative_depth():
    assert bench.rate(128, 4.0) == 32.0 and bench.rate(3, 0.7) == 4.29
    with pytest.raises(ValueError, match="depth"):
        bench.run("unused.gguf", depth=-1)


def test_cli_takes_depth(tiny_model_path):
    r = subprocess.run([sys.executable, "-m", "engine", "bench", "--model", str(tiny_model_path), "-p", "8", "-n", "2",
                        "--depth", "16", "--tbt", "0", "--no-ttft", "--repeat", "1", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["depth"] == 16 and out["tg_context_tokens"] == 16
