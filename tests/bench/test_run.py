"""bench/run.py's combination of alternating rounds (the receipt's figures)."""
from bench.run import agent_summary, best_of


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


def _agent_round(a, b, c_dir, turn1=7000.0):
    case = lambda r: {"ttft_ms": r * turn1, "restore_ms": 1.0, "prefilled_tokens": 27, "mode": "snapshot_memory"}  # noqa: E731
    return {"turn1": {"ttft_ms": turn1}, "a": case(a), "b": case(b), "c_dir": case(c_dir),
            "ratios": {"a": a, "b": b, "c_dir": c_dir}, "snapshot_writes": [{"bytes": 33_000_000}, {"bytes": 26_000_000}]}


def test_agent_summary_takes_the_median_round_against_each_goal():
    rounds = [_agent_round(0.09, 0.12, 0.15), _agent_round(0.11, 0.09, 0.16), _agent_round(0.08, 0.13, 0.30),
              {"error": "moto died"}]
    s = agent_summary(rounds)
    assert s["rounds"] == 3 and s["turn1_ttft_ms"] == 7000.0
    assert s["a"]["median_ratio"] == 0.09 and s["a"]["met"] and (s["a"]["min"], s["a"]["max"]) == (0.08, 0.11)
    assert s["b"]["median_ratio"] == 0.12 and not s["b"]["met"]
    assert s["c_dir"]["median_ratio"] == 0.16 and s["c_dir"]["met"] and "c_s3" not in s
    assert s["snapshot_bytes"] == {"min": 26_000_000, "max": 33_000_000}
    assert agent_summary([{"error": "moto died"}]) == {"error": "moto died"}


def test_large_mode_measures_the_4b_and_9b_files_natively_and_nothing_else():
    from bench.run import LARGE_RUNS, parse_args, plan

    large = plan(parse_args(["--large"]))
    assert large.runs == LARGE_RUNS == (("4b", "Q4_K_M"), ("9b", "Q3_K_M"), ("9b", "IQ4_XS"))
    assert large.modes == ("native",) and large.extra_pp == "" and large.agent_rounds == 0
    assert plan(parse_args(["--large", "--modes", "native,avx2"])).modes == ("native", "avx2")
    default = plan(parse_args([]))
    assert default.runs == (("0.8b", "Q4_K_M"), ("0.8b", "Q8_0")) and default.extra_pp == "2048"
    assert default.modes == ("native", "avx2", "native-pinned") and default.agent_rounds == 3
    # every large run is a preset and a scheme the factory knows
    from engine.synthetic.factory import PRESETS, WEIGHT_SCHEMES
    assert all(p in PRESETS and w in WEIGHT_SCHEMES for p, w in large.runs)


def test_real_mode_adds_the_real_model_or_measures_it_alone(tmp_path, monkeypatch):
    from bench import run
    from function import real_model

    also = run.plan(run.parse_args(["--real"]))
    assert also.runs == (("0.8b", "Q4_K_M"), ("0.8b", "Q8_0"), ("real", "Q4_K_M")) and also.agent_rounds == 3
    only = run.plan(run.parse_args(["--real", "only", "--modes", "native"]))
    assert only.runs == (("real", "Q4_K_M"),) and only.modes == ("native",)
    assert only.agent_rounds == 0 and only.constrained_rounds == 0   # those are the factory files' figures
    # the real model's file: fetched (verified) and linked where make real-model puts it
    cached = tmp_path / "cache.gguf"
    cached.write_bytes(b"GGUF")
    monkeypatch.setattr(run, "ROOT", tmp_path)
    monkeypatch.setattr(real_model, "fetch", lambda: cached)
    path = run.model_path("real", "Q4_K_M")
    assert path == tmp_path / real_model.DEFAULT_OUT and path.read_bytes() == b"GGUF"


def test_large_mode_leaves_out_the_slow_figures_and_can_take_a_subset():
    from bench.run import parse_args, plan

    large = plan(parse_args(["--large"]))
    assert large.quick and large.constrained_rounds == 0
    assert not plan(parse_args([])).quick and plan(parse_args([])).constrained_rounds == 2
    only = plan(parse_args(["--large", "--large-only", "9b:IQ4_XS,4b:Q4_K_M"]))
    assert only.runs == (("4b", "Q4_K_M"), ("9b", "IQ4_XS"))  # in LARGE_RUNS' order
    import pytest
    with pytest.raises(SystemExit, match="9b:Q8_0"):
        plan(parse_args(["--large", "--large-only", "9b:Q8_0"]))


def test_rss_goal_grows_the_kv_cache_to_8k_tokens(model_factory):
    from bench.run import KV_GOAL_TOKENS, kv_bytes, rss_goal

    path = model_factory("tiny", "Q8_0")  # 4 layers, one attention layer: 1 KV head of 128
    assert kv_bytes(path, 10) == 2 * 1 * 1 * 128 * 4 * 10
    run = {"model_bytes": 100 * 2**20, "ours": {"peak_rss_mb": 150.0}}
    g = rss_goal(run, path, 512)
    grown = (kv_bytes(path, KV_GOAL_TOKENS) - kv_bytes(path, 512)) / 2**20
    assert g["peak_rss_mb_at_kv_tokens"] == round(150.0 + grown, 1)
    assert g["budget_mb"] == round(1.1 * (100 * 2**20 + kv_bytes(path, KV_GOAL_TOKENS)) / 2**20, 1)
    assert g["met"] is False  # 150 MB against a 100 MB file: over 1.1x


