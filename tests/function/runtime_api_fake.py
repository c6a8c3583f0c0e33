"""One local Lambda Runtime API for the runtime-loop tests (our streaming loop in
test_stream_runtime.py, AWS's awslambdaric in test_runtime_api.py), on real sockets.

``/invocation/next`` hands out the queued events; ``/invocation/<id>/response|error`` and
``/init/error`` record the POST; ``/restore/next`` (SnapStart: the snapshot is taken while it is
open) is counted in `restores` and `log` and answered at once, ``/restore/error`` kept in
`restore_error`. `log` lists the Runtime API calls in the order they arrived: headers, each chunk of a chunked body with its arrival time
(``time.monotonic()``, the same clock the engine's decode steps use), the trailers and the whole
body. `done` is set once every queued event has a reply, or an init error arrived."""
from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "/2018-06-01/runtime"


class FakeRuntimeAPI:
    """`events`: (request id, event) pairs, or bare events (each then gets a uuid4 id).
    `posts[request id]` is the recorded reply ("kind": response or error), `order` the ids in the
    order they were handed out, `init_error` the init-error POST if any."""

    def __init__(self, events: list, *, deadline_ms: int = 120_000, next_timeout_s: float = 120.0):
        self.pending: queue.Queue = queue.Queue()
        for e in events:
            self.pending.put(e if isinstance(e, tuple) else (str(uuid.uuid4()), e))
        self.expected = len(events)
        self.posts: dict[str, dict] = {}
        self.order: list[str] = []
        self.init_error: dict | None = None
        self.restore_error: dict | None = None
        self.restores = 0
        self.log: list[str] = []
        self.done = threading.Event()
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
                api.log.append(f"GET {self.path[len(PREFIX):]}")
                if self.path == f"{PREFIX}/restore/next":
                    api.restores += 1
                    return self._reply(200)
                if self.path != f"{PREFIX}/invocation/next":
                    return self._reply(404)
                try:
                    rid, ev = api.pending.get(timeout=next_timeout_s)
                except queue.Empty:
                    return self._reply(500)
                api.order.append(rid)
                self._reply(200, json.dumps(ev).encode(), {
                    "Lambda-Runtime-Aws-Request-Id": rid,
                    "Lambda-Runtime-Deadline-Ms": str(int(time.time() * 1000) + deadline_ms),
                    "Lambda-Runtime-Invoked-Function-Arn": "arn:aws:lambda:us-east-1:123456789012:function:warmllm",
                    "Lambda-Runtime-Trace-Id": "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1",
                    "Content-Type": "application/json"})

            def do_POST(self):
                api.log.append(f"POST {self.path[len(PREFIX):]}")
                rec: dict = {"headers": {k.lower(): v for k, v in self.headers.items()}, "chunks": [],
                             "trailers": {}, "path": self.path}
                if rec["headers"].get("transfer-encoding") == "chunked":
                    while True:                       # HTTP/1.1 chunked framing, read as it arrives
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while True:
                                line = self.rfile.readline()
                                if line in (b"\r\n", b""):
                                    break
                                k, _, v = line.decode().partition(":")
                                rec["trailers"][k.strip().lower()] = v.strip()
                            break
                        rec["chunks"].append((time.monotonic(), self.rfile.read(size)))
                        assert self.rfile.read(2) == b"\r\n"
                    rec["body"] = b"".join(d for _, d in rec["chunks"])
                else:
                    n = int(self.headers.get("Content-Length") or 0)
                    rec["body"] = self.rfile.read(n) if n else b""
                parts = self.path[len(PREFIX):].strip("/").split("/")
                if parts[:2] == ["init", "error"]:
                    api.init_error = rec
                    api.done.set()
                elif parts[:2] == ["restore", "error"]:
                    api.restore_error = rec
                    api.done.set()
                elif parts[0] == "invocation" and len(parts) == 3 and parts[2] in ("response", "error"):
                    rec["kind"] = parts[2]
                    api.posts[parts[1]] = rec
                    if len(api.posts) >= api.expected:
                        api.done.set()
                else:
                    return self._reply(404)
                self._reply(202, b'{"status":"OK"}', {"Content-Type": "application/json"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
