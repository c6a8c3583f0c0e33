"""The buffered handler contract under AWS's own runtime client: ``python -m awslambdaric
function.app.handler`` against a local endpoint that speaks the Lambda Runtime API (next / response /
error). Three events: the first is the cold start, the second and third are warm (no reload, one
init line). The image's entry point is our streaming loop now (tests/function/test_stream_runtime.py);
``function.app.handler`` still works under awslambdaric for anyone who deploys it that way."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.function.runtime_api_fake import FakeRuntimeAPI


ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"


def run_ric(handler: str, events: list[dict], env_extra: dict, timeout: float = 240.0):
    api = FakeRuntimeAPI(events, deadline_ms=60_000)
    env = {**os.environ, "AWS_LAMBDA_RUNTIME_API": api.address, "AWS_LAMBDA_FUNCTION_NAME": "warmllm",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           **env_extra}
    proc = subprocess.Popen([sys.executable, "-m", "awslambdaric", handler], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        finished = api.done.wait(timeout)
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        api.close()
    assert finished, out[-3000:]
    return api, out


def test_three_invocations_first_cold_then_warm(tiny_model_path, tmp_path):
    events = [json.loads((EVENTS / n).read_text()) for n in ("health.json", "chat_http_api.json", "completion.json")]
    api, out = run_ric("function.app.handler", events,
                       {"MODEL_PATH": str(tiny_model_path), "INIT_BUDGET_S": "120"})
    results = [api.posts[rid] for rid in api.order]
    assert [r["kind"] for r in results] == ["response"] * 3, out[-3000:]
    responses = [json.loads(r["body"]) for r in results]
    bodies = [json.loads(r["body"]) for r in responses]
    assert [r["statusCode"] for r in responses] == [200, 200, 200]
    assert bodies[0]["status"] == "ok" and bodies[0]["cold"] is True
    assert bodies[1]["object"] == "chat.completion" and bodies[2]["object"] == "text_completion"
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    req = [x for x in lines if x.get("event") == "request"]
    inits = [x for x in lines if x.get("event") == "init"]
    assert [x["cold"] for x in req] == [True, False, False]
    assert [x["request_id"] for x in req] == api.order            # the Runtime API's ids reach the log
    assert len(inits) == 1 and inits[0]["ok"] is True               # loaded once: no reload when warm
    assert req[1]["load_ms"] < 50 and req[2]["load_ms"] < 50


def test_runtime_error_endpoint(tmp_path):
    """A handler that cannot be found is reported through the invocation error endpoint."""
    event = json.loads((EVENTS / "health.json").read_text())
    api, out = run_ric("function.app.no_such_handler", [event], {"MODEL_PATH": str(tmp_path / "none.gguf"),
                                                                 "INIT_BUDGET_S": "5"}, timeout=60)
    (res,) = [*api.posts.values(), *([api.init_error] if api.init_error else [])]
    assert res is api.init_error or res["kind"] == "error", res
    assert "no_such_handler" in res["body"].decode()
