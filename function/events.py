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
from dataclasses import dataclass, field

from .errors import APIError, bad_request, invalid_json

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

    def json_body(self) -> dict:
        """The body as a JSON object, or a 400 that says what is wrong with it."""
        if self.parsed_body is not None:
            body = self.parsed_body
        else:
            if not self.raw_body:
                raise invalid_json("the body is empty; send a JSON object")
            try:
                text = self.raw_body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise invalid_json(f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
            try:
                body = json.loads(text)
            except json.JSONDecodeError as exc:
                raise invalid_json(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
        if not isinstance(body, dict):
            raise invalid_json(f"expected a JSON object, got {type(body).__name__}")
        return body


def _lower(headers: dict | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in (headers or {}).items():
        if isinstance(k, str) and v is not None:
            out[k.lower()] = v if isinstance(v, str) else str(v)
    return out


def _decode_body(event: dict) -> bytes | None:
    body = event.get("body")
    if body is None:
        return None
    if not isinstance(body, str):      # a test harness handing us an object already
        body = json.dumps(body)
    if event.get("isBase64Encoded"):
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("isBase64Encoded is true but the body is not valid base64", None,
                              "invalid_body") from None
    return body.encode("utf-8")


def _strip_stage(path: str, stage: str | None) -> str:
    if stage and stage != "$default" and (path == f"/{stage}" or path.startswith(f"/{stage}/")):
        path = path[len(stage) + 1:] or "/"
    if len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/") or "/"
    return path or "/"


def _int_or_none(v) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def kind_of(event) -> str:
    if isinstance(event, dict):
        rc = event.get("requestContext")
        if isinstance(rc, dict):
            if event.get("version") == "2.0" or isinstance(rc.get("http"), dict):
                return "function_url" if ".lambda-url." in str(rc.get("domainName", "")) else "http_api_v2"
            if "httpMethod" in event:
                return "rest_v1"
        elif "httpMethod" in event and "path" in event:
            return "rest_v1"
    return "direct"


def normalise(event) -> Request:
    """Turn any supported event into a ``Request``. Raises ``APIError`` (400) for a broken body."""
    kind = kind_of(event)
    if kind in ("http_api_v2", "function_url"):
        rc = event.get("requestContext") or {}
        http = rc.get("http") or {}
        path = event.get("rawPath") or http.get("path") or "/"
        return Request(
            kind=kind,
            method=str(http.get("method") or "GET").upper(),
            path=_strip_stage(path, rc.get("stage")),
            headers=_lower(event.get("headers")),
            query={k: str(v) for k, v in (event.get("queryStringParameters") or {}).items()},
            raw_body=_decode_body(event),
            received_epoch_ms=_int_or_none(rc.get("timeEpoch")),
            source_ip=http.get("sourceIp"),
        )
    if kind == "rest_v1":
        rc = event.get("requestContext") or {}
        headers = _lower(event.get("headers"))
        for k, vs in (event.get("multiValueHeaders") or {}).items():
            if isinstance(k, str) and k.lower() not in headers and vs:
                headers[k.lower()] = str(vs[-1])
        return Request(
            kind=kind,
            method=str(event.get("httpMethod") or "GET").upper(),
            path=_strip_stage(event.get("path") or "/", None),
            headers=headers,
            query={k: str(v) for k, v in (event.get("queryStringParameters") or {}).items()},
            raw_body=_decode_body(event),
            received_epoch_ms=_int_or_none(rc.get("requestTimeEpoch")),
            source_ip=(rc.get("identity") or {}).get("sourceIp"),
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
    h = {"content-type": content_type}
    if content_type.startswith("text/event-stream"):
        h["cache-control"] = "no-cache"
    h.update(headers or {})
    return {"statusCode": status, "headers": h, "body": text, "isBase64Encoded": False}
