"""Our own Lambda Runtime API loop: the function's entry point (image and zip), because Python's
managed runtime (awslambdaric) has no response-streaming API.

The loop is the documented custom-runtime contract (Lambda developer guide, "Using the Lambda
runtime API for custom runtimes" and "Implementing response streaming in a custom runtime"):

* ``GET /2018-06-01/runtime/invocation/next`` blocks until an event; its headers carry the request
  id, the deadline (``Lambda-Runtime-Deadline-Ms``), the function ARN and the X-Ray trace id
  (exported as ``_X_AMZN_TRACE_ID``).
* Buffered events (HTTP API, direct invokes) go to the same ``Runtime.handle`` as before and are
  posted whole to ``/runtime/invocation/{id}/response``.
* Events from a streaming integration (a Function URL with ``InvokeMode: RESPONSE_STREAM``, the
  REST API whose integration has ``responseTransferMode: STREAM``; ``STREAM_EVENT_KINDS``) are
  answered with one streamed POST to the same path: headers
  ``Lambda-Runtime-Function-Response-Mode: streaming``, ``Transfer-Encoding: chunked``,
  ``Content-Type: application/vnd.awslambda.http-integration-response`` and
  ``Trailer: Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body``; the body is
  the JSON prelude ``{"statusCode", "headers", "cookies"}``, 8 NUL bytes (within the first 16 KB,
  API Gateway's rule), then the payload as HTTP/1.1 chunks. An error after the first byte cannot
  change the status any more: it goes out as the two trailers (type, base64 of the error JSON),
  which Lambda forwards as a function error. The connection is closed after each streamed
  response, as the guide asks.
* An init failure (the module cannot import) is posted to ``/runtime/init/error`` and the process
  exits; a handler that raises is posted to ``/runtime/invocation/{id}/error``.
* Under SnapStart (``AWS_LAMBDA_INITIALIZATION_TYPE=snap-start``; "Implementing SnapStart hooks"
  in the same guide) the loop does what the managed runtime would: after init it runs the
  before-snapshot hooks (in reverse order of registration), calls ``GET /runtime/restore/next`` --
  Lambda snapshots the environment while that call is open and answers it in each environment
  restored from the snapshot -- then runs the after-restore hooks in order. A hook that raises
  before the snapshot is an init error; after a restore it is posted to ``/runtime/restore/error``
  and the process exits. The hooks are the ones registered through ``snapshot_restore_py``
  (function/snapstart.py), the registry Lambda's Python runtimes ship in ``/var/runtime``.

Run as ``python -m function.stream_runtime`` (the image's ENTRYPOINT; ``bootstrap`` for the zip).
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

API_VERSION = "2018-06-01"
PREFIX = f"/{API_VERSION}/runtime"
HTTP_INTEGRATION_CONTENT_TYPE = "application/vnd.awslambda.http-integration-response"
DELIMITER = b"\x00" * 8                 # between the JSON prelude and the payload
PRELUDE_LIMIT = 16 * 1024               # API Gateway: the delimiter within the first 16 KB
ERROR_TYPE_TRAILER = "Lambda-Runtime-Function-Error-Type"
ERROR_BODY_TRAILER = "Lambda-Runtime-Function-Error-Body"
DEFAULT_STREAM_KINDS = ("function_url", "rest_v1")


@dataclass
class Invocation:
    request_id: str
    body: bytes
    deadline_ms: int | None
    function_arn: str | None
    trace_id: str | None
    headers: dict[str, str] = field(default_factory=dict)


class LambdaContext:
    """The parts of Lambda's context object the handler reads, from the /next headers."""

    def __init__(self, inv: Invocation, environ: Mapping[str, str]) -> None:
        self.aws_request_id = inv.request_id
        self.invoked_function_arn = inv.function_arn
        self.function_name = environ.get("AWS_LAMBDA_FUNCTION_NAME", "warmllm")
        self.function_version = environ.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.memory_limit_in_mb = environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
        self.log_group_name = environ.get("AWS_LAMBDA_LOG_GROUP_NAME")
        self.log_stream_name = environ.get("AWS_LAMBDA_LOG_STREAM_NAME")
        self._deadline_ms = inv.deadline_ms

    def get_remaining_time_in_millis(self) -> int:
        if self._deadline_ms is None:
            return 900_000
        return max(0, self._deadline_ms - int(time.time() * 1000))


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def prelude(status: int, headers: Mapping[str, str], cookies: list[str] | None = None) -> bytes:
    """The HTTP-integration prelude and its delimiter, byte for byte as sent."""
    meta = json.dumps({"statusCode": int(status), "headers": dict(headers), "cookies": list(cookies or [])},
                      ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(meta) + len(DELIMITER) > PRELUDE_LIMIT:
        raise ValueError(f"the response prelude is {len(meta)} bytes; API Gateway needs the delimiter within "
                         f"{PRELUDE_LIMIT} bytes: send fewer or shorter headers")
    return meta + DELIMITER


class LambdaStream:
    """One streamed response to the Runtime API (see the module doc). ``start`` sends the prelude,
    ``write`` one chunk per call (flushed at once), ``end`` the last chunk and, on error, the
    trailers. Thread-safe: the keep-alive timer writes from its own thread."""

    def __init__(self, conn: http.client.HTTPConnection, request_id: str) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.started = False
        self.ended = False
        self.bytes_sent = 0
        conn.putrequest("POST", f"{PREFIX}/invocation/{request_id}/response", skip_accept_encoding=True)
        conn.putheader("Lambda-Runtime-Function-Response-Mode", "streaming")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.putheader("Content-Type", HTTP_INTEGRATION_CONTENT_TYPE)
        conn.putheader("Trailer", f"{ERROR_TYPE_TRAILER}, {ERROR_BODY_TRAILER}")
        conn.endheaders()

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        # Lambda and API Gateway frame the response themselves: length and framing headers from
        # us would contradict theirs
        h = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "transfer-encoding",
                                                                      "connection")}
        self._send(prelude(status, h))
        self.started = True

    def write(self, data: bytes) -> None:
        if data:
            self._send(data)

    def _send(self, data: bytes) -> None:
        with self._lock:
            if self.ended:
                raise RuntimeError("the response stream has ended")
            self._conn.send(_chunk(data))
            self.bytes_sent += len(data)

    def end(self, error_type: str | None = None, error: Mapping | None = None) -> None:
        with self._lock:
            if self.ended:
                return
            self.ended = True
            tail = b"0\r\n"
            if error_type is not None:
                body = base64.b64encode(json.dumps(dict(error or {}), separators=(",", ":")).encode()).decode()
                tail += f"{ERROR_TYPE_TRAILER}: {error_type}\r\n{ERROR_BODY_TRAILER}: {body}\r\n".encode()
            self._conn.send(tail + b"\r\n")
        try:
            resp = self._conn.getresponse()
            resp.read()
        finally:
            self._conn.close()       # the guide: close the connection after a streamed response


