"""Bad files get one clear error naming the problem, never a traceback from deep inside numpy."""
import json
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFWriter

from engine.errors import ModelLoadError
from engine.gguf_file import GGUFFile
from engine import models
from engine.models.qwen2 import Qwen2
from engine.models.qwen35 import Qwen35


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        GGUFFile(p)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        GGUFFile(tmp_path / "nope.gguf")


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated(tmp_path, tiny_model_path, keep):
    data = tiny_model_path.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match="truncated"):
        Qwen35(GGUFFile(p))


def test_truncated_inside_header(tmp_path, tiny_model_path):
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny_model_path.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match="truncated|damaged"):
        GGUFFile(p)


def _write(tmp_path, arch, tensors):
    p = tmp_path / f"{arch}.gguf"
    w = GGUFWriter(str(p), arch)
    for name, arr, qtype in tensors:
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return p


def test_unsupported_architecture_lists_the_supported(tmp_path):
    p = _write(tmp_path, "llama", [("token_embd.weight", np.zeros((4, 8), np.float32), None)])
    with pytest.raises(ModelLoadError, match="'llama' is not supported; supported: qwen35"):
        Qwen35(GGUFFile(p))
    # the registry (what Engine.load and `engine info` go through) says the same, before any weight
    for load in (models.load_model, models.load_config, models.load_conventions):
        with pytest.raises(ModelLoadError, match="'llama' is not supported; supported: qwen2, qwen3, qwen35"):
            load(GGUFFile(p))


def test_the_registry_picks_the_family_from_the_file(model_factory):
    f = GGUFFile(str(model_factory("tiny", "Q4_K_M")))
    assert set(models.ARCHITECTURES) == {"qwen35", "qwen2", "qwen3"}
    m = models.load_model(f)
    assert isinstance(m, Qwen35)
    assert models.load_config(f) == m.config
    for preset, arch in (("tiny-qwen2", "qwen2"), ("tiny-qwen3", "qwen3")):
        f = GGUFFile(str(model_factory(preset, "Q4_K_M")))
        m = models.load_model(f)
        assert isinstance(m, Qwen2) and m.config.arch == arch and models.load_config(f) == m.config
        assert models.load_conventions(f).tool_syntax == "json"


def test_missing_tensor_is_named(tmp_path, tiny_model_path):
    # Rewrite the tiny model without one tensor.
    from gguf import GGUFReader

    r = GGUFReader(str(tiny_model_path))
    p = tmp_path / "missing.gguf"
    w = GGUFWriter(str(p), "qwen35")
    f = GGUFFile(tiny_model_path)
    for key, value in f.metadata.items():
        if key.startswith("qwen35.") or key.startswith("tokenizer."):
            field = r.fields[key]
            w.add_key_value(key, value, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    for t in r.tensors:
        if t.name == "blk.1.ssm_out.weight":
            continue
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="missing tensor 'blk.1.ssm_out.weight'"):
        Qwen35(GGUFFile(p))


def test_load_does_not_copy_weights_to_the_heap(model_factory):
    """Resident memory grows far less than the file size when a model is opened."""
    path = model_factory("tiny", "F32")
    code = (
        "import resource, json, sys\n"
        "from engine.gguf_file import GGUFFile\nfrom engine.models.qwen35 import Qwen35\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"m = Qwen35(GGUFFile({str(path)!r}))\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'grew_kb': after - before}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grew = json.loads(out.stdout)["grew_kb"] * 1024
    assert grew < 0.5 * path.stat().st_size, (grew, path.stat().st_size)


def test_cli_error_is_one_line(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"nope")
    r = subprocess.run([sys.executable, "-m", "engine", "info", "--model", str(p)], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "not a GGUF" in r.stderr


@pytest.mark.parametrize("weights", ["F32", "Q4_K_M", "BF16"])
def test_parser_agrees_with_gguf_reader(model_factory, weights):
    """Our header parser is checked against gguf-py's reader, the independent implementation."""
    from gguf import GGUFReader

    path = model_factory("tiny", weights)
    ours = GGUFFile(path)
    ref = GGUFReader(str(path))
    for t in ref.tensors:
        view = ours.tensor(t.name)
        assert view.qtype == t.tensor_type
        assert view.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert np.array_equal(view.data.reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
    assert len(ours.tensor_names) == len(ref.tensors)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        assert ours.metadata[key] == field.contents(), key


def test_fingerprint_changes_with_the_model(model_factory):
    a = GGUFFile(model_factory("tiny", "F32", 0)).fingerprint()
    assert a == GGUFFile(model_factory("tiny", "F32", 0)).fingerprint()
    assert a != GGUFFile(model_factory("tiny", "Q8_0", 0)).fingerprint()
