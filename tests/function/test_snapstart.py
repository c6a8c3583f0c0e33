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


def _zip_entry(api, model_path: Path, extra_env: dict | None = None, argv: list[str] | None = None):
    """The zip's entry point as Lambda starts it (bootstrap, with the managed runtime's command line),
    in a SnapStart init, against the local Runtime API; its output once the API has what it waits for."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(AWS_LAMBDA_RUNTIME_API=api.address, LAMBDA_TASK_ROOT=str(ROOT), MODEL_PATH=str(model_path),
               INIT_BUDGET_S="600", AWS_LAMBDA_INITIALIZATION_TYPE="snap-start",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", **(extra_env or {}))
    cmd = argv or ["sh", str(ROOT / "bootstrap"), "/var/lang/bin/python3.12", "/var/runtime/bootstrap.py"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        finished = api.done.wait(600)
        try:
            proc.wait(timeout=0 if not api.restore_error else 60)
        except subprocess.TimeoutExpired:
            pass
    finally:
        if proc.poll() is None:
            proc.terminate()
        out, _ = proc.communicate(timeout=60)
        api.close()
    assert finished, out[-3000:]
    return proc.returncode, out


def test_the_zip_entry_point_runs_the_snapstart_lifecycle(model_factory):
    """Our own Runtime API loop (the zip replaces the managed one to stream) does what the managed
    runtime does under SnapStart: the engine ready and the before-snapshot hook run, then one
    /restore/next (the snapshot), then the after-restore hook, then invocations."""
    from tests.function.runtime_api_fake import FakeRuntimeAPI

    events = [json.loads((ROOT / "events" / n).read_text()) for n in ("health.json", "chat_http_api.json")]
    api = FakeRuntimeAPI(events)
    _, out = _zip_entry(api, model_factory("tiny", "Q4_K_M", 0))
    assert api.restores == 1, api.log
    assert api.log.index("GET /restore/next") < api.log.index("GET /invocation/next"), api.log
    assert [json.loads(api.posts[r]["body"])["statusCode"] for r in api.order] == [200, 200]
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    kinds = [(x.get("event"), x.get("hook") or x.get("phase")) for x in lines]
    before = kinds.index(("snapstart", "before_snapshot"))
    restore = kinds.index(("init", "restore"))
    first_request = kinds.index(("request", None))
    assert kinds.index(("init", "init")) < before < restore < first_request, kinds
    assert lines[restore]["cpu_ok"] is True and lines[restore]["ok"] is True


FAILING_RESTORE = r"""
import sys
import snapshot_restore_py as srp
from function import stream_runtime

def entropy_gone():
    raise OSError("no entropy after the restore")

srp.register_after_restore(entropy_gone)
sys.exit(stream_runtime.main())
"""


def test_an_after_restore_hook_that_raises_is_a_restore_error(model_factory):
    """Lambda's contract: a failed after-restore goes to /restore/error (not /init/error), and the
    environment serves nothing."""
    from tests.function.runtime_api_fake import FakeRuntimeAPI

    api = FakeRuntimeAPI([json.loads((ROOT / "events" / "health.json").read_text())])
    rc, out = _zip_entry(api, model_factory("tiny", "Q4_K_M", 0), {"PYTHONPATH": str(ROOT)},
                         [sys.executable, "-c", FAILING_RESTORE])
    assert rc == 1 and api.restore_error is not None, out[-3000:]
    assert api.restore_error["headers"]["lambda-runtime-function-error-type"] == "Runtime.AfterRestoreError"
    body = json.loads(api.restore_error["body"])
    assert body["errorType"] == "OSError" and "entropy" in body["errorMessage"]
    assert api.init_error is None and "GET /invocation/next" not in api.log, api.log