class RuntimeAPIClient:
    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host or address, int(port) if port.isdigit() else 80
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port)   # no timeout: /next blocks
        return self._conn

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=dict(headers or {}))
                r = conn.getresponse()
                data = r.read()
                return r.status, {k.lower(): v for k, v in r.getheaders()}, data
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self._conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def next(self) -> Invocation:
        status, h, body = self._request("GET", f"{PREFIX}/invocation/next")
        if status != 200:
            raise RuntimeError(f"Runtime API /invocation/next answered {status}: {body[:200]!r}")
        deadline = h.get("lambda-runtime-deadline-ms")
        return Invocation(h["lambda-runtime-aws-request-id"], body,
                          int(deadline) if deadline and deadline.isdigit() else None,
                          h.get("lambda-runtime-invoked-function-arn"), h.get("lambda-runtime-trace-id"), h)

    def respond(self, request_id: str, payload: bytes) -> None:
        self._request("POST", f"{PREFIX}/invocation/{request_id}/response", payload,
                      {"Content-Type": "application/json"})

    def error(self, request_id: str, exc: BaseException) -> None:
        self._post_error(f"{PREFIX}/invocation/{request_id}/error", exc)

    def init_error(self, exc: BaseException) -> None:
        self._post_error(f"{PREFIX}/init/error", exc, "Runtime.InitError")

    def restore_next(self) -> None:
        """Ready for the snapshot; returns in an environment restored from it."""
        status, _, body = self._request("GET", f"{PREFIX}/restore/next")
        if status != 200:
            raise RuntimeError(f"Runtime API /restore/next answered {status}: {body[:200]!r}")

    def restore_error(self, exc: BaseException) -> None:
        self._post_error(f"{PREFIX}/restore/error", exc, "Runtime.AfterRestoreError")

    def _post_error(self, path: str, exc: BaseException, error_type: str | None = None) -> None:
        kind = error_type or f"Runtime.{type(exc).__name__}"
        body = error_body(exc)
        self._request("POST", path, json.dumps(body).encode(),
                      {"Content-Type": "application/json", "Lambda-Runtime-Function-Error-Type": kind})

    def stream(self, request_id: str) -> LambdaStream:
        # its own connection: the guide has it closed after the streamed response
        return LambdaStream(http.client.HTTPConnection(self.host, self.port), request_id)


def error_body(exc: BaseException) -> dict:
    return {"errorMessage": str(exc), "errorType": type(exc).__name__,
            "stackTrace": traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8)}


