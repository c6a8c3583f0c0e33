"""bench/fleet.py (make bench-fleet) replays its agent trace against servers sharing one S3
snapshot store (moto over real HTTP): here two servers in this process, on the tiny model.
Conversations alternate between the servers, so a next turn finds its prefix in the other
server's snapshots through S3; no timing is asserted."""
from __future__ import annotations

import argparse

import boto3
from moto.server import ThreadedMotoServer

from bench import fleet
from bench.serve import free_port
from function.serve import serve_in_thread
from tests.function.warm import warm_runtime


def test_the_fleet_bench_replays_conversations_across_servers_sharing_s3(tiny_model_path, monkeypatch):
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        url = f"http://127.0.0.1:{port}"
        for k, v in fleet.CREDS.items():
            monkeypatch.setenv(k, v)
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=fleet.BUCKET)
        env = {"SNAPSHOT_S3_URI": f"s3://{fleet.BUCKET}/test", "SNAPSHOT_S3_ENDPOINT_URL": url,
               "STREAM_KEEPALIVE_S": "0"}
        a, b = warm_runtime(tiny_model_path, **env), warm_runtime(tiny_model_path, **env)
        args = argparse.Namespace(conversations=4, turns=3, systems=1, clients=1, tokens=4)
        with serve_in_thread(a) as (url_a, _), serve_in_thread(b) as (url_b, _):
            ports = [int(u.split(":")[2].split("/")[0]) for u in (url_a, url_b)]
            row = fleet.replay(ports, args)
    finally:
        moto.stop()
    assert row["requests"] == 12 and row["ok"] == 12, row
    # one system prompt for all: after the first request, every one resumes from a snapshot; the
    # turns alternate servers, so some come from the other server's uploads
    assert row["hit_rate"] >= 0.5 and row["s3_restores"] >= 1, row
    assert 0 < row["reused_tokens"] < row["prompt_tokens"] and row["ttft_ms_p99"] >= row["ttft_ms_p50"] > 0
    assert sum(row["modes"].values()) == 12 and row["aggregate_tok_s"] > 0
