"""Issue 53 (1, 5): SnapStart's runtime hooks (function/snapstart.py), in a fresh process as Lambda
runs one: registered when the handler module is imported; run as Lambda runs them -- before-snapshot
hooks in reverse order of registration, after-restore hooks in order -- they leave a Runtime that
answers, with its random state re-seeded, its S3 clients new and an init line saying it restored."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, random, sys
import numpy as np
from moto import mock_aws

with mock_aws():
    import boto3
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="snaps")
    import function.app as app
    import snapshot_restore_py as srp
    from bench.coldstart import _event, _Ctx
    mine = lambda hooks: [f.__name__ for f, args, kw in hooks if args == (app.RUNTIME,)]
    out = {"hooks": app.SNAPSTART_HOOKS, "before": mine(srp.get_before_snapshot()),
           "after": mine(srp.get_after_restore())}
    store = app.RUNTIME.engine.snapshots
    client_before = store.s3.client
    for f, args, kw in reversed(srp.get_before_snapshot()):      # Lambda: reverse order of registration
        f(*args, **kw)
    out["client_dropped"] = store.s3._client is None
    random.seed(7); np.random.seed(7)                              # the state a snapshot would hold
    py_snap, np_snap = random.random(), np.random.random()
    random.seed(7); np.random.seed(7)
    for f, args, kw in srp.get_after_restore():                   # in order of registration
        f(*args, **kw)
    out["random_differs"] = random.random() != py_snap and np.random.random() != np_snap
    out["client_new"] = store.s3.client is not client_before
    r = app.handler(_event("hello there"), _Ctx())
    out["status"] = r["statusCode"]
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def child(model_factory):
    env = {**os.environ, "MODEL_PATH": str(model_factory("tiny", "Q4_K_M", 0)), "INIT_BUDGET_S": "600",
           "SNAPSHOT_S3_URI": "s3://snaps/prefix", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    result = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and result, p.stderr[-3000:]
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return json.loads(result[0][len("RESULT "):]), lines


def test_the_hooks_are_registered_when_the_handler_module_is_imported(child):
    out, _ = child
    assert out["hooks"] is True and out["before"] == ["before_snapshot"] and out["after"] == ["after_restore"]


def test_a_restored_runtime_answers_with_its_own_random_state_and_new_clients(child):
    out, lines = child
    assert out["client_dropped"] and out["client_new"] and out["random_differs"]
    assert out["status"] == 200
    (restore,) = [x for x in lines if x.get("event") == "init" and x.get("phase") == "restore"]
    assert restore["restored"] is True and restore["ok"] is True and restore["cpu_ok"] is True
    assert restore["restores"] == 1 and restore["restore_ms"] >= 0
    assert any(x.get("event") == "snapstart" and x.get("hook") == "before_snapshot" for x in lines)
