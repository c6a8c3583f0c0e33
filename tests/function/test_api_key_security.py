"""What a caller without the API key can learn (issue 18 item 6): /health's status only, a 401
for every other path (known or not, before any 404/405), and an empty key is an init error."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from function.runtime import Runtime
from function.settings import FunctionSettings

ROOT = Path(__file__).resolve().parents[2]


def http(path: str, method: str = "GET", key: str | None = None) -> dict:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return {"version": "2.0", "rawPath": path, "headers": headers,
            "requestContext": {"http": {"method": method, "path": path}, "timeEpoch": int(time.time() * 1000)}}


def answer(rt, ev):
    resp = rt.handle(ev)
    return resp["statusCode"], json.loads(resp["body"])


@pytest.fixture
def keyed(tmp_path):
    bad = tmp_path / "models" / "broken.gguf"           # a load error whose message holds a path
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    rt = Runtime(FunctionSettings(model_path=str(bad), api_key="s3cret", init_budget_s=30))
    rt.start_init()
    return rt


def test_health_without_the_key_says_only_the_status(keyed, tmp_path):
    status, body = answer(keyed, http("/health"))
    assert status == 503 and body == {"status": "unavailable"}
    status, body = answer(keyed, http("/health", key="wrong"))
    assert body == {"status": "unavailable"}
    status, body = answer(keyed, http("/health", key="s3cret"))     # the detailed form behind the key
    assert status == 503 and body["reason"] and body["model_source"] == "path"
    assert str(tmp_path) not in json.dumps(body)                    # even then, no internal path


def test_health_without_a_key_configured_is_detailed(tmp_path):
    rt = Runtime(FunctionSettings(model_path=str(tmp_path / "none.gguf")))
    status, body = answer(rt, http("/health"))
    assert status == 503 and "reason" in body


@pytest.mark.parametrize("path,method", [("/nope", "GET"), ("/v1/chat/completions", "GET"), ("/", "POST"),
                                         ("/v1/models/x", "DELETE"), ("/v1/completions", "POST")])
def test_unknown_routes_answer_401_before_404_when_a_key_is_set(keyed, path, method):
    status, body = answer(keyed, http(path, method))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = answer(keyed, http(path, method, key="s3cret"))
    assert status in (400, 404, 405, 503), body                    # with the key: the route's own answer


def test_empty_api_key_is_an_init_error():
    with pytest.raises(ValueError, match="WARMLLM_API_KEY is set but empty"):
        FunctionSettings.from_env({"WARMLLM_API_KEY": ""})
    with pytest.raises(ValueError, match="WARMLLM_API_KEY"):
        Runtime.from_env({"WARMLLM_API_KEY": "  "})
    assert FunctionSettings.from_env({}).api_key is None
    assert FunctionSettings.from_env({"WARMLLM_API_KEY": "k"}).api_key == "k"


@pytest.mark.parametrize("name", ["template.yaml", "template-zip.yaml"])
def test_templates_leave_the_key_unset_rather_than_empty(name):
    text = (ROOT / name).read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("WARMLLM_API_KEY:"))
    assert "AWS::NoValue" in line and "HasApiKey" in line
    assert 'HasApiKey: !Not [!Equals [!Ref ApiKey, ""]]' in text
