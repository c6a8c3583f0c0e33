"""Builds llama.cpp (llama-cpp-python, from its PyPI source) for the benchmark, once per
instruction-set variant, into the peers' cache outside the work tree,
`$WARMLLM_PEERS_DIR/llama-cpp-python-<version>-<variant>-python/` (default ~/.cache/warmllm/peers:
a later session or clone on the machine reuses it), a pip `--target` folder that `bench.run` puts
on the llama.cpp side's PYTHONPATH for the figures llama-bench has no equivalent of (TTFT of a
chat prompt, token-by-token prefill). bench/peers.py builds both peers' llama-bench beside it.

    python -m bench.build_llama native avx2

- `native`: `GGML_NATIVE=ON`, what llama.cpp gives a user who builds it on the host. On an Intel
  host whose VM lists AMX but withholds the tile state, a native build dies of SIGILL in
  `ggml_backend_amx_mul_mat`: AMX is switched off in the compiler flags (GCC's explicit
  `-mno-*` wins over `-march=native` whatever the order).
- `avx2`: the x86-64-v3 floor Lambda promises (AVX2 + FMA + F16C, no AVX-512, no AVX-VNNI), the
  llama.cpp side of the "both held to AVX2" measurement.

About 15 minutes per variant on 2 cores; an existing build is kept (delete the folder to redo).
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the version the oracle fixtures were recorded with

NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
X86 = platform.machine() in ("x86_64", "AMD64")
VARIANTS: dict[str, list[str]] = {
    # on arm64 (a real Graviton, docs/arm64.md's recipe) native is the compiler's -mcpu=native alone
    "native": ["-DGGML_NATIVE=ON", *([f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"] if X86 else [])],
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
             "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"],
}


def cache_root() -> Path:
    """Where peer builds live: $WARMLLM_PEERS_DIR, else ~/.cache/warmllm/peers (outside the work tree)."""
    return Path(os.environ.get("WARMLLM_PEERS_DIR") or Path.home() / ".cache" / "warmllm" / "peers").expanduser()


def target_dir(variant: str) -> Path:
    return cache_root() / f"{LLAMA_CPP_PYTHON.replace('==', '-')}-{variant}-python"


def is_built(variant: str) -> bool:
    return (target_dir(variant) / "llama_cpp" / "__init__.py").exists()


def build(variant: str) -> Path:
    """pip-installs llama-cpp-python for `variant` into its folder (no-op when present)."""
    out = target_dir(variant)
    if is_built(variant):
        return out
    env = dict(os.environ, CMAKE_ARGS=shlex.join(VARIANTS[variant]), CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    # typing-extensions/numpy/jinja2 come from the venv; diskcache is llama_cpp's only other import
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir",
                    "--target", str(out), LLAMA_CPP_PYTHON, "diskcache"], check=True, env=env)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    a = ap.parse_args()
    for v in a.variants:
        print(f"llama.cpp {v}: {build(v)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
