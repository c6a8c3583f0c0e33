"""Builds what `make bench-arm64` runs, into `.bench/arm64/` (idempotent: a finished part is kept).

    python -m bench.arm64.build [--targets neoverse-n1,neoverse-v1]

1. Tools from Debian (`apt-get install` when missing; root): `qemu-user` (the dynamic
   `qemu-aarch64`: `qemu-user-static` cannot load plugins), `gcc-aarch64-linux-gnu`,
   `g++-aarch64-linux-gnu`, and `llvm-19` (`llvm-mca-19`, `llvm-mc-19`, `llvm-objdump-19` for the
   per-block pricing, bench/arm64/mca.py).
2. `qemu-plugin.h` of the installed qemu (7.2): Debian bookworm ships it in no binary package,
   so it comes from Debian's source package (`apt-get source --download-only qemu`, which needs
   a `deb-src` line; the script adds one for bookworm when apt has none) and only that header is
   unpacked. The plugin API header is a declaration; `insn_classes.c` is built against it.
3. `insn_classes.so`: the counting plugin (bench/arm64/insn_classes.c), host gcc.
4. llama.cpp for aarch64 from the llama-cpp-python source the x86 benchmark builds
   (`bench.build_llama.LLAMA_CPP_PYTHON`, its `vendor/llama.cpp`), one static build per target
   with the `-march` the issue names (`ARCH`), no OpenMP (one thread), and
   `bench/arm64/llama_driver.c` linked against it (static, so qemu needs no sysroot for it).
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from bench.build_llama import LLAMA_CPP_PYTHON
from bench.peers import PEERS

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".bench" / "arm64"
HERE = Path(__file__).resolve().parent
QEMU = "qemu-aarch64"
# llama.cpp's -march per Graviton generation, as the issue specifies: N1 (Graviton2) Armv8.2 +
# dotprod; V1 (Graviton3) Armv8.4 + SVE + i8mm + bf16.
ARCH = {"neoverse-n1": "armv8.2-a+dotprod", "neoverse-v1": "armv8.4-a+sve+i8mm+bf16"}
# The x86 build the method is calibrated with (bench/arm64/calibrate.py): held to AVX2, the
# level `make bench` holds both engines to, so the same binary runs natively and under qemu 7.2
# (whose TCG has AVX2, not AVX-512).
X86_LEVEL = "x86-64-v3"
X86_GGML = ["-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
            "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF"]
TOOLS = {"qemu-user": QEMU, "gcc-aarch64-linux-gnu": "aarch64-linux-gnu-gcc", "llvm-19": "llvm-mca-19",
         "g++-aarch64-linux-gnu": "aarch64-linux-gnu-g++"}
DEB_SRC = """Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def ensure_tools() -> None:
    missing = [pkg for pkg, exe in TOOLS.items() if not shutil.which(exe)]
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], env=env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)


def plugin_header() -> Path:
    """`qemu-plugin.h` from Debian's qemu source package (the version qemu-user came from)."""
    inc = OUT / "qemu-include"
    header = inc / "qemu-plugin.h"
    if header.exists():
        return header
    src = OUT / "qemu-src"
    src.mkdir(parents=True, exist_ok=True)
    if not glob.glob(str(src / "qemu_*.orig.tar.*")):
        lists = glob.glob("/etc/apt/sources.list.d/*") + ["/etc/apt/sources.list"]
        if not any("deb-src" in Path(p).read_text() for p in lists if Path(p).is_file()):
            Path("/etc/apt/sources.list.d/warmllm-bookworm-src.sources").write_text(DEB_SRC)
            _run(["apt-get", "update", "-qq"])
        _run(["apt-get", "source", "--download-only", "qemu"], cwd=src)
    orig = glob.glob(str(src / "qemu_*.orig.tar.*"))[0]
    with tarfile.open(orig) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("include/qemu/qemu-plugin.h"))
        data = t.extractfile(member)
        assert data is not None, member.name
        inc.mkdir(parents=True, exist_ok=True)
        header.write_bytes(data.read())
    return header


def build_plugin() -> Path:
    so = OUT / "insn_classes.so"
    src = HERE / "insn_classes.c"
    if so.exists() and so.stat().st_mtime >= max(p.stat().st_mtime for p in (src, HERE / "insn_decode.h")):
        return so
    header = plugin_header()
    _run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{header.parent}", str(src), "-o", str(so)])
    return so


