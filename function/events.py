"""Every kind of event the function can be invoked with, normalised in one place.

Kinds:
  ``http_api_v2``   API Gateway HTTP API, payload format 2.0 (what template.yaml deploys)
  ``function_url``  Lambda Function URL (payload 2.0 with a ``*.lambda-url.*`` domain)
  ``rest_v1``       API Gateway REST API proxy integration, payload format 1.0 (also ALB)
  ``direct``        ``aws lambda invoke`` with a bare OpenAI body: ``messages`` → chat,
                    ``prompt`` → completion; an EventBridge schedule (keep-warm ping) → health
Bodies may be base64 encoded (``isBase64Encoded``). The answer goes back in the same kind's
response shape (``to_response``); a direct invoke gets the JSON object itself.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field

from . import limits
from .errors import APIError, bad_request, invalid_json
from .limits import SURROGATE, Limits

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@dataclass
class Request:
    kind: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)   # names lower-cased
    query: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None
    parsed_body: object = None        # direct invoke: the event itself
    received_epoch_ms: int | None = None   # when API Gateway received the request, if it says
    source_ip: str | None = None

    def json_body(self, lim: Limits | None = None) -> dict:
        """The body as a JSON object, or a 400/413 that says what is wrong with it: size,
        encoding, syntax, nesting, number length and Unicode are checked before any field is."""
        lim = lim if lim is not None else Limits()
        if self.parsed_body is not None:
            body = self.parsed_body
            limits.check_tree(body, lim)
        else:
            if not self.raw_body:
                raise invalid_json("the body is empty; send a JSON object")
            limits.check_body_size(len(self.raw_body), lim)
            try:
                text = self.raw_body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise invalid_json(f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
            body = limits.loads(text, lim)
        if not isinstance(body, dict):
            raise invalid_json(f"expected a JSON object, got {type(body).__name__}")
        return body


def _invalid_event(message: str, param: str) -> APIError:
    return bad_request(f"the event is not one this function understands: {message}", param, "invalid_event")


def _text(v: object, param: str) -> str:
    """A string field of the event, checked for what later code assumes: a str, valid Unicode."""
    if not isinstance(v, str):
        raise _invalid_event(f"'{param}' must be a string, got {type(v).__name__}", param)
    if SURROGATE.search(v):
        raise _invalid_event(f"'{param}' is not valid Unicode (a lone surrogate)", param)
    return v


def _opt_text(event: dict, name: str, param: str) -> str | None:
    v = event.get(name)
    return None if v is None else _text(v, param)


def _obj(event: dict, name: str, param: str) -> dict:
    v = event.get(name)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _invalid_event(f"'{param}' must be an object, got {type(v).__name__}", param)
    return v


def _scalar_text(v: object, param: str) -> str:
    # header and query values: API Gateway sends strings; a test harness may send numbers
    if isinstance(v, (bool, int, float)):
        return str(v)
    return _text(v, param)


def _lower(headers: dict, param: str = "headers") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers.items():
        name = _text(k, f"{param} (a header name)")
        if v is not None:
            out[name.lower()] = _scalar_text(v, f"{param}.{name}")
    return out


def _query(event: dict) -> dict[str, str]:
    return {_text(k, "queryStringParameters (a name)"): _scalar_text(v, f"queryStringParameters.{k}")
            for k, v in _obj(event, "queryStringParameters", "queryStringParameters").items() if v is not None}


def _decode_body(event: dict) -> bytes | None:
    body = event.get("body")
    if body is None:
        return None
    if not isinstance(body, str):
        if isinstance(body, (dict, list)):      # a test harness handing us an object already
            try:
                body = json.dumps(body)
            except (TypeError, ValueError, RecursionError):
                raise _invalid_event("'body' is an object that is not JSON", "body") from None
        else:
            raise _invalid_event(f"'body' must be a string, got {type(body).__name__}", "body")
    b64 = event.get("isBase64Encoded")
    if b64 is not None and not isinstance(b64, bool):
        raise _invalid_event(f"'isBase64Encoded' must be a boolean, got {type(b64).__name__}", "isBase64Encoded")
    if b64:
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("isBase64Encoded is true but the body is not valid base64", "body",
                              "invalid_body") from None
    if SURROGATE.search(body):
        raise invalid_json("the body is not valid Unicode (a lone surrogate); send UTF-8 text")
    return body.encode("utf-8")


def _strip_stage(path: str, stage: str | None) -> str:
    if stage and stage != "$default" and (path == f"/{stage}" or path.startswith(f"/{stage}/")):
        path = path[len(stage) + 1:] or "/"
    if len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/") or "/"
    return path or "/"


def _epoch_ms(v: object, param: str) -> int | None:
    """API Gateway's receive time (ms since the epoch): a whole, finite number, or absent."""
    if v is None:
        return None
    if isinstance(v, str) and v.strip().isdigit() and len(v.strip()) <= 16:
        return int(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v < 1e16:
        raise _invalid_event(f"'{param}' must be milliseconds since the epoch, got {v!r:.40}", param)
    return int(v)


def kind_of(event) -> str:
    if isinstance(event, dict):
        rc = event.get("requestContext")
        if isinstance(rc, dict):
            if event.get("version") == "2.0" or "http" in rc:
                return "function_url" if ".lambda-url." in str(rc.get("domainName", "")) else "http_api_v2"
            if "httpMethod" in event:
                return "rest_v1"
        elif "httpMethod" in event and "path" in event:
            return "rest_v1"
    return "direct"


def normalise(event) -> Request:
    """Turn any supported event into a ``Request``. Raises ``APIError`` (400) for a broken body
    or an event field of a type or shape it does not understand (never another exception)."""
    kind = kind_of(event)
    if kind in ("http_api_v2", "function_url"):
        rc = _obj(event, "requestContext", "requestContext")
        http = _obj(rc, "http", "requestContext.http")
        path = _opt_text(event, "rawPath", "rawPath") or _opt_text(http, "path", "requestContext.http.path") or "/"
        return Request(
            kind=kind,
            method=(_opt_text(http, "method", "requestContext.http.method") or "GET").upper(),
            path=_strip_stage(path, _opt_text(rc, "stage", "requestContext.stage")),
            headers=_lower(_obj(event, "headers", "headers")),
            query=_query(event),
            raw_body=_decode_body(event),
            received_epoch_ms=_epoch_ms(rc.get("timeEpoch"), "requestContext.timeEpoch"),
            source_ip=_opt_text(http, "sourceIp", "requestContext.http.sourceIp"),
        )
    if kind == "rest_v1":
        rc = _obj(event, "requestContext", "requestContext")
        headers = _lower(_obj(event, "headers", "headers"))
        for k, vs in _obj(event, "multiValueHeaders", "multiValueHeaders").items():
            name = _text(k, "multiValueHeaders (a header name)")
            if not isinstance(vs, list) and vs is not None:
                raise _invalid_event(f"'multiValueHeaders.{name}' must be an array", f"multiValueHeaders.{name}")
            if name.lower() not in headers and vs and vs[-1] is not None:
                headers[name.lower()] = _scalar_text(vs[-1], f"multiValueHeaders.{name}")
        return Request(
            kind=kind,
            method=(_opt_text(event, "httpMethod", "httpMethod") or "GET").upper(),
            path=_strip_stage(_opt_text(event, "path", "path") or "/", None),
            headers=headers,
            query=_query(event),
            raw_body=_decode_body(event),
            received_epoch_ms=_epoch_ms(rc.get("requestTimeEpoch"), "requestContext.requestTimeEpoch"),
            source_ip=_opt_text(_obj(rc, "identity", "requestContext.identity"), "sourceIp",
                                "requestContext.identity.sourceIp"),
        )
    return _direct(event)


def _direct(event) -> Request:
    if not isinstance(event, dict):
        raise APIError(400, f"a direct invoke must be a JSON object (an OpenAI request body), got "
                            f"{type(event).__name__}", "invalid_request_error", None, "invalid_json")
    if "messages" in event:
        return Request(kind="direct", method="POST", path=CHAT, parsed_body=event)
    if "prompt" in event:
        return Request(kind="direct", method="POST", path=COMPLETIONS, parsed_body=event)
    if event.get("source") == "aws.events" or event.get("warmup") is True or not event:
        return Request(kind="direct", method="GET", path="/health", parsed_body=event)
    raise bad_request("a direct invoke needs 'messages' (chat completion) or 'prompt' (completion); "
                      "send {} or an EventBridge schedule event for a health check", None, "invalid_event")


def to_response(kind: str, status: int, body, *, content_type: str = "application/json",
                headers: dict[str, str] | None = None):
    """The response for the event kind. ``body`` is a dict (JSON) or a str (e.g. an SSE stream)."""
    if kind == "direct":
        return body
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if SURROGATE.search(text):      # Lambda must encode the body as UTF-8: escape what cannot be
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    h = {"content-type": content_type}
    if content_type.startswith("text/event-stream"):
        h["cache-control"] = "no-cache"
    h.update(headers or {})
    return {"statusCode": status, "headers": h, "body": text, "isBase64Encoded": False}
