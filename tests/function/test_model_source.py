"""MODEL_S3_URI: downloaded once to /tmp with progress lines, skipped when intact, fetched again
when the object changed or the local copy is damaged; MODEL_PATH wins; failures say why (moto S3)."""
from __future__ import annotations

import json
import os
from collections import namedtuple

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


# A real-size model: ranged GETs streamed into /tmp with progress, and too small a /tmp names the
# stack parameter to raise.
def test_large_model_downloads_in_ranges_with_progress(s3, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(model_source, "CHUNK_BYTES", 5 * 1024 * 1024)    # a 10 GB file's 64 MB parts, scaled
    monkeypatch.setattr(model_source, "PROGRESS_EVERY_S", 0.0)
    data = os.urandom(13 * 1024 * 1024)
    s3.put_object(Bucket="models", Key="Qwen3.5-0.8B-Q4_K_M.gguf", Body=data)
    ranges = []
    s3.meta.events.register("provide-client-params.s3.GetObject", lambda params, **kw: ranges.append(params.get("Range")))
    r = resolve(FunctionSettings.from_env({"MODEL_S3_URI": "s3://models/Qwen3.5-0.8B-Q4_K_M.gguf", "MODEL_DIR": str(tmp_path)}),
                s3_client=s3)
    assert r.downloaded and open(r.path, "rb").read() == data
    assert len(ranges) == 3 and all(x and x.startswith("bytes=") for x in ranges), ranges
    ev = [json.loads(x) for x in capsys.readouterr().out.splitlines() if '"model_download"' in x]
    done = [e["bytes_done"] for e in ev if "bytes_done" in e]
    assert done == sorted(done) and 0 < done[0] < len(data) and done[-1] == len(data)
    assert ev[-1]["progress"] == 1.0 and ev[-1]["mb_per_s"] > 0


def test_too_little_tmp_names_the_parameter(s3, tmp_path, monkeypatch):
    s3.put_object(Bucket="models", Key="m.gguf", Body=b"x" * 4096)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(model_source.shutil, "disk_usage", lambda p: usage(10_000, 9_000, 1_000))
    with pytest.raises(ModelSourceError, match="EphemeralStorageMB") as exc:
        resolve(FunctionSettings.from_env({"MODEL_S3_URI": "s3://models/m.gguf", "MODEL_DIR": str(tmp_path)}), s3_client=s3)
    assert "EphemeralStorageMB" in exc.value.public and "s3://" not in exc.value.public


@pytest.mark.parametrize("how", ["flag", "snapstart"])
def test_a_snapstart_init_downloads_into_memory_in_ranges(s3, tmp_path, monkeypatch, how):
    # a SnapStart snapshot may hold at most 512 MB of /tmp: the model goes to memory, not MODEL_DIR
    monkeypatch.setattr(model_source, "CHUNK_BYTES", 5 * 1024 * 1024)
    data = os.urandom(13 * 1024 * 1024)
    s3.put_object(Bucket="models", Key="m.gguf", Body=data)
    ranges = []
    s3.meta.events.register("provide-client-params.s3.GetObject", lambda params, **kw: ranges.append(params.get("Range")))
    env = {"MODEL_S3_URI": "s3://models/m.gguf", "MODEL_DIR": str(tmp_path / "tmp"),
           **({"MODEL_IN_MEMORY": "true"} if how == "flag" else {"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"})}
    r = resolve(FunctionSettings.from_env(env), s3_client=s3)
    assert r.data is not None and bytes(r.data) == data and r.path == "s3://models/m.gguf" and r.bytes == len(data)
    assert len(ranges) == 3 and not (tmp_path / "tmp").exists()


def test_in_memory_is_off_for_an_ordinary_init_and_checked():
    assert not FunctionSettings.from_env({"AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand"}).model_in_memory
    assert not FunctionSettings.from_env({"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start",
                                          "MODEL_IN_MEMORY": "false"}).model_in_memory
    with pytest.raises(ValueError, match="MODEL_IN_MEMORY"):
        FunctionSettings.from_env({"MODEL_IN_MEMORY": "maybe"})