def test_image_mode_compiles_ours_as_the_x86_64_image_does_on_this_cpu(monkeypatch):
    import platform

    import pytest

    from bench.run import PINS, _mode_env
    from function import numba_cache

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86_64 image's levels")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    vnni = frozenset(dict(numba_cache.X86_LEVELS)["cascadelake"])
    for flags, want in ((vnni, "cascadelake"), (frozenset({"avx2", "fma", "f16c", "bmi2"}), "x86-64-v3")):
        monkeypatch.setattr(numba_cache, "cpu_flags", lambda flags=flags: flags)
        env, variant = _mode_env("image", 2)
        assert (env["NUMBA_CPU_NAME"], env["NUMBA_CPU_FEATURES"], variant) == (want, "", "native")
        assert not any(k in env for k in PINS)
    monkeypatch.setattr(numba_cache, "cpu_flags", lambda: frozenset({"sse2"}))
    with pytest.raises(SystemExit, match="none of the x86_64 image's levels"):
        _mode_env("image", 2)


def test_on_a_graviton_bench_runs_ours_as_the_arm64_image_would(monkeypatch):
    """docs/arm64.md's recipe for a real Graviton: `make bench` there measures the image's level."""
    import platform

    from bench import run
    from function import numba_cache

    assert run.default_modes("aarch64") == "image"
    assert run.default_modes("x86_64") == "native,avx2,native-pinned"
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    for flags, want in ((frozenset({"asimddp", "i8mm", "sve"}), ("neoverse-v1", numba_cache.ARM64_V1_FEATURES)),
                        (frozenset({"asimddp"}), ("neoverse-n1", ""))):
        monkeypatch.setattr(numba_cache, "cpu_flags", lambda flags=flags: flags)
        env, variant = run._mode_env("image", 2)
        assert (env["NUMBA_CPU_NAME"], env["NUMBA_CPU_FEATURES"]) == want and variant == "native"
    monkeypatch.setattr(numba_cache, "cpu_flags", lambda: frozenset({"asimd"}))  # no dot products
    import pytest
    with pytest.raises(SystemExit, match="none of the arm64 image's levels"):
        run._mode_env("image", 2)


def test_peers_are_best_of_rounds_and_ratios_are_ours_over_theirs():
    from bench.run import peer_ratios, peer_summary

    runs = [{"engine": "ik_llama.cpp", "package": "ik-llama-cpp-python==0.1.5", "variant": "native",
             "options": ["-rtr", "1"], "figures": {"pp512": 330.0, "tg128": 50.0, "tg128@d4096": 40.0}},
            {"engine": "ik_llama.cpp", "package": "ik-llama-cpp-python==0.1.5", "variant": "native",
             "options": ["-rtr", "1"], "figures": {"pp512": 338.0, "tg128": 48.0}},
            {"error": "llama-bench failed"}]
    s = peer_summary(runs)
    assert s["figures"] == {"pp512": 338.0, "tg128": 50.0, "tg128@d4096": 40.0}
    assert s["package"] == "ik-llama-cpp-python==0.1.5" and s["options"] == ["-rtr", "1"]
    assert peer_summary([{"error": "x"}]) == {"error": "x"}
    ours = {"pp_tok_s": 213.0, "tg_tok_s": 40.0, "tg_tok_s@d4096": 30.0, "pp_tok_s@d4096": 100.0}
    r = peer_ratios(ours, s["figures"], 512, 128, (4096,))
    assert r == {"pp512": round(213 / 338, 3), "tg128": 0.8, "tg128@d4096": 0.75}   # no pp512@d4096 of theirs


def test_bandwidth_figures_put_each_decode_against_the_read_bandwidth(model_factory):
    from bench.bandwidth import decode_bytes_per_token
    from bench.run import bandwidth_figures

    model = model_factory("tiny", "Q8_0", 0)
    bpt = decode_bytes_per_token(model)
    out = bandwidth_figures(model, {"tg_tok_s": 100.0}, {"ik": {"figures": {"tg128": 200.0}}, "mainline": {}},
                            128, bpt * 400.0)
    assert out["decode_bytes_per_token"] == bpt and out["ours"] == 0.25 and out["ik"] == 0.5
    assert "mainline" not in out


def test_depths_default_to_4096_and_can_be_more_or_none():
    from bench.run import parse_args, plan

    assert plan(parse_args([])).depths == (4096,)
    assert plan(parse_args(["--depths", "4096,32768"])).depths == (4096, 32768)
    assert plan(parse_args(["--depths", ""])).depths == ()
