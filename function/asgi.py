"""The resident server's ASGI app (issue 54): the Lambda handler's code path behind a production
HTTP server, for `make serve`, a container on ECS/EKS/EC2, or Lambda behind the Web Adapter.

Every request becomes the API Gateway HTTP API (payload 2.0) event the Lambda handler takes and
goes through ``Runtime.handle_stream`` -- the same routes, validation, errors, SSE and log line as
in Lambda, one code path. What a resident server adds is here:

* **Continuous batching, a bounded queue.** Up to ``WARMLLM_MAX_NUM_SEQS`` generations (POST
  /v1/chat/completions and /v1/completions) run at once, each on a thread of its own, and decode
  together: one step of the model for all of them (engine/batch.py); ``SERVE_QUEUE`` more may
  wait. Beyond that the answer is 429 ``queue_full`` with ``Retry-After`` (the recent generation
  time x the queue ahead per running slot, in seconds). /health, /v1/models and /metrics never
  queue behind a generation: an orchestrator's health check must answer while they run.
* **Slow and vanished clients.** The request headers must arrive within ``SERVE_HEADER_TIMEOUT_S``
  (uvicorn has no such deadline: `DeadlineH11Protocol`), the body within ``SERVE_BODY_TIMEOUT_S``
  (408 ``request_timeout``), at most ``MAX_BODY_BYTES`` of it is read (413). A client that reads
  nothing of its stream for ``SERVE_WRITE_TIMEOUT_S`` is dropped; a client that disconnects stops
  its decode at the next token (the runtime's ``stream_closed``). Each is one JSON log line.
* **Prometheus text at /metrics**: queue depth, active sequences, tokens, decode speed, prefill
  modes, snapshot hits, requests and errors by code (a bearer key guards it when one is set).
* **SIGTERM drains**: the listener closes, in-flight and queued requests finish (at most
  ``SERVE_DRAIN_S``), queued snapshot writes land, then the process exits.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from engine.jsonlog import emit
from engine.settings import env_value

from .__main__ import LocalContext
from .errors import APIError, unauthorized
from .limits import too_large
from .metrics import ServeMetrics

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["ServeSettings", "ServerApp", "http_api_event"]

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

@dataclass(frozen=True)
class ServeSettings:
    queue: int = 16                  # SERVE_QUEUE: generations that may wait behind the running ones
    header_timeout_s: float = 10.0   # SERVE_HEADER_TIMEOUT_S: request line + headers, from the first byte
    body_timeout_s: float = 30.0     # SERVE_BODY_TIMEOUT_S: the whole body, once the headers are in
    write_timeout_s: float = 60.0    # SERVE_WRITE_TIMEOUT_S: a client that takes nothing for this long is dropped
    drain_s: float = 30.0            # SERVE_DRAIN_S: SIGTERM waits this long for in-flight requests

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServeSettings:
        d = cls()

        def seconds(name: str, default: float) -> float:
            return env_value(env, name, float, default, check=lambda v: math.isfinite(v) and v > 0,
                             takes="a positive number of seconds")
        return cls(queue=env_value(env, "SERVE_QUEUE", int, d.queue, check=lambda v: v >= 0,
                                   takes="a whole number of requests, 0 or more"),
                   header_timeout_s=seconds("SERVE_HEADER_TIMEOUT_S", d.header_timeout_s),
                   body_timeout_s=seconds("SERVE_BODY_TIMEOUT_S", d.body_timeout_s),
                   write_timeout_s=seconds("SERVE_WRITE_TIMEOUT_S", d.write_timeout_s),
                   drain_s=seconds("SERVE_DRAIN_S", d.drain_s))


def http_api_event(method: str, target: str, headers: Mapping[str, str] | list[tuple[str, str]], body: bytes,
                   host: str, source_ip: str = "127.0.0.1") -> dict:
    """The API Gateway HTTP API (payload 2.0) event for one HTTP request (repeated headers joined
    with commas, as API Gateway does; a body that is not UTF-8 base64-encoded)."""
    path, _, query = target.partition("?")
    lower: dict[str, str] = {}
    for k, v in (headers.items() if isinstance(headers, Mapping) else headers):
        k = k.lower()
        lower[k] = f"{lower[k]},{v}" if k in lower else v
    try:
        text, b64 = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, b64 = base64.b64encode(body).decode("ascii"), True
    now = time.time()
    event = {
        "version": "2.0", "routeKey": "$default", "rawPath": path or "/",
        "rawQueryString": query, "headers": lower,
        "requestContext": {
            "accountId": "000000000000", "apiId": "local", "domainName": host, "domainPrefix": "local",
            "http": {"method": method, "path": path or "/", "protocol": "HTTP/1.1",
                     "sourceIp": source_ip, "userAgent": lower.get("user-agent", "")},
            "requestId": uuid.uuid4().hex, "routeKey": "$default", "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": b64,
    }
    if query:
        event["queryStringParameters"] = dict(parse_qsl(query))
    if body:
        event["body"] = text
    return event


class ClientGone(BrokenPipeError):
    """The client disconnected or stopped reading: the runtime's next write ends the generation."""


