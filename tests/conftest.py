"""Shared fixtures: factory models built once per test session (tiny builds in well under 1 s)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".numba_cache"))
os.environ.setdefault("WARMLLM_THREADS", "2")


@pytest.fixture(scope="session")
def model_factory(tmp_path_factory):
    """make(preset="tiny", weights="F32", seed=0, head=None, vocab="factory") → path, cached per
    arguments."""
    from engine.synthetic.factory import make_model

    root = tmp_path_factory.mktemp("models")
    built: dict[tuple, Path] = {}

    def make(preset: str = "tiny", weights: str = "F32", seed: int = 0, head: str | None = None,
             vocab: str = "factory") -> Path:
        key = (preset, weights, seed, head, vocab)
        if key not in built:
            tied = None if head is None else head == "tied"
            name = f"{preset}-{weights}-{seed}-{head}" + ("" if vocab == "factory" else f"-{vocab}")
            built[key] = make_model(root / f"{name}.gguf", preset, weights, seed, tied, vocab=vocab)
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_model_path(model_factory) -> Path:
    return model_factory("tiny", "F32")


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_path):
    from engine.generate import Engine

    from engine.settings import Settings

    return Engine.load(str(tiny_model_path), settings=Settings.from_env(os.environ))


@pytest.fixture
def moto_s3(monkeypatch):
    """moto's in-process S3 with the bucket "snaps", and fake credentials so boto3 signs nothing real."""
    from moto import mock_aws

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        import boto3

        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="snaps")
        yield client
