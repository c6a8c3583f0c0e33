"""The image's kernel cache: numba only uses writable cache directories, so the pre-built cache is
copied from the read-only image path into /tmp at cold start, with the image's CPU target; a
process started that way loads the kernels instead of compiling them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from function import numba_cache

ROOT = Path(__file__).resolve().parents[2]


def test_prepare_copies_once_and_applies_the_cpu_target(tmp_path):
    src, dst = tmp_path / "image-cache", tmp_path / "tmp-cache"
    (src / "engine_abc").mkdir(parents=True)
    (src / "engine_abc" / "k.nbi").write_bytes(b"index")
    (src / "cpu.json").write_text(json.dumps({"levels": [numba_cache.level_spec("neoverse-n1")]}))  # build()'s, arm64
    env = {"WARMLLM_NUMBA_CACHE_SRC": str(src), "NUMBA_CACHE_DIR": str(dst)}
    info = numba_cache.prepare(env)
    assert info["numba_cache_copied"] and info["numba_cache_files"] == 2
    assert (dst / "engine_abc" / "k.nbi").read_bytes() == b"index"
    assert env["NUMBA_CPU_NAME"] == "neoverse-n1" and env["NUMBA_CPU_FEATURES"] == ""
    assert not numba_cache.prepare(env)["numba_cache_copied"]          # second cold start in the same /tmp
    env2 = {"WARMLLM_NUMBA_CACHE_SRC": str(src), "NUMBA_CACHE_DIR": str(dst), "NUMBA_CPU_NAME": "generic"}
    numba_cache.prepare(env2)
    assert env2["NUMBA_CPU_NAME"] == "generic"                          # an explicit setting wins



def test_arm64_without_an_image_cache_compiles_for_neoverse_n1():
    """The zip deployment: no cpu.json, and numba would target the Graviton it runs on (SVE on V1,
    where LLVM 22.1 miscompiles a dot-product loop); N1 is the tested target."""
    env: dict = {}
    assert numba_cache.prepare(env, machine="aarch64")["numba_cpu_name"] == "neoverse-n1"
    assert env["NUMBA_CPU_FEATURES"] == ""
    mine = {"NUMBA_CPU_NAME": "neoverse-v2"}
    numba_cache.prepare(mine, machine="aarch64")
    assert mine["NUMBA_CPU_NAME"] == "neoverse-v2" and "NUMBA_CPU_FEATURES" not in mine   # explicit wins
    x86: dict = {}
    assert numba_cache.prepare(x86, machine="x86_64")["numba_cpu_name"] is None and x86 == {}

def test_on_lambda_without_a_cache_dir_tmp_is_used():
    env = {"AWS_LAMBDA_FUNCTION_NAME": "warmllm"}
    assert numba_cache.prepare(env)["numba_cache_dir"] == "/tmp/numba-cache"
    assert env["NUMBA_CACHE_DIR"] == "/tmp/numba-cache"


def _run(code: str, env: dict) -> str:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e = {k: v for k, v in {**os.environ, **env, "PYTHONPATH": path}.items() if v is not None}  # None: unset
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=e, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_prebuilt_cache_is_loaded_not_recompiled(tmp_path, model_factory, capfd):
    """The image build (numba_cache.build: one compile per CPU level this host runs, cpu.json) and
    a Lambda cold start (prepare: the best level this CPU has, the cache copied to /tmp) that loads
    the kernels instead of compiling them."""
    # a quantized model: F32 weights run on numpy alone, the quant formats run numba kernels
    tiny_model_path = model_factory("tiny", "Q4_K_M")
    image_cache, run_cache = tmp_path / "opt-numba-cache", tmp_path / "tmp-numba-cache"
    load = f"""
