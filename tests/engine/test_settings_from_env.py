"""One settings object, read from the environment at the edges with one parser: unset or
empty is the default, anything else parses or is an error naming the variable and the fix."""
from __future__ import annotations

import pytest

from engine.settings import Settings, SnapshotSettings, env_value
from function.settings import FunctionSettings


def test_defaults_when_nothing_is_set():
    s = FunctionSettings.from_env({})
    assert s == FunctionSettings() and s.engine == Settings() and s.engine.snapshots == SnapshotSettings()
    assert s.engine.threads is None and s.engine.prefill_chunk == 512 and s.engine.n_ctx == 32768
    assert s.model_source is None


def test_every_variable_reaches_its_field():
    env = {"WARMLLM_THREADS": "3", "WARMLLM_N_CTX": "4096", "WARMLLM_PREFILL_CHUNK": "128",
           "SNAPSHOT_EVERY": "64", "SNAPSHOT_DIR": "/mnt/efs", "MODEL_PATH": "/m.gguf", "MODEL_DIR": "/d",
           "WARMLLM_API_KEY": "k", "API_DEADLINE_S": "10", "DEADLINE_MARGIN_S": "0", "MODEL_RETRY_S": "5",
           "INIT_BUDGET_S": "2.5", "WARMLLM_MAX_NUM_SEQS": "8", "WARMLLM_BATCH_PREFILL_CHUNK": "32",
           "WARMLLM_BATCH_EXACT": "yes", "WARMLLM_BATCH_PREFILL_RATIO": "0"}
    s = FunctionSettings.from_env(env)
    assert (s.engine.threads, s.engine.n_ctx, s.engine.prefill_chunk) == (3, 4096, 128)
    e = s.engine
    assert (e.max_num_seqs, e.batch_prefill_chunk, e.batch_exact, e.batch_prefill_ratio) == (8, 32, True, 0.0)
    assert s.engine.snapshots.every == 64 and s.engine.snapshots.dir == "/mnt/efs"
    assert (s.model_path, s.model_dir, s.api_key, s.model_source) == ("/m.gguf", "/d", "k", "path")
    assert (s.api_deadline_s, s.deadline_margin_s, s.model_retry_s, s.init_budget_s) == (10.0, 0.0, 5.0, 2.5)


@pytest.mark.parametrize("name,bad", [("WARMLLM_PREFILL_CHUNK", "0"), ("WARMLLM_N_CTX", "lots"),
                                      ("SNAPSHOT_MEMORY_MB", "-1"), ("SNAPSHOT_EVERY", "1.5"),
                                      ("MODEL_RETRY_S", "soon"), ("WARMLLM_MAX_NUM_SEQS", "0"),
                                      ("WARMLLM_BATCH_EXACT", "maybe"), ("WARMLLM_BATCH_PREFILL_RATIO", "-1")])
def test_an_invalid_value_names_the_variable_and_the_fix(name, bad):
    with pytest.raises(ValueError, match=rf"^{name}='{bad}' is invalid: set it to .*, or unset it for the default"):
        FunctionSettings.from_env({name: bad})


def test_blank_is_the_default():
    assert env_value({"X": "  "}, "X", int, 7, takes="an int") == 7


def test_the_runtime_takes_its_settings_whole(tmp_path):
    from function.runtime import Runtime

    rt = Runtime.from_env({"MODEL_PATH": str(tmp_path / "m.gguf"), "WARMLLM_PREFILL_CHUNK": "64",
                           "MODEL_RETRY_S": "1"})
    assert rt.settings.engine.prefill_chunk == 64 and rt.retry_s == 1.0
