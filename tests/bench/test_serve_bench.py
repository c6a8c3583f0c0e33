"""bench/serve.py (make bench-serve) measures what it says, on the tiny model and a server in this
process: closed-loop concurrency and Poisson arrivals give every request exactly --tokens tokens
(end banned), aggregate rates, time-between-token and TTFT percentiles; no timing is asserted."""
from __future__ import annotations

from bench import serve as bench_serve
from function.serve import serve_in_thread
from tests.function.warm import warm_runtime


def test_the_serve_bench_measures_streams_and_arrivals(tiny_model_path):
    rt = warm_runtime(tiny_model_path, STREAM_KEEPALIVE_S="0")
    bias = bench_serve.eog_bias(tiny_model_path)

    def bodies(i: int) -> dict:
        return {"model": "bench", "prompt": bench_serve.prompt(i, 12), "max_tokens": 6, "temperature": 0.0,
                "stream": True, "logit_bias": bias}
    with serve_in_thread(rt) as (url, _):
        host, port = url.split("//")[1].split("/")[0].split(":")
        row = bench_serve.closed_loop(host, int(port), bodies, 3, 2, 6)
        arrivals = bench_serve.poisson(host, int(port), bodies, rate=4.0, duration_s=1.0, tokens=6)
    assert row["concurrency"] == 3 and row["requests"] == 6 and row["ok"] == 6, row
    # a chunk per token, but a token that ends inside a UTF-8 character sends its text with the next
    assert 1 <= row["chunks_per_stream"] <= 6 and row["aggregate_tok_s"] > 0
    assert row["tbt_ms_p50"] is not None and row["tbt_ms_p99"] >= row["tbt_ms_p50"]
    assert row["ttft_ms_p99"] >= row["ttft_ms_p50"] > 0
    assert arrivals["requests"] >= 1 and arrivals["ok"] == arrivals["requests"], arrivals
    assert bench_serve.percentile([5.0, 1.0, 3.0], 50) == 3.0 and bench_serve.percentile([], 99) is None