from function import numba_cache
info = numba_cache.prepare()
from engine.generate import Engine
e = Engine.load({str(tiny_model_path)!r})
import json; print(json.dumps({{"compile_ms": e.compile_ms, **info}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:  # the image build: every level compiled into the image's cache directory
        built = numba_cache.build(str(image_cache), warm=("-c", load))
    finally:
        os.environ.clear()
        os.environ.update(old)
    cold = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith('{"compile_ms"')]
    assert [c["numba_cpu_name"] for c in cold] == built
    spec = json.loads((image_cache / "cpu.json").read_text())
    best = numba_cache.choose_level(spec["levels"], numba_cache.cpu_flags())["NUMBA_CPU_NAME"]
    # a cold start on Lambda: read-only image cache copied to /tmp, the level chosen, kernels loaded
    run_env = {"NUMBA_CACHE_DIR": str(run_cache), "WARMLLM_NUMBA_CACHE_SRC": str(image_cache),
               "NUMBA_CPU_NAME": None, "NUMBA_CPU_FEATURES": None}
    warm = json.loads(_run(load, run_env).strip().splitlines()[-1])
    assert warm["numba_cache_copied"] and warm["numba_cache_files"] > 0
    assert warm["numba_cpu_name"] == best and warm["numba_cpu_levels"] == built
    cold_ms = cold[built.index(best)]["compile_ms"]
    assert warm["compile_ms"] < cold_ms / 3, (cold, warm)
    print(json.dumps({"levels": built, "cold_compile_ms": cold_ms, "cached_compile_ms": warm["compile_ms"]}))


def test_prepare_takes_the_best_level_this_cpu_runs(tmp_path):
    src = tmp_path / "image-cache"
    src.mkdir()
    levels = [numba_cache.level_spec(name, req) for name, req in numba_cache.X86_LEVELS]
    (src / "cpu.json").write_text(json.dumps({"levels": levels}))
    avx2 = frozenset({"avx2", "fma", "f16c", "bmi2", "avx512f"})        # AVX-512 but no VNNI: Skylake-X
    vnni = avx2 | {"avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"}
    for flags, want in ((vnni, "cascadelake"), (avx2, "x86-64-v3")):
        env = {"WARMLLM_NUMBA_CACHE_SRC": str(src), "NUMBA_CACHE_DIR": str(tmp_path / want)}
        info = numba_cache.prepare(env, flags=flags)
        assert env["NUMBA_CPU_NAME"] == want and env["NUMBA_CPU_FEATURES"] == ""
        assert info["numba_cpu_levels"] == ["cascadelake", "x86-64-v3"]
    mine = {"WARMLLM_NUMBA_CACHE_SRC": str(src), "NUMBA_CACHE_DIR": str(tmp_path / "m"), "NUMBA_CPU_NAME": "haswell"}
    numba_cache.prepare(mine, flags=vnni)
    assert mine["NUMBA_CPU_NAME"] == "haswell"                           # an explicit setting wins
    none = {"WARMLLM_NUMBA_CACHE_SRC": str(src), "NUMBA_CACHE_DIR": str(tmp_path / "n")}
    assert numba_cache.prepare(none, flags=frozenset({"sse4_2"}))["numba_cpu_name"] is None   # below the floor
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n")
    assert numba_cache.cpu_flags(str(tmp_path / "cpuinfo")) == {"fpu", "avx2", "fma"}
    assert numba_cache.cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_arm64_image_levels_give_graviton3_the_i8mm_tiles_without_sve(tmp_path):
    src = tmp_path / "image-cache"
    src.mkdir()
    levels = [numba_cache.level_spec(name, req, feats) for name, feats, req in numba_cache.ARM64_LEVELS]
    (src / "cpu.json").write_text(json.dumps({"levels": levels}))
    # /proc/cpuinfo Features of a Graviton2 (N1) and a Graviton3 (V1), as Linux prints them
    g2 = frozenset("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                   "asimddp ssbs".split())
    g3 = g2 | {"sve", "i8mm", "bf16", "svei8mm", "svebf16", "dcpodp", "sha3", "sm3", "sm4", "asimdfhm"}
    for flags, name, feats in ((g3, "neoverse-v1", numba_cache.ARM64_V1_FEATURES), (g2, "neoverse-n1", "")):
        env = {"WARMLLM_NUMBA_CACHE_SRC": str(src), "NUMBA_CACHE_DIR": str(tmp_path / name)}
        info = numba_cache.prepare(env, machine="aarch64", flags=flags)
        assert (env["NUMBA_CPU_NAME"], env["NUMBA_CPU_FEATURES"]) == (name, feats)
        assert info["numba_cpu_levels"] == ["neoverse-v1", "neoverse-n1"]
    # what the engine reads from that level: i8mm without SVE
    feats = {f[1:] for f in numba_cache.ARM64_V1_FEATURES.split(",") if f[0] == "+"}
    assert {"dotprod", "i8mm"} <= feats and "sve" not in feats and "-sve" in numba_cache.ARM64_V1_FEATURES


def test_hwcap_bits_name_the_graviton_features():
    # AT_HWCAP (16) and AT_HWCAP2 (26) of a Graviton3: asimddp bit 20, sve bit 22; i8mm bit 13, bf16 bit 14
    aux = {16: (1 << 20) | (1 << 22) | 0xFF, 26: (1 << 13) | (1 << 14)}
    assert numba_cache.hwcap_flags(aux.__getitem__) == {"asimddp", "sve", "i8mm", "bf16"}
    assert numba_cache.hwcap_flags({16: 1 << 20, 26: 0}.__getitem__) == {"asimddp"}   # Graviton2


def test_build_compiles_the_levels_the_build_cpu_runs_and_says_which_it_skips(tmp_path, capsys):
    # the warm command records which CPU target it ran for (the real one is `python -m engine warm-kernels`)
    warm = ("-c", "import os; d = os.environ['NUMBA_CACHE_DIR']; "
                  "open(os.path.join(d, os.environ['NUMBA_CPU_NAME'] + '.ran'), 'w').write(os.environ['NUMBA_CPU_FEATURES'])")
    flags = frozenset({"avx2", "fma", "f16c", "bmi2"})
    assert numba_cache.build(str(tmp_path / "a"), machine="x86_64", flags=flags, warm=warm) == ["x86-64-v3"]
    said = capsys.readouterr().out
    assert "skipping cascadelake" in said and "avx512_vnni" in said
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["cpu.json", "x86-64-v3.ran"]
    spec = json.loads((tmp_path / "a" / "cpu.json").read_text())
    assert [lv["NUMBA_CPU_NAME"] for lv in spec["levels"]] == ["x86-64-v3"]
    full = flags | set(dict(numba_cache.X86_LEVELS)["cascadelake"])
    assert numba_cache.build(str(tmp_path / "b"), machine="x86_64", flags=full, warm=warm) == ["cascadelake", "x86-64-v3"]
    assert numba_cache.build(str(tmp_path / "c"), machine="aarch64", arm64_cpu="neoverse-v1",
                             flags=frozenset(), warm=warm) == ["neoverse-v1"]
    assert (tmp_path / "c" / "neoverse-v1.ran").read_text() == ""
    # arm64's levels: both where the build CPU has i8mm (qemu's max), N1 alone on a Graviton2
    assert numba_cache.build(str(tmp_path / "e"), machine="aarch64", flags=frozenset({"asimddp", "i8mm"}),
                             warm=warm) == ["neoverse-v1", "neoverse-n1"]
    assert (tmp_path / "e" / "neoverse-v1.ran").read_text() == numba_cache.ARM64_V1_FEATURES
    spec = json.loads((tmp_path / "e" / "cpu.json").read_text())
    assert [(lv["NUMBA_CPU_NAME"], lv["NUMBA_CPU_FEATURES"]) for lv in spec["levels"]] == [
        ("neoverse-v1", numba_cache.ARM64_V1_FEATURES), ("neoverse-n1", "")]
    assert numba_cache.build(str(tmp_path / "f"), machine="aarch64", flags=frozenset({"asimddp"}),
                             warm=warm) == ["neoverse-n1"]
    assert "skipping neoverse-v1" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no level"):
        numba_cache.build(str(tmp_path / "d"), machine="x86_64", flags=frozenset({"sse2"}), warm=warm)


def test_kernel_cache_is_versioned_by_the_engine_sources(tmp_path):
    # a kernel inlines intrinsics from other modules (int8_dot.py), which numba's own cache
    # check does not see: the engine keys the cache directory by a hash of its sources
    code = ("import os, engine; from numba.core import config; "
            "print(config.CACHE_DIR); print(os.environ['NUMBA_CACHE_DIR'])")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.split()
    assert out[0] == out[1] and Path(out[0]).parent == tmp_path and Path(out[0]).name.startswith("engine-")
    # a child process handed the versioned directory keeps it
    again = subprocess.run([sys.executable, "-c", code], env={**env, "NUMBA_CACHE_DIR": out[0]},
                           capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    assert again == out


def test_kernel_cache_version_changes_with_an_intrinsic_module(tmp_path):
    import shutil

    pkg = tmp_path / "pkg"
    shutil.copytree(ROOT / "engine", pkg / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    code = "import engine; from numba.core import config; print(config.CACHE_DIR)"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(pkg)}

    def tag():
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              cwd=tmp_path, check=True).stdout.strip()

    before = tag()
    with open(pkg / "engine" / "quant" / "int8_dot.py", "a") as f:
        f.write("\n# changed\n")
    assert tag() != before


def test_the_image_build_caches_a_baked_models_tokenizer_for_the_cold_start(tmp_path, model_factory):
    """`build --models /opt/model` builds each baked-in model's tokenizer beside the kernels; the
    cold start's copy to /tmp brings it along, and the engine's default TOKENIZER_CACHE_DIR
    (NUMBA_CACHE_DIR, versioned, /tokenizers) loads it instead of building it."""
    from engine.gguf_file import GGUFFile
    from engine.settings import tokenizer_cache_dir
    from engine.tokenizer import Tokenizer

    model_dir = tmp_path / "opt-model"
    model_dir.mkdir()
    baked = model_dir / "qwen.gguf"
    baked.symlink_to(model_factory("tiny", "F32", 0, vocab="qwen35"))
    (model_dir / "pyproject.toml").write_text("")              # the Dockerfile's COPY placeholder: not a model
    image, tmp = tmp_path / "opt-numba-cache", tmp_path / "tmp-numba-cache"
    warm = ("-c", "pass")
    assert numba_cache.build(str(image), machine="aarch64", flags=frozenset({"asimddp"}), warm=warm, models=[str(model_dir)])
    tag = Path(os.environ["NUMBA_CACHE_DIR"]).name                 # this engine's version: engine-<hash>
    assert tag.startswith("engine-") and any((image / tag / "tokenizers").iterdir())

    numba_cache.prepare({"WARMLLM_NUMBA_CACHE_SRC": str(image), "NUMBA_CACHE_DIR": str(tmp)})
    directory = tokenizer_cache_dir({"NUMBA_CACHE_DIR": str(tmp / tag)})
    tok = Tokenizer.from_gguf_metadata(GGUFFile(baked).metadata, cache_dir=directory)
    assert tok.cache_hit and tok.n_vocab == 248320
    assert numba_cache.gguf_files([str(model_dir)]) == [str(baked)]
    assert numba_cache.gguf_files([str(model_dir / "pyproject.toml"), str(tmp_path / "none.gguf")]) == []
