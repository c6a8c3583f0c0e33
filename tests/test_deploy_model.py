"""A real-size model from S3 (moto): the download is ranged GETs streamed into /tmp with progress
lines, and too small a /tmp says which stack parameter to raise."""
from __future__ import annotations

import json
import os
from collections import namedtuple

import boto3
import pytest
from moto import mock_aws

from function import model_source
from function.model_source import ModelSourceError, resolve
from function.settings import FunctionSettings


@pytest.fixture
def s3(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "testing")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="models")
        yield client


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
