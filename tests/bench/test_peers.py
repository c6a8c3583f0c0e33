"""bench/peers.py without building anything: where builds are cached, how the sdist is unpacked
and patched, the llama-bench command lines and how their JSON is read."""
from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

from bench import peers as P


def test_builds_live_in_a_cache_outside_the_work_tree(monkeypatch, tmp_path):
    monkeypatch.delenv("WARMLLM_PEERS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert P.cache_root() == tmp_path / "home" / ".cache" / "warmllm" / "peers"
    monkeypatch.setenv("WARMLLM_PEERS_DIR", str(tmp_path / "elsewhere"))
    ik = P.PEERS["ik"]
    assert P.build_dir(ik, "avx2") == tmp_path / "elsewhere" / "ik-llama-cpp-python-0.1.5-avx2"
    assert P.bench_binary(ik, "native").name == "llama-bench" and not P.is_built(ik, "native")
    root = Path(__file__).resolve().parents[2]
    assert root not in P.cache_root().parents


def _sdist(tmp_path: Path, peer: P.Peer, files: dict[str, str]) -> Path:
    path = tmp_path / f"{peer.sdist_name}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in {**files, "setup.py": "x", "vendor/other/CMakeLists.txt": "no"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{peer.sdist_name}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_unpack_takes_the_engine_folder_and_build_info_is_written_only_when_missing(tmp_path):
    ik = P.PEERS["ik"]
    template = ('int LLAMA_BUILD_NUMBER = @BUILD_NUMBER@;\nchar const *LLAMA_COMMIT = "@BUILD_COMMIT@";\n'
                'char const *LLAMA_COMPILER = "@BUILD_COMPILER@";\nchar const *LLAMA_BUILD_TARGET = "@BUILD_TARGET@";\n')
    sdist = _sdist(tmp_path, ik, {"vendor/ik_llama.cpp/CMakeLists.txt": "project(x)",
                                  "vendor/ik_llama.cpp/common/build-info.cpp.in": template})
    src = P.unpack(ik, sdist, tmp_path / "b")
    assert (src / "CMakeLists.txt").read_text() == "project(x)"
    assert not (src / "setup.py").exists() and not (src / "vendor").exists()
    out = P.write_build_info(src, ik.version, "gcc")
    assert out is not None and "@" not in out.read_text() and 'LLAMA_COMMIT = "pypi-0.1.5"' in out.read_text()
    assert P.write_build_info(src, ik.version) is None              # written once
    # mainline ships the generator: nothing to write
    main = P.PEERS["mainline"]
    sdist = _sdist(tmp_path, main, {"vendor/llama.cpp/CMakeLists.txt": "project(y)",
                                    "vendor/llama.cpp/common/build-info.cpp.in": template,
                                    "vendor/llama.cpp/common/cmake/build-info-gen-cpp.cmake": "gen"})
    assert P.write_build_info(P.unpack(main, sdist, tmp_path / "m"), main.version) is None


def test_cmake_holds_the_avx2_variant_to_the_floor(tmp_path):
    args = P.cmake_args(P.PEERS["ik"], "avx2", tmp_path / "s", tmp_path / "b")
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args
    assert "-DLLAMA_BUILD_EXAMPLES=ON" in args               # ik's llama-bench is an example
    assert "-DLLAMA_BUILD_TOOLS=ON" in P.cmake_args(P.PEERS["mainline"], "native", tmp_path, tmp_path)


def test_depth_is_each_peers_own_flag():
    main, ik = P.PEERS["mainline"], P.PEERS["ik"]
    a = P.llama_bench_args(main, Path("/b"), "m.gguf", 2, 512, 128, depth=4096, options=("-fa", "1"))
    assert a[a.index("-d") + 1] == "4096" and a[a.index("-p") + 1] == "512" and a[a.index("-o") + 1] == "json"
    b = P.llama_bench_args(ik, Path("/b"), "m.gguf", 2, 512, 128, depth=4096, options=ik.run_options)
    assert "-d" not in b and b[b.index("-gp") + 1] == "4096,128" and "-rtr" in b
    assert "-gp" not in P.llama_bench_args(ik, Path("/b"), "m.gguf", 2, 512, 128)


def test_llama_bench_json_of_both_peers_is_read():
    mainline = [{"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 196.5},
                {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 41.8},
                {"n_prompt": 0, "n_gen": 128, "n_depth": 4096, "avg_ts": 30.25}]
    assert P.parse_llama_bench(json.dumps(mainline)) == {"pp512": 196.5, "tg128": 41.8, "tg128@d4096": 30.25}
    ik = [{"n_prompt": 512, "n_gen": 0, "avg_ts": 334.0, "test": "pp512"},
          {"n_prompt": 4096, "n_gen": 128, "avg_ts": 44.5, "test": "tg128@pp4096"}]
    assert P.parse_llama_bench(json.dumps(ik)) == {"pp512": 334.0, "tg128@d4096": 44.5}


def test_repetitions_reach_llama_bench_and_the_receipt(monkeypatch):
    # a 32k-token prefill takes minutes: `bench.run --peer-repetitions 1` runs it once per peer
    from bench.run import parse_args

    seen = []

    def fake_run(args, **kw):
        seen.append(args)
        return subprocess.CompletedProcess(args, 0, stdout='[{"n_prompt": 32768, "n_gen": 0, "avg_ts": 90.5}]',
                                           stderr="")

    monkeypatch.setattr(P, "bench_binary", lambda peer, variant: Path("/b/llama-bench"))
    monkeypatch.setattr(P.subprocess, "run", fake_run)
    r = P.run(P.PEERS["ik"], "native", "m.gguf", 2, 32768, 0, repetitions=1)
    assert seen[0][seen[0].index("-r") + 1] == "1" and r["repetitions"] == 1 and r["figures"] == {"pp32768": 90.5}
    P.run(P.PEERS["mainline"], "native", "m.gguf", 2, 512, 128)
    assert seen[1][seen[1].index("-r") + 1] == "3"
    assert parse_args([]).peer_repetitions == 3 and parse_args(["--peer-repetitions", "1"]).peer_repetitions == 1


def test_the_server_build_turns_the_server_on_and_keeps_the_rest():
    from bench.peers import PEERS, server_binary, server_cmake_args

    peer = PEERS["mainline"]
    args = server_cmake_args(peer, "avx2", Path("/src"), Path("/b"))
    assert args[:5] == ["cmake", "-S", "/src", "-B", "/b"]
    assert "-DLLAMA_BUILD_SERVER=ON" in args and "-DLLAMA_BUILD_SERVER=OFF" not in args
    assert args.count("-DLLAMA_BUILD_TOOLS=ON") == 1 and "-DLLAMA_CURL=OFF" in args and "-DGGML_AVX512=OFF" in args
    assert server_binary(peer, "native").parts[-3:] == ("build-server", "bin", "llama-server")