def stream_kinds(environ: Mapping[str, str]) -> frozenset[str]:
    """The event kinds whose integration invokes with response streaming (STREAM_EVENT_KINDS,
    comma-separated; default: function_url and rest_v1, the two that template.yaml streams)."""
    raw = environ.get("STREAM_EVENT_KINDS")
    if raw is None or not raw.strip():
        return frozenset(DEFAULT_STREAM_KINDS)
    kinds = {k.strip() for k in raw.split(",") if k.strip()}
    known = {"function_url", "rest_v1", "http_api_v2", "direct", "none"}
    bad = kinds - known
    if bad:
        raise ValueError(f"STREAM_EVENT_KINDS={raw!r} is invalid: {sorted(bad)} unknown; use a comma-separated "
                         f"list of {sorted(known - {'none'})}, or 'none' to stream nothing")
    return frozenset(kinds - {"none"})


def _end_quietly(stream: LambdaStream, error_type: str | None = None, error: Mapping | None = None) -> None:
    """End the response; a connection already gone must not take the loop (and the warm process)
    down with it."""
    try:
        stream.end(error_type, error)
    except (OSError, http.client.HTTPException) as exc:
        sys.stderr.write(f"streamed response could not be completed: {type(exc).__name__}: {exc}\n")


def serve_one(client: RuntimeAPIClient, inv: Invocation, handle: Callable, handle_stream: Callable,
              kinds: frozenset[str], environ: Mapping[str, str]) -> None:
    """One invocation: decode the event, run the handler, post the result (streamed or whole)."""
    from .events import kind_of
    ctx = LambdaContext(inv, environ)
    if inv.trace_id:
        os.environ["_X_AMZN_TRACE_ID"] = inv.trace_id
    try:
        event = json.loads(inv.body or b"null")
    except ValueError as exc:
        client.error(inv.request_id, exc)
        return
    if kind_of(event) in kinds:
        stream = client.stream(inv.request_id)
        try:
            handle_stream(event, ctx, stream)
        except Exception as exc:       # the handler never raises by design: this is a bug
            traceback.print_exc()
            _end_quietly(stream, f"Runtime.{type(exc).__name__}", error_body(exc))
            return
        _end_quietly(stream)
        return
    try:
        result = handle(event, ctx)
        payload = json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except Exception as exc:
        traceback.print_exc()
        client.error(inv.request_id, exc)
        return
    client.respond(inv.request_id, payload)


def run(client: RuntimeAPIClient, handle: Callable, handle_stream: Callable, kinds: frozenset[str],
        environ: Mapping[str, str], max_invocations: int | None = None) -> None:
    """The invocation loop (forever in Lambda; `max_invocations` for tests)."""
    served = 0
    while max_invocations is None or served < max_invocations:
        inv = client.next()
        serve_one(client, inv, handle, handle_stream, kinds, environ)
        served += 1


def snapstart_hooks() -> tuple[list, list]:
    """The (before-snapshot, after-restore) hooks registered through ``snapshot_restore_py``, as
    ``(callable, args, kwargs)``; none where the library is absent (not a Lambda runtime)."""
    try:
        import snapshot_restore_py as srp
    except ImportError:
        return [], []
    return list(srp.get_before_snapshot()), list(srp.get_after_restore())


def snapstart_cycle(client: RuntimeAPIClient) -> None:
    """Before-snapshot hooks (reverse order), the snapshot, after-restore hooks (in order). Raises
    ``AfterRestoreFailed`` when an after-restore hook raises, any other error before the snapshot."""
    before, after = snapstart_hooks()
    for func, args, kwargs in reversed(before):
        func(*args, **kwargs)
    client.restore_next()
    try:
        for func, args, kwargs in after:
            func(*args, **kwargs)
    except Exception as exc:
        raise AfterRestoreFailed(exc) from exc


class AfterRestoreFailed(Exception):
    """An after-restore hook raised: reported to /restore/error, not /init/error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    address = env.get("AWS_LAMBDA_RUNTIME_API")
    if not address:
        sys.stderr.write("AWS_LAMBDA_RUNTIME_API is not set: this is the Lambda entry point; run it inside "
                         "Lambda (or against a Runtime API emulator), or use `make run` / `make serve` locally\n")
        return 2
    client = RuntimeAPIClient(address)
    try:
        kinds = stream_kinds(env)
        from . import app          # module scope is the init phase: numba cache, settings, model load
        if env.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "snap-start":
            snapstart_cycle(client)
    except AfterRestoreFailed as exc:
        traceback.print_exc()
        client.restore_error(exc.cause)
        return 1
    except Exception as exc:
        traceback.print_exc()
        client.init_error(exc)
        return 1
    run(client, app.handler, app.stream_handler, kinds, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
