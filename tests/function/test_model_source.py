"""MODEL_S3_URI: downloaded once to /tmp with progress lines, skipped when intact, fetched again
when the object changed or the local copy is damaged; MODEL_PATH wins; failures say why (moto S3)."""
from __future__ import annotations

import json
import os

import boto3
import pytest
from moto import mock_aws

from function import model_source
from function.settings import FunctionSettings
from function.model_source import ModelSourceError, resolve


@pytest.fixture
def s3(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "testing")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="models")
        yield client


def events(capsys, name="model_download"):
    return [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")
            and json.loads(x).get("event") == name]


def test_download_once_then_skip_then_refetch_on_change(s3, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(model_source, "PROGRESS_EVERY_S", 0.0)
    data = os.urandom(300_000)
    s3.put_object(Bucket="models", Key="qwen/m.gguf", Body=data)
    env = {"MODEL_S3_URI": "s3://models/qwen/m.gguf", "MODEL_DIR": str(tmp_path)}
    r = resolve(FunctionSettings.from_env(env), s3_client=s3)
    assert r.downloaded and r.source == "s3" and r.path == str(tmp_path / "m.gguf")
    assert open(r.path, "rb").read() == data and not os.path.exists(r.path + ".part")
    ev = events(capsys)
    assert ev[0]["progress"] == 0.0 and ev[-1]["progress"] == 1.0 and "download_ms" in ev[-1]
    assert any(0 < e.get("bytes_done", 0) for e in ev)

    r2 = resolve(FunctionSettings.from_env(env), s3_client=s3)
    assert not r2.downloaded and events(capsys)[0]["skipped"] is True

    s3.put_object(Bucket="models", Key="qwen/m.gguf", Body=data[::-1])      # same size, new ETag
    r3 = resolve(FunctionSettings.from_env(env), s3_client=s3)
    assert r3.downloaded and open(r3.path, "rb").read() == data[::-1]

    with open(r3.path, "ab") as f:                                           # damaged local copy
        f.write(b"x")
    assert resolve(FunctionSettings.from_env(env), s3_client=s3).downloaded


def test_failures_say_why(s3, tmp_path):
    with pytest.raises(ModelSourceError, match="cannot read s3://models/missing.gguf"):
        resolve(FunctionSettings.from_env({"MODEL_S3_URI": "s3://models/missing.gguf", "MODEL_DIR": str(tmp_path)}), s3_client=s3)
    with pytest.raises(ModelSourceError, match="must look like"):
        resolve(FunctionSettings.from_env({"MODEL_S3_URI": "https://example/m.gguf"}), s3_client=s3)
    with pytest.raises(ModelSourceError, match="no model configured"):
        resolve(FunctionSettings.from_env({}))
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve(FunctionSettings.from_env({"MODEL_PATH": str(tmp_path / "nope.gguf")}))


def test_model_path_wins(tmp_path):
    p = tmp_path / "local.gguf"
    p.write_bytes(b"GGUF")
    r = resolve(FunctionSettings.from_env({"MODEL_PATH": str(p), "MODEL_S3_URI": "s3://models/x.gguf"}))
    assert r.source == "path" and r.path == str(p) and not r.downloaded
