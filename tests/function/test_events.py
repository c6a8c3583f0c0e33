"""Every sample event in events/ normalises to the request the handler should route, and each
event kind gets its own response shape back."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from function import events
from function.errors import APIError
from function.runtime import route_of

EVENTS = Path(__file__).resolve().parents[2] / "events"

# file → (kind, method, path, route or the status route_of raises)
EXPECTED = {
    "chat_http_api.json": ("http_api_v2", "POST", "/v1/chat/completions", "chat"),
    "chat_rest_api.json": ("rest_v1", "POST", "/v1/chat/completions", "chat"),
    "chat_function_url.json": ("function_url", "POST", "/v1/chat/completions", "chat"),
    "chat_base64.json": ("http_api_v2", "POST", "/v1/chat/completions", "chat"),
    "chat_direct.json": ("direct", "POST", "/v1/chat/completions", "chat"),
    "completion.json": ("http_api_v2", "POST", "/v1/completions", "completion"),
    "completion_direct.json": ("direct", "POST", "/v1/completions", "completion"),
    "models.json": ("http_api_v2", "GET", "/v1/models", "models"),
    "health.json": ("http_api_v2", "GET", "/health", "health"),
    "stream.json": ("http_api_v2", "POST", "/v1/chat/completions", "chat"),
    "tools.json": ("http_api_v2", "POST", "/v1/chat/completions", "chat"),
    "bad_json.json": ("http_api_v2", "POST", "/v1/chat/completions", "chat"),
    "wrong_type.json": ("http_api_v2", "POST", "/v1/chat/completions", "chat"),
    "too_long.json": ("http_api_v2", "POST", "/v1/chat/completions", "chat"),
    "n_gt_1.json": ("http_api_v2", "POST", "/v1/chat/completions", "chat"),
    "unknown_route.json": ("http_api_v2", "GET", "/v1/embeddings", 404),
    "wrong_method.json": ("http_api_v2", "GET", "/v1/chat/completions", 405),
    "warmup_schedule.json": ("direct", "GET", "/health", "health"),
}


def load(name: str):
    return json.loads((EVENTS / name).read_text())


def test_every_event_file_is_covered():
    assert sorted(p.name for p in EVENTS.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_event_normalises(name):
    kind, method, path, route = EXPECTED[name]
    req = events.normalise(load(name))
    assert (req.kind, req.method, req.path) == (kind, method, path)
    if isinstance(route, int):
        with pytest.raises(APIError) as ei:
            route_of(req.method, req.path)
        assert ei.value.status == route
    else:
        assert route_of(req.method, req.path)[0] == route


def test_base64_body_decodes_to_the_same_json_as_plain():
    plain = events.normalise(load("chat_http_api.json")).json_body()
    b64 = events.normalise(load("chat_base64.json"))
    assert load("chat_base64.json")["isBase64Encoded"] is True
    assert b64.json_body() == plain


def test_text_parts_event_and_api_gateway_timestamps():
    req = events.normalise(load("chat_rest_api.json"))
    assert req.received_epoch_ms == 1764520800000 and req.headers["content-type"] == "application/json"
    req = events.normalise(load("chat_http_api.json"))
    assert req.received_epoch_ms == 1764520800000 and req.source_ip == "203.0.113.7"


def test_bad_json_is_a_400_that_says_where():
    with pytest.raises(APIError) as ei:
        events.normalise(load("bad_json.json")).json_body()
    assert ei.value.status == 400 and ei.value.code == "invalid_json" and "line 1" in ei.value.message


@pytest.mark.parametrize("body,needle", [
    (None, "empty"), ("[1,2]", "JSON object"), ("\"str\"", "JSON object"), ("{", "Expecting"),
])
def test_bodies_that_are_not_objects(body, needle):
    ev = load("chat_http_api.json")
    ev["body"] = body
    with pytest.raises(APIError) as ei:
        events.normalise(ev).json_body()
    assert ei.value.status == 400 and needle in ei.value.message


def test_invalid_base64_and_invalid_utf8():
    ev = load("chat_base64.json")
    ev["body"] = "***not base64***"
    with pytest.raises(APIError) as ei:
        events.normalise(ev)
    assert ei.value.status == 400 and "base64" in ei.value.message
    ev["body"] = base64.b64encode(b"\xff\xfe{}").decode()
    with pytest.raises(APIError) as ei:
        events.normalise(ev).json_body()
    assert ei.value.status == 400 and "UTF-8" in ei.value.message


def test_named_stage_prefix_and_trailing_slash_are_stripped():
    ev = load("chat_http_api.json")
    ev["requestContext"]["stage"] = "prod"
    ev["rawPath"] = "/prod/v1/chat/completions/"
    assert events.normalise(ev).path == "/v1/chat/completions"


@pytest.mark.parametrize("event,status", [
    ([1, 2], 400), ("hello", 400), ({"foo": 1}, 400),
])
def test_direct_invokes_that_are_not_openai_bodies(event, status):
    with pytest.raises(APIError) as ei:
        events.normalise(event)
    assert ei.value.status == status


def test_empty_direct_invoke_is_a_health_check():
    req = events.normalise({})
    assert (req.kind, req.path) == ("direct", "/health")


def test_response_shapes_per_kind():
    for kind in ("http_api_v2", "function_url", "rest_v1"):
        r = events.to_response(kind, 201, {"a": 1}, headers={"x-request-id": "r"})
        assert r == {"statusCode": 201, "headers": {"content-type": "application/json", "x-request-id": "r"},
                     "body": '{"a":1}', "isBase64Encoded": False}
    assert events.to_response("direct", 200, {"a": 1}) == {"a": 1}
    sse = events.to_response("http_api_v2", 200, "data: [DONE]\n\n", content_type="text/event-stream")
    assert sse["headers"]["content-type"] == "text/event-stream" and sse["headers"]["cache-control"] == "no-cache"


@pytest.mark.parametrize("method,path,result", [
    ("POST", "/v1/chat/completions", "chat"), ("POST", "/v1/completions", "completion"),
    ("GET", "/v1/models", "models"), ("GET", "/health", "health"), ("HEAD", "/health", "health"),
    ("GET", "/v1/models/tiny", "model"), ("DELETE", "/v1/models/tiny", 405),
    ("POST", "/health", 405), ("PUT", "/v1/completions", 405), ("GET", "/", 404), ("POST", "/v2/chat", 404),
])
def test_routes(method, path, result):
    if isinstance(result, int):
        with pytest.raises(APIError) as ei:
            route_of(method, path)
        assert ei.value.status == result and ei.value.body()["error"]["code"] in ("not_found", "method_not_allowed")
    else:
        assert route_of(method, path)[0] == result
