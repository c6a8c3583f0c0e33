"""`python -m engine …` as a user runs it: JSON out, one-line errors with a non-zero exit."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def cli(*args):
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True)


def test_tokenize_parses_special_tokens(tiny_model_path, tiny_engine):
    r = cli("tokenize", "--model", str(tiny_model_path), "--text", "hi<|im_end|>")
    assert r.returncode == 0, r.stderr
    ids = json.loads(r.stdout)["ids"]
    assert ids[-1] == tiny_engine.tokenizer.token_id("<|im_end|>")
    assert ids == tiny_engine.tokenizer.encode("hi<|im_end|>")


def test_logits_last_and_all(tiny_model_path, tiny_engine):
    last = json.loads(cli("logits", "--model", str(tiny_model_path), "--tokens", "1,2,3").stdout)
    every = json.loads(cli("logits", "--model", str(tiny_model_path), "--tokens", "1,2,3", "--all").stdout)
    assert last["n_vocab"] == tiny_engine.model.config.n_vocab == len(last["logits"])
    assert np.array(every["logits"]).shape == (3, last["n_vocab"])
    assert np.allclose(every["logits"][-1], last["logits"], atol=1e-4)


def test_generate_json_is_greedy_and_timed(tiny_model_path):
    r = cli("generate", "--model", str(tiny_model_path), "--prompt", "hello", "--max-tokens", "5", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["completion_tokens"] == len(out["ids"]) <= 5
    assert out["prefill_mode"] == "batched" and out["finish_reason"] in ("stop", "length")
    assert {"load_ms", "prefill_ms", "decode_ms"} <= set(out["timings"])
    again = json.loads(cli("generate", "--model", str(tiny_model_path), "--prompt", "hello", "--max-tokens", "5",
                           "--json").stdout)
    assert again["ids"] == out["ids"]  # temperature 0 by default: reproducible


def test_make_model_and_info(tmp_path):
    p = tmp_path / "m.gguf"
    r = cli("make-model", "--preset", "tiny", "--weights", "Q8_0", "--seed", "3", "--out", str(p))
    assert r.returncode == 0, r.stderr
    info = json.loads(cli("info", "--model", str(p)).stdout)
    assert info["architecture"] == "qwen35" and info["config"]["n_layer"] == 4
    assert info["tensor_types"]["Q8_0"] > 0 and info["tensor_types"]["F32"] > 0


@pytest.mark.parametrize("args, message", [
    (["logits", "--tokens", "1,x"], "--tokens must be comma-separated integers"),
    (["logits", "--tokens", "1,999999"], "outside the vocabulary"),
    (["generate"], "give --prompt TEXT or --messages JSON"),
])
def test_errors_are_one_line(tiny_model_path, args, message):
    r = cli(args[0], "--model", str(tiny_model_path), *args[1:])
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and message in r.stderr


def test_make_model_rejects_unknown_preset(tmp_path):
    r = cli("make-model", "--preset", "huge", "--out", str(tmp_path / "x.gguf"))
    assert r.returncode == 1 and "preset 'huge' is unknown" in r.stderr


def test_warm_kernels_verb_builds_and_runs_a_factory_model_per_scheme():
    # F32 runs on numpy alone: the verb's plumbing without compiling the quant kernels here
    r = cli("warm-kernels", "--weights", "F32")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    assert [(l["event"], l["weights"]) for l in lines] == [("warm_kernels", "F32")] and lines[0]["total_ms"] > 0


def test_image_kernel_cache_covers_the_4b_and_9b_files_formats():
    """The image's warm-kernels run (the Dockerfile uses the default list) builds warm-up models
    holding every tensor type of the files `make bench --large` measures: 4B Q4_K_M and the 9B
    Q3_K_M / IQ4_XS a 10 GB function serves, so none of their kernels compiles at cold start
    (with Q4_K_M,Q8_0,F32 alone, Q3_K, Q5_K and IQ4_XS did, ~10 s each on 2 vCPU)."""
    import re

    from bench.run import LARGE_RUNS
    from engine.synthetic.factory import PRESETS, stored_types, tensor_specs
    from engine.synthetic.warm_kernels import DEFAULT_WEIGHTS, covered_types

    covered = covered_types(DEFAULT_WEIGHTS.split(","))
    for preset, weights in LARGE_RUNS:
        p = PRESETS[preset]
        need = set(stored_types(p, weights, tensor_specs(p, 0)))
        assert need <= covered, (preset, weights, sorted(t.name for t in need - covered))
    # the Dockerfile's `python -m function.numba_cache build` runs warm-kernels once per CPU level
    import inspect

    from function import numba_cache

    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    assert re.search(r"python -m function\.numba_cache build[^;]*;", dockerfile)
    warm = inspect.signature(numba_cache.build).parameters["warm"].default
    assert warm[-2:] == ("engine", "warm-kernels"), "the image build must use DEFAULT_WEIGHTS"
