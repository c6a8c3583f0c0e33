"""Issue 53 (2): the cold start's budget. In a fresh process, as Lambda runs one: the init line
names every stage and they sum to its wall time, and the first requests after init -- a long
prompt, a short follow-up, a constrained one -- run no kernel the warm-up did not compile or load
(numba's compiler lock is never taken: engine/stages.kernel_work)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("numba_cache", "handler", "import", "download", "threads", "open", "weights", "tokenizer", "template",
          "engine", "kernels", "warmup", "grammar", "other")

CHILD = r"""
import json, sys
import function.app as app
from bench.coldstart import _event, _prompt, _Ctx
from engine.stages import kernel_work

def ask(text, **extra):
    ev = _event(text)
    body = json.loads(ev["body"]); body.update(extra); ev["body"] = json.dumps(body)
    with kernel_work() as work:
        r = app.handler(ev, _Ctx())
    return {"status": r["statusCode"], "usage": json.loads(r["body"]).get("usage"), "entries": work.entries,
            "kernel_ms": work.ms}

long = _prompt(300, 0)
out = {"long": ask(long, max_tokens=3, temperature=0.8, top_p=0.9),
       "follow_up": ask(long + " and then some more words", max_tokens=2),
       "schema": ask("an answer", max_tokens=8, response_format={"type": "json_object"})}
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def child(model_factory):
    model = model_factory("tiny", "Q4_K_M", 0)
    env = {**os.environ, "MODEL_PATH": str(model), "INIT_BUDGET_S": "600",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    result = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and result, p.stderr[-3000:]
    return next(x for x in lines if x.get("event") == "init"), json.loads(result[0][len("RESULT "):])


def test_the_init_line_names_every_stage_and_they_sum_to_its_wall_time(child):
    init, _ = child
    assert init["ok"] and init["phase"] == "init", init
    missing = [s for s in STAGES if f"{s}_ms" not in init]
    assert not missing, (missing, init)
    total = sum(init[f"{s}_ms"] for s in STAGES)
    assert abs(total - init["init_ms"]) <= 0.01 * len(STAGES) + 0.01, (total, init)   # rounded to 0.01 ms each
    assert init["kernels_ms"] > 0 and init["warmup_ms"] > 0 and init["open_ms"] > 0


def test_the_first_requests_after_init_run_no_kernel_the_warm_up_missed(child):
    _, res = child
    for name, r in res.items():
        assert r["status"] == 200, (name, r)
        assert r["entries"] == 0, f"the {name} request waited {r['kernel_ms']:.0f} ms for numba: {r}"
    assert res["long"]["usage"]["prompt_tokens"] > 129     # long enough for the long-prefill kernels
