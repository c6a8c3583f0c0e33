"""The buffered handler contract under AWS's own runtime client: ``python -m awslambdaric
function.app.handler`` against a local endpoint that speaks the Lambda Runtime API (next / response /
error). Three events: the first is the cold start, the second and third are warm (no reload, one
init line). The image's entry point is our streaming loop now (tests/function/test_stream_runtime.py);
``function.app.handler`` still works under awslambdaric for anyone who deploys it that way."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
PREFIX = "/2018-06-01/runtime"


class RuntimeAPI:
    """A minimal Lambda Runtime API: hands out queued events, records responses and errors."""

    def __init__(self, events: list[dict]):
        self.pending: queue.Queue = queue.Queue()
        for e in events:
            self.pending.put(e)
        self.results: dict[str, dict] = {}
        self.order: list[str] = []
        self.done = threading.Event()
        self.expected = len(events)
        api = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                """Keep the Runtime API's access log out of the test output."""

            def _reply(self, code: int, body: bytes = b"", headers: dict | None = None):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path != f"{PREFIX}/invocation/next":
                    return self._reply(404)
                try:
                    event = api.pending.get(timeout=120)
                except queue.Empty:
                    return self._reply(500)
                rid = str(uuid.uuid4())
                api.order.append(rid)
                self._reply(200, json.dumps(event).encode(), {
                    "Lambda-Runtime-Aws-Request-Id": rid,
                    "Lambda-Runtime-Deadline-Ms": str(int(time.time() * 1000) + 60_000),
                    "Lambda-Runtime-Invoked-Function-Arn": "arn:aws:lambda:us-east-1:123456789012:function:warmllm",
                    "Lambda-Runtime-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
                    "Content-Type": "application/json"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                parts = self.path[len(PREFIX):].strip("/").split("/")
                if parts[:2] == ["init", "error"]:
                    api.results["init"] = {"kind": "init_error", "body": json.loads(body or b"{}")}
                    api.done.set()
                elif parts[0] == "invocation" and len(parts) == 3 and parts[2] in ("response", "error"):
                    api.results[parts[1]] = {"kind": parts[2], "body": json.loads(body or b"null")}
                    if len(api.results) >= api.expected:
                        api.done.set()
                else:
                    return self._reply(404)
                self._reply(202, b'{"status":"OK"}', {"Content-Type": "application/json"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def run_ric(handler: str, events: list[dict], env_extra: dict, timeout: float = 240.0):
    api = RuntimeAPI(events)
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
    results = [api.results[rid] for rid in api.order]
    assert [r["kind"] for r in results] == ["response"] * 3, out[-3000:]
    bodies = [json.loads(r["body"]["body"]) for r in results]
    assert [r["body"]["statusCode"] for r in results] == [200, 200, 200]
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
    (res,) = api.results.values()
    assert res["kind"] in ("error", "init_error"), res
    assert "no_such_handler" in json.dumps(res["body"])