class _Bridge:
    """``function.streaming.HttpStream`` for the engine's thread: each call is handed to the event
    loop, which sends it; nothing here waits for the client, so a slow reader never holds the
    engine (its bytes wait in memory, bounded by max_tokens, until it reads or is dropped)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.items: asyncio.Queue = asyncio.Queue()
        self.gone = threading.Event()
        self.ended = False

    def _put(self, item: tuple) -> None:
        self._loop.call_soon_threadsafe(self.items.put_nowait, item)

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        self._put(("start", status, dict(headers)))

    def write(self, data: bytes) -> None:
        if self.gone.is_set():
            raise ClientGone(32, "the client closed the connection or stopped reading")
        if data:
            self._put(("body", bytes(data)))

    def end(self, error_type: str | None = None, error: Mapping | None = None) -> None:
        if not self.ended:
            self.ended = True
            self._put(("end",))


@dataclass
class _Load:
    """What waits and what runs (the engine thread changes `running`; the loop the rest)."""

    waiting: int = 0
    running: int = 0
    recent_s: float = 0.0          # exponential average of a generation's time on the engine

    slots: int = 1                 # generations that run at once (the engine's max_num_seqs)

    def retry_after_s(self) -> int:
        per = self.recent_s or 5.0
        return max(1, min(300, math.ceil(per * (self.waiting + self.running) / self.slots)))


class ServerApp:
    """The ASGI application around one `Runtime` (see the module doc)."""

    def __init__(self, runtime: Runtime, settings: ServeSettings | None = None,
                 metrics: ServeMetrics | None = None) -> None:
        self.runtime = runtime
        self.settings = settings or ServeSettings()
        slots = runtime.settings.engine.max_num_seqs
        self.load = _Load(slots=slots)
        self.metrics = metrics or ServeMetrics(self.load, lambda: runtime.engine)
        runtime.request_observers.append(self.metrics.observe)
        # a thread per generation that may run (each has a session of the engine's pool), FIFO
        self._engine = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="warmllm-engine")
        self._side = ThreadPoolExecutor(max_workers=4, thread_name_prefix="warmllm-side")
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    # ------------------------------------------------------------------ lifespan

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await asyncio.get_running_loop().run_in_executor(None, self.close)
                await send({"type": "lifespan.shutdown.complete"})
                return

    def close(self) -> None:
        """After the drain: what is still queued for the snapshot store lands, the threads end."""
        self._engine.shutdown(wait=True)
        self._side.shutdown(wait=True)
        eng = self.runtime.engine
        if eng is not None:
            eng.flush_snapshots(timeout=30.0)

    # ------------------------------------------------------------------ one request

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        client = (scope.get("client") or ("-", 0))[0]
        rid = uuid.uuid4().hex
        limit = self.runtime.settings.limits.max_body_bytes
        try:
            body = await asyncio.wait_for(_read_body(receive, limit), self.settings.body_timeout_s)
        except TimeoutError:
            return await self._refuse(send, APIError(
                408, f"the request body did not arrive within {self.settings.body_timeout_s:g} s "
                     "(SERVE_BODY_TIMEOUT_S); send it in one go", "invalid_request_error", None,
                "request_timeout"), rid, path, client)
        except _TooLarge as big:
            return await self._refuse(send, too_large(
                f"the request body is over {limit} bytes (at least {big.n} arrived); at most {limit} are "
                "accepted (MAX_BODY_BYTES)", None), rid, path, client)
        except _Disconnected:
            emit({"event": "serve_client_gone", "request_id": rid, "path": path, "client": client,
                  "phase": "body"})
            return None
        if path == "/metrics" and method in ("GET", "HEAD"):
            return await self._metrics(send, headers, method)
        # every POST route generates (and one that does not exist answers at once from an engine
        # thread): POSTs count against the slots and the queue, whatever their path's spelling
        generation = method == "POST"
        if generation:
            with self._lock:     # WARMLLM_MAX_NUM_SEQS running, SERVE_QUEUE waiting
                full = self.load.waiting + self.load.running >= self.settings.queue + self.load.slots
                if not full:
                    self.load.waiting += 1
            if full:
                retry = self.load.retry_after_s()
                return await self._refuse(send, APIError(
                    429, f"the server is busy: {self.load.running} generations running (WARMLLM_MAX_NUM_SEQS="
                         f"{self.load.slots}) and {self.load.waiting} waiting (SERVE_QUEUE={self.settings.queue}); "
                         f"retry in {retry} s",
                    "rate_limit_error", None, "queue_full"), rid, path, client, {"retry-after": str(retry)})
        target = path + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        host = next((v for k, v in headers if k.lower() == "host"), "127.0.0.1")
        event = http_api_event(method, target, headers, body, host, client)
        loop = asyncio.get_running_loop()
        bridge = _Bridge(loop)
        pool = self._engine if generation else self._side
        work = loop.run_in_executor(pool, self._run, event, rid, bridge, generation)
        watch = asyncio.ensure_future(_watch_disconnect(receive, bridge))
        try:
            await self._pump(send, bridge, method, rid, path, client)
        finally:
            watch.cancel()
            if not bridge.ended:
                bridge.gone.set()             # we stopped sending: the engine stops at its next write
            await work

    def _run(self, event: dict, rid: str, bridge: _Bridge, generation: bool) -> None:
        """On an engine (or side) thread: the Lambda handler's streaming entry, then the end."""
        if generation:
            with self._lock:
                self.load.waiting -= 1
                self.load.running += 1
        t0 = time.monotonic()
        try:
            if bridge.gone.is_set():        # the client left while it waited: nothing to run
                emit({"event": "serve_client_gone", "request_id": rid, "phase": "queued"})
                return
            ctx = LocalContext(900.0)
            ctx.aws_request_id = rid
            self.runtime.handle_stream(event, ctx, bridge)
        except Exception as exc:      # the handler answers every error itself: this is a bug; one line
            emit({"event": "serve_error", "request_id": rid, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            bridge.end()
            if generation:
                took = time.monotonic() - t0
                with self._lock:
                    self.load.running -= 1
                    self.load.recent_s = took if not self.load.recent_s else 0.3 * took + 0.7 * self.load.recent_s

    async def _pump(self, send: Send, bridge: _Bridge, method: str, rid: str, path: str, client: str) -> None:
        """Send what the engine's thread hands over, each send within the write deadline."""
        started = False
        while True:
            item = await bridge.items.get()
            if item[0] == "start":
                _, status, headers = item
                out = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()
                       if k.lower() not in ("content-length", "transfer-encoding", "connection")]
                msg: dict = {"type": "http.response.start", "status": status, "headers": out}
            elif item[0] == "body":
                if method == "HEAD":
                    continue
                msg = {"type": "http.response.body", "body": item[1], "more_body": True}
            else:
                if not started:
                    return            # nothing was started (the client left while queued)
                msg = {"type": "http.response.body", "body": b"", "more_body": False}
            try:
                await asyncio.wait_for(send(msg), self.settings.write_timeout_s)
            except TimeoutError:
                bridge.gone.set()
                emit({"event": "serve_slow_reader", "request_id": rid, "path": path, "client": client,
                      "write_timeout_s": self.settings.write_timeout_s})
                return
            except OSError:
                bridge.gone.set()
                emit({"event": "serve_client_gone", "request_id": rid, "path": path, "client": client,
                      "phase": "write"})
                return
            if item[0] == "start":
                started = True
            elif item[0] == "end":
                return

    async def _refuse(self, send: Send, err: APIError, rid: str, path: str, client: str,
                      extra: Mapping[str, str] | None = None) -> None:
        """An answer the server gives before the handler runs (queue full, slow body, too large)."""
        self.metrics.refused(err.code or "error")
        emit({"event": "serve_refused", "request_id": rid, "path": path, "client": client, "status": err.status,
              "error_code": err.code})
        body = json.dumps(err.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"x-request-id", rid.encode())]
        headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
        if err.status in (408, 413):
            headers.append((b"connection", b"close"))   # the rest of that body is not read
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _metrics(self, send: Send, headers: list[tuple[str, str]], method: str) -> None:
        key = self.runtime.api_key
        if key:
            auth = next((v for k, v in headers if k.lower() == "authorization"), "")
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), key.encode()):
                body = json.dumps(unauthorized().body()).encode()
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
        text, ctype = self.metrics.render()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(text)).encode())]})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else text})


class _TooLarge(Exception):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.n = n


class _Disconnected(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    n = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Disconnected
        chunk = msg.get("body", b"")
        n += len(chunk)
        if n > limit:
            raise _TooLarge(n)
        parts.append(chunk)
        if not msg.get("more_body"):
            return b"".join(parts)


async def _watch_disconnect(receive: Receive, bridge: _Bridge) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            bridge.gone.set()
            return
