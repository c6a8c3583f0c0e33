"""Set up (idempotently) the arm64 userland that ``make test-arm64`` runs the engine in, under qemu.

    python scripts/arm64_userland.py [--cache .cache/arm64] [--json]

1. ``qemu-aarch64-static`` and ``mmdebstrap`` from Debian (``apt-get install`` when missing; root).
2. ``<cache>/root``: a Debian bookworm arm64 userland, unpacked (not configured) by
   ``mmdebstrap --variant=extract`` with Python 3.11, libstdc++ and GNU OpenMP (numba's ``omp``
   threading layer).
3. ``<cache>/site``: arm64 wheels for CPython 3.11 (``pip --platform manylinux…_aarch64
   --only-binary=:all: --target``) of the project's runtime dependencies at the versions pinned in
   pyproject.toml (numpy, numba, llvmlite, gguf, tokenizers, jinja2) plus pytest and hypothesis.

Each part is built in a temporary directory and renamed into place, and a stamp records what it
was built from, so a second run does nothing and a changed pin rebuilds only the wheels.
Run an arm64 program with ``qemu-aarch64-static -L <cache>/root <cache>/root/usr/bin/python3.11``
and ``PYTHONPATH=<cache>/site:<repo>`` (see :func:`python_cmd` / :func:`python_env`).

Exit status 75 (EX_TEMPFAIL) with a line starting ``SKIP:`` means Debian's or PyPI's registry
could not be reached; any other failure is an error.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = ROOT / ".cache" / "arm64"
SUITE = "bookworm"
PYTHON = "3.11"                      # bookworm's; Lambda's runtime is 3.12 (not in Debian's arm64 archive)
DEBS = ["python3.11", "python3", "libstdc++6", "libgomp1"]
TEST_DEPS = ["pytest>=8", "hypothesis>=6"]
HOST_ONLY = {"boto3", "botocore", "awslambdaric", "aws-lambda-powertools", "s3transfer"}
# bookworm's glibc is 2.36: every manylinux tag up to 2_34 runs there (llguidance's aarch64
# wheel is manylinux_2_31; without the tag pip found no version >= 1.9)
PLATFORMS = ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64", "manylinux_2_31_aarch64",
             "manylinux_2_34_aarch64"]
QEMU = "qemu-aarch64-static"
# The emulated CPU's SVE, as on the Graviton each numba target names: N1 (Graviton2) has none,
# V1 (Graviton3) 256-bit vectors, V2 (Graviton4) 128-bit. qemu's own default (512-bit) is no
# Lambda machine, and code whose result depends on the vector length must be judged at the real
# one: LLVM 22's SVE lowering of an i8 -> i64 dot product drops half the sum at 256 bits (LLVM
# issue 204939; tests/arm64/test_neon.py). Without SVE, an SVE instruction in N1 code is SIGILL.
QEMU_CPU = {"generic": "max,sve=off", "neoverse-n1": "max,sve=off",
            "neoverse-v1": "max,sve256=on", "neoverse-v2": "max,sve128=on"}
EX_TEMPFAIL = 75
OFFLINE_MARKERS = ("NewConnectionError", "Temporary failure in name resolution", "Max retries exceeded",
                   "Network is unreachable", "ConnectTimeout", "Failed to establish a new connection",
                   "Could not fetch URL", "Could not resolve", "Failed to fetch", "Unable to connect",
                   "Connection timed out", "No address associated with hostname")


class Offline(RuntimeError):
    """A registry (Debian or PyPI) could not be reached."""


def runtime_deps() -> list[str]:
    """The engine's dependencies from pyproject.toml (the pins), less what only AWS code needs."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    name = lambda d: re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].strip().lower().replace("_", "-")  # noqa: E731
    return [d for d in deps if name(d) not in HOST_ONLY]


def _run(cmd: list[str], what: str, **kw) -> str:
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        if any(m in out for m in OFFLINE_MARKERS):
            raise Offline(f"{what}: " + next(m for m in OFFLINE_MARKERS if m in out))
        raise RuntimeError(f"{what} failed ({r.returncode}):\n{out[-4000:]}")
    return out


