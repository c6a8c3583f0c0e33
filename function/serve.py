"""``make serve``: a local HTTP server on 127.0.0.1 that turns each request into an API Gateway
HTTP API (payload 2.0) event and answers it the way a streaming integration (Function URL, REST
API) does: ``function.app.stream_handler`` writes the response through a chunked HTTP/1.1 body,
so ``stream: true`` sends each SSE chunk as its tokens decode (the same code path as the Lambda
runtime loop, function/stream_runtime.py). HEAD requests use the buffered ``handler``.

Point any OpenAI client at ``http://127.0.0.1:PORT/v1``. One request is handled at a time, as
one Lambda execution environment does. ``--port 0`` picks a free port; the chosen address is
printed as a JSON line ``{"event": "serve", "url": ...}`` on stderr.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from .__main__ import LocalContext

_LOCK = threading.Lock()


def http_api_event(method: str, target: str, headers: dict[str, str], body: bytes, host: str,
                   source_ip: str = "127.0.0.1") -> dict:
    parts = urlsplit(target)
    lower: dict[str, str] = {}
    for k, v in headers.items():
        k = k.lower()
        lower[k] = f"{lower[k]},{v}" if k in lower else v
    try:
        text, b64 = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, b64 = base64.b64encode(body).decode("ascii"), True
    now = time.time()
    event = {
        "version": "2.0", "routeKey": "$default", "rawPath": parts.path or "/",
        "rawQueryString": parts.query, "headers": lower,
        "requestContext": {
            "accountId": "000000000000", "apiId": "local", "domainName": host, "domainPrefix": "local",
            "http": {"method": method, "path": parts.path or "/", "protocol": "HTTP/1.1",
                     "sourceIp": source_ip, "userAgent": lower.get("user-agent", "")},
            "requestId": uuid.uuid4().hex, "routeKey": "$default", "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": b64,
    }
    if parts.query:
        event["queryStringParameters"] = dict(parse_qsl(parts.query))
    if body:
        event["body"] = text
    return event


class ChunkedResponse:
    """function.streaming.HttpStream over this connection: chunked transfer encoding, each write
    flushed at once (what a streaming Lambda integration does for the client)."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self.h = handler
        self.started = False
        self.ended = False

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        self.started = True
        self.h.send_response(status)
        for k, v in headers.items():
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.h.send_header(k, v)
        self.h.send_header("transfer-encoding", "chunked")
        self.h.end_headers()
        self.h.wfile.flush()

    def write(self, data: bytes) -> None:
        if data:
            self.h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.h.wfile.flush()

    def end(self, error_type: str | None = None, error: Mapping | None = None) -> None:
        if self.ended or not self.started:
            return
        self.ended = True
        self.h.wfile.write(b"0\r\n\r\n")     # a local client has no use for Lambda's error trailers
        self.h.wfile.flush()


class Handler(BaseHTTPRequestHandler):
    server_version = "warmllm-serve"
    protocol_version = "HTTP/1.1"
    lambda_handler: Callable[..., dict] | None = None
    stream_handler: Callable[..., None] | None = None
    timeout_s = 900.0

    def log_message(self, fmt, *args):      # the handler's JSON log line is the access log
        pass

    def _serve(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else b""
        event = http_api_event(self.command, self.path, dict(self.headers.items()), body,
                               self.headers.get("host", "127.0.0.1"), self.client_address[0])
        streamer = type(self).stream_handler
        if streamer is not None and self.command != "HEAD":
            out = ChunkedResponse(self)
            with _LOCK:
                streamer(event, LocalContext(self.timeout_s), out)
            out.end()
            return
        handler = type(self).lambda_handler
        assert handler is not None, "make_server sets the handler"
        with _LOCK:
            resp = handler(event, LocalContext(self.timeout_s))
        status = int(resp.get("statusCode", 200))
        payload = resp.get("body") or ""
        data = base64.b64decode(payload) if resp.get("isBase64Encoded") else payload.encode("utf-8")
        self.send_response(status)
        for k, v in (resp.get("headers") or {}).items():
            if k.lower() not in ("content-length", "connection"):
                self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve


def make_server(host: str = "127.0.0.1", port: int = 8080, lambda_handler=None,
                stream_handler=None) -> ThreadingHTTPServer:
    """`lambda_handler` alone: buffered answers (Content-Length). Neither given: function.app's
    two handlers, streaming for everything but HEAD."""
    if lambda_handler is None and stream_handler is None:
        from .app import handler as lambda_handler
        from .app import stream_handler
    attrs = {"lambda_handler": staticmethod(lambda_handler) if lambda_handler else None,
             "stream_handler": staticmethod(stream_handler) if stream_handler else None}
    cls = type("BoundHandler", (Handler,), attrs)
    return ThreadingHTTPServer((host, port), cls)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m function.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    a = ap.parse_args(argv)
    # Ctrl-C (SIGINT) and a terminal, IDE or process manager's SIGTERM both end the server the same
    # way, at any moment from here on: closed, exit status 0 (SIGTERM left to its default made
    # `make serve` say Error 143)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)   # also when started with SIGINT ignored (`cmd &` in a script)
    srv = None
    try:
        srv = make_server(a.host, a.port)
        host, port = srv.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        sys.stderr.write(json.dumps({"event": "serve", "url": f"http://{host}:{port}/v1"}) + "\n")
        sys.stderr.flush()
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if srv is not None:
            srv.server_close()
    app = sys.modules.get("function.app")
    engine = getattr(getattr(app, "RUNTIME", None), "engine", None)
    if engine is not None:
        engine.flush_snapshots(timeout=30.0)     # queued snapshot writes (directory, S3) land first
    sys.stderr.write(json.dumps({"event": "serve_stopped"}) + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Leave without the interpreter's teardown: the model-load and grammar-trie threads (daemons,
    # possibly inside LLVM or llguidance) and numba's workers made a prompt Ctrl-C end in SIGSEGV;
    # main() flushed what must not be lost.
    os._exit(main())
