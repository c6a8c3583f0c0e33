"""bench/run.py's combination of alternating rounds (the receipt's figures)."""
from bench.run import best_of


def test_best_of_rounds_takes_each_figure_on_its_own_terms():
    rounds = [
        {"pp_tok_s": 80.0, "tg_tok_s": 14.0, "ttft_ms": 5200.0, "peak_rss_mb": 930.0,
         "token_by_token_prefill_tok_s": 16.0, "batched_over_token_by_token": 5.0, "threads": 2},
        {"pp_tok_s": 88.0, "tg_tok_s": 13.0, "ttft_ms": 5600.0, "peak_rss_mb": 941.0,
         "token_by_token_prefill_tok_s": 15.0, "batched_over_token_by_token": 5.87, "threads": 2},
        {"error": "crashed"},
    ]
    got = best_of(rounds)
    assert got["pp_tok_s"] == 88.0 and got["tg_tok_s"] == 14.0 and got["ttft_ms"] == 5200.0
    assert got["peak_rss_mb"] == 941.0  # the largest: memory is not a best-of
    assert got["batched_over_token_by_token"] == 5.5  # recomputed from the reported figures
    assert got["threads"] == 2 and "error" not in got
    assert best_of([{"error": "x"}]) == {"error": "x"}