def ensure_tools() -> dict:
    missing = [p for p, exe in (("qemu-user-static", QEMU), ("mmdebstrap", "mmdebstrap")) if not shutil.which(exe)]
    if missing:
        if os.geteuid() != 0:
            raise RuntimeError(f"missing {' '.join(missing)}: run `sudo apt-get install -y {' '.join(missing)}`")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], "apt-get update", env=env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], "apt-get install", env=env)
    v = subprocess.run([QEMU, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return {"installed": missing, "qemu": v}


def _stamp_ok(path: Path, spec: dict) -> bool:
    stamp = path / ".warmllm-stamp.json"
    try:
        return json.loads(stamp.read_text()) == spec
    except (OSError, ValueError):
        return False


def _finish(tmp: Path, final: Path, spec: dict) -> None:
    (tmp / ".warmllm-stamp.json").write_text(json.dumps(spec))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def ensure_root(cache: Path) -> bool:
    root = cache / "root"
    spec = {"suite": SUITE, "debs": DEBS, "arch": "arm64"}
    if _stamp_ok(root, spec) and (root / "usr/bin" / f"python{PYTHON}").exists():
        return False
    tmp = cache / "root.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _run(["mmdebstrap", "--variant=extract", "--arch=arm64", "--include=" + ",".join(DEBS), SUITE, str(tmp)],
         "mmdebstrap")
    _finish(tmp, root, spec)
    return True


def ensure_site(cache: Path) -> bool:
    site = cache / "site"
    reqs = runtime_deps() + TEST_DEPS
    spec = {"python": PYTHON, "platforms": PLATFORMS, "requirements": reqs}
    if _stamp_ok(site, spec):
        return False
    tmp = cache / "site.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
           "--target", str(tmp), "--only-binary=:all:", "--implementation", "cp", "--python-version", PYTHON]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    _run(cmd + reqs, "pip install (arm64 wheels)")
    _finish(tmp, site, spec)
    return True


def python_cmd(cache: Path = DEFAULT_CACHE) -> list[str]:
    """argv prefix that runs the arm64 CPython under qemu user-mode."""
    root = cache / "root"
    return [shutil.which(QEMU) or QEMU, "-L", str(root), str(root / "usr/bin" / f"python{PYTHON}")]


def python_env(cache: Path = DEFAULT_CACHE, paths: list[Path] | None = None, **extra: str) -> dict:
    """Environment for :func:`python_cmd`: the arm64 wheels and the repo on PYTHONPATH, nothing of the host's venv;
    the emulated CPU (``QEMU_CPU``) is the Graviton that ``NUMBA_CPU_NAME`` names."""
    keep = {k: v for k, v in os.environ.items()
            if k in ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMPDIR", "CI") or k.startswith("WARMLLM_")}
    pp = [str(p) for p in (paths if paths is not None else [cache / "site", ROOT])]
    return {**keep, "PYTHONPATH": os.pathsep.join(pp), "PYTHONNOUSERSITE": "1",
            "QEMU_LD_PREFIX": str(cache / "root"), "QEMU_CPU": QEMU_CPU.get(extra.get("NUMBA_CPU_NAME", ""), "max"),
            **extra}


def spec_hash() -> str:
    return hashlib.sha256(json.dumps([SUITE, DEBS, PYTHON, runtime_deps(), TEST_DEPS]).encode()).hexdigest()[:12]


def setup(cache: Path = DEFAULT_CACHE) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tools = ensure_tools()
    t1 = time.perf_counter()
    built_root = ensure_root(cache)
    t2 = time.perf_counter()
    built_site = ensure_site(cache)
    t3 = time.perf_counter()
    return {"event": "arm64_userland", "cache": str(cache), "spec": spec_hash(), **tools,
            "root_built": built_root, "site_built": built_site,
            "tools_s": round(t1 - t0, 1), "root_s": round(t2 - t1, 1), "site_s": round(t3 - t2, 1),
            "python": python_cmd(cache)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(DEFAULT_CACHE))
    a = ap.parse_args(argv)
    try:
        info = setup(Path(a.cache).resolve())
    except Offline as e:
        print(f"SKIP: arm64 userland not set up, a package registry is unreachable ({e})", flush=True)
        return EX_TEMPFAIL
    print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