# The peers' sources: (folder under OUT, pip requirement, package's sdist prefix, vendored folder).
# ik_llama.cpp comes from the same PyPI sdist as the x86 bench's peer (bench/peers.py).
SOURCES = {
    "llama": ("llama-src", LLAMA_CPP_PYTHON, "llama_cpp_python", "vendor/llama.cpp"),
    "ik": ("ik-src", f"{PEERS['ik'].package}=={PEERS['ik'].version}", "ik_llama_cpp_python", PEERS["ik"].source),
}


def llama_source(peer: str = "llama") -> Path:
    """The vendored llama.cpp (or ik_llama.cpp) of the pinned sdist."""
    folder, requirement, prefix, vendored = SOURCES[peer]
    src = OUT / folder
    vendor = next(iter(src.glob(f"{prefix}-*/{vendored}")), None)
    if vendor is not None:
        return vendor
    src.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", requirement.split("==")[0],
          "-d", str(src), requirement])
    sdist = next(src.glob(f"{prefix}-*.tar.gz"))
    with tarfile.open(sdist) as t:
        t.extractall(src, filter="data")
    return next(src.glob(f"{prefix}-*/{vendored}"))


def driver_path(target: str, peer: str = "llama") -> Path:
    return OUT / f"{peer}-{target}" / "llama_driver"


def build_llama(target: str, peer: str = "llama") -> Path:
    """`peer`'s driver for `target` (a Graviton core of ARCH, or X86_LEVEL): a static build of its
    ggml and llama libraries with our llama_driver.c linked against them."""
    exe = driver_path(target, peer)
    if exe.exists():
        return exe
    vendor = llama_source(peer)
    bdir = OUT / f"{peer}-{target}" / "build"
    x86 = target == X86_LEVEL
    if x86:
        cc, cxx, march = "gcc", "g++", X86_LEVEL
        arch_flags = X86_GGML
    else:
        cc, cxx, march = "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++", ARCH[target]
        arch_flags = ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                      f"-DGGML_CPU_ARM_ARCH={march}"]
        if peer == "ik":
            # its older ggml takes the ISA from the compiler flags (no GGML_CPU_ARM_ARCH), and its
            # NEON kernels need FP16 vector arithmetic, which every Graviton has (Features: asimdhp)
            march += "+fp16"
            arch_flags += [f"-DCMAKE_C_FLAGS=-march={march}", f"-DCMAKE_CXX_FLAGS=-march={march}"]
    _run(["cmake", "-S", str(vendor), "-B", str(bdir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
          f"-DCMAKE_C_COMPILER={cc}", f"-DCMAKE_CXX_COMPILER={cxx}", *arch_flags,
          "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF",
          "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
          "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
          "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_APP=OFF"])
    jobs = str(os.cpu_count() or 2)
    _run(["nice", "-n", "10", "cmake", "--build", str(bdir), "--target", "ggml", "-j", jobs])
    # libllama's compile flags do not depend on the target (GGML_CPU_ARM_ARCH reaches ggml-cpu
    # only; build.ninja gives src/ the same -O3 flags in every target's build), so one target's
    # libllama.a serves all: the 45-odd C++ files of src/ take most of a build's time.
    # (per architecture and peer: the x86 calibration build and ik_llama.cpp have their own)
    built = sorted(p for p in OUT.glob(f"{peer}-*/build/src/libllama.a") if x86 == (X86_LEVEL in str(p)))
    if built and peer == "llama":
        libllama = built[0]
    else:
        _run(["nice", "-n", "10", "cmake", "--build", str(bdir), "--target", "llama", "-j", jobs])
        libllama = bdir / "src" / "libllama.a"
    libs = [str(libllama)] + sorted(str(p) for p in bdir.glob("ggml/src/**/*.a"))
    # ggml's archives reference each other: link them as a group
    obj = bdir / "llama_driver.o"
    defines = ["-DWARMLLM_IK_LLAMA"] if peer == "ik" else []
    _run([cc, "-O2", f"-march={march}", "-Wall", *defines, f"-I{vendor / 'include'}", f"-I{vendor / 'ggml' / 'include'}",
          "-c", str(HERE / "llama_driver.c"), "-o", str(obj)])
    _run([cxx, "-static", str(obj), "-Wl,--start-group", *libs, "-Wl,--end-group", "-lpthread", "-lm", "-o", str(exe)])
    return exe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(ARCH))
    ap.add_argument("--no-llama", action="store_true", help="only the tools and the plugin")
    a = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    ensure_tools()
    print("plugin:", build_plugin(), flush=True)
    if not a.no_llama:
        for t in a.targets.split(","):
            print(f"llama.cpp {t}:", build_llama(t), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
