"""``make serve`` / ``python -m function.serve``: the resident server -- the Lambda handler's code
path (function/asgi.py) behind uvicorn, for local use, a container on ECS/EKS/EC2, or Lambda with
the Web Adapter (docs/resident.md).

Point any OpenAI client at ``http://HOST:PORT/v1``. ``--port 0`` picks a free port; the address is
printed as a JSON line ``{"event": "serve", "url": ...}`` on stderr once the server listens.
SIGTERM or Ctrl-C drains (``SERVE_DRAIN_S``): no new connection, in-flight and queued requests
finish, queued snapshot writes land, exit status 0. Settings: ``SERVE_*`` (function/asgi.py) and
every variable the Lambda function reads (README).

uvicorn (with h11) is the server: maintained, small, pure Python on every platform we run, and
ASGI, so the one app runs under any ASGI server. It has no deadline for a request's headers (a
client trickling a byte a second holds its connection for ever), so `DeadlineH11Protocol` adds
one. The server and its libraries are the ``serve`` extra: not in the Lambda layer.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from engine.jsonlog import emit

from .asgi import ServerApp, ServeSettings

__all__ = ["DeadlineH11Protocol", "build_server", "main", "serve_in_thread"]


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's line and headers, from the
    connection's start or the request's first byte (``header_timeout_s``); past it the connection
    closes with one log line. The body has its own deadline in the app."""

    header_timeout_s = 10.0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._headers_due: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._headers_due is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()             # the first byte of the next request on a kept-alive connection
        super().data_received(data)

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not before:      # a request's headers are complete: its cycle started
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._headers_due = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        due = getattr(self, "_headers_due", None)
        if due is not None:
            due.cancel()
            self._headers_due = None

    def _expired(self) -> None:
        self._headers_due = None
        if self.transport.is_closing():
            return
        emit({"event": "serve_slow_client", "phase": "headers", "client": (self.client or ("-",))[0],
              "header_timeout_s": self.header_timeout_s})
        self.transport.close()


def build_server(app: ServerApp, sock: socket.socket) -> uvicorn.Server:
    s = app.settings
    protocol = type("ServeH11Protocol", (DeadlineH11Protocol,), {"header_timeout_s": s.header_timeout_s})
    config = uvicorn.Config(app, http=protocol, lifespan="on", access_log=False, log_level="warning",
                            timeout_keep_alive=5, timeout_graceful_shutdown=max(1, round(s.drain_s)),
                            server_header=False, date_header=True)
    return uvicorn.Server(config)


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


@contextlib.contextmanager
def serve_in_thread(runtime: Any, settings: ServeSettings | None = None, host: str = "127.0.0.1"
                    ) -> Iterator[tuple[str, ServerApp]]:
    """The server on a thread of this process (tests, notebooks): its base URL and the app."""
    app = ServerApp(runtime, settings)
    sock = listen(host, 0)
    server = build_server(app, sock)
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="warmllm-serve", daemon=True)
    th.start()
    try:
        while not server.started and th.is_alive():
            threading.Event().wait(0.01)
        yield _url(sock), app
    finally:
        server.should_exit = True
        th.join(timeout=app.settings.drain_s + 10)
        runtime.request_observers.remove(app.metrics.observe)


DEFAULT_MAX_NUM_SEQS = 16


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m function.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in a container")
    ap.add_argument("--port", type=int, default=int(os.environ.get("PORT") or 8080))
    a = ap.parse_args(argv)
    try:
        settings = ServeSettings.from_env(os.environ)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    # Ctrl-C or SIGTERM at any moment ends the server with status 0 (a bare SIGTERM says 143): while
    # the model loads, at once; once the server exists, by asking it to drain -- uvicorn's own
    # handlers do that while it runs, and re-raise the signal at the end under this handler
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    # a resident server decodes many streams together (engine/batch.py) unless told otherwise;
    # the Lambda function, one request per environment, keeps the engine's default of one
    os.environ.setdefault("WARMLLM_MAX_NUM_SEQS", str(DEFAULT_MAX_NUM_SEQS))
    try:
        from .app import RUNTIME       # module scope is the init: the model loads on its thread

        app = ServerApp(RUNTIME, settings)
        sock = listen(a.host, a.port)
        server = build_server(app, sock)
    except KeyboardInterrupt:
        sys.stderr.write(json.dumps({"event": "serve_stopped"}) + "\n")
        return 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
    sys.stderr.write(json.dumps({"event": "serve", "url": _url(sock), "queue": settings.queue,
                                 "max_num_seqs": app.load.slots,
                                 "drain_s": settings.drain_s}) + "\n")
    sys.stderr.flush()
    server.run(sockets=[sock])
    sys.stderr.write(json.dumps({"event": "serve_stopped"}) + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Leave without the interpreter's teardown: the model-load and grammar-trie threads (daemons,
    # possibly inside LLVM or llguidance) and numba's workers made a prompt Ctrl-C end in SIGSEGV;
    # the lifespan's shutdown flushed what must not be lost.
    os._exit(main())
