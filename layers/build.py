"""``make layer``: the slimmed dependency layer for the zip + layer deployment, and its size check.

    python layers/build.py [--arch arm64|x86_64|host] [--python 3.12] [--out layers/build] [--no-zip]

1. ``pip install --platform manylinux…_<arch> --only-binary=:all: --implementation cp
   --python-version 3.12 --target <out>/<arch>/python`` with the project's runtime dependencies
   from pyproject.toml, less what the Lambda Python runtime already has (boto3/botocore) and
   what only the container image uses (awslambdaric).
2. Slim: delete what the engine never imports (test suites, ``numba.cuda``, the Hugging Face
   hub client and ``hf_xet`` that ``tokenizers`` pulls in, numpy's f2py/typing/headers,
   ``__pycache__``, type stubs) and strip llvmlite's LLVM library (``llvm-strip`` or a binutils
   ``strip`` that knows the target; without one it stays as it is and the report says so).
   Other shared objects are left alone: stripping patchelf-repaired wheels breaks them.
3. Print the unzipped size, the biggest packages, and the size of the function code
   (``engine/`` + ``function/``) that the zip adds; exit 1 when layer + code exceed Lambda's
   250 MB (262,144,000 bytes) unzipped limit.
4. Zip it as ``<out>/warmllm-deps-<arch>.zip`` (``aws lambda publish-layer-version``).

``--arch host`` builds for this machine's architecture and Python version: the tests import
and run the engine from that layer to prove the slimming removed nothing the engine needs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 250 * 1024 * 1024          # Lambda: function + all layers, unzipped
SKIP_DEPS = {"boto3", "botocore", "awslambdaric", "s3transfer"}   # in the runtime / image only
PLATFORMS = {
    "arm64": ["manylinux2014_aarch64", "manylinux_2_28_aarch64", "manylinux_2_31_aarch64", "manylinux_2_34_aarch64"],
    "x86_64": ["manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64"],
}
# top-level packages the engine never imports (pulled in as dependencies of dependencies)
DROP_PACKAGES = ["huggingface_hub", "hf_xet", "fsspec", "requests", "urllib3", "idna", "charset_normalizer",
                 "certifi", "filelock", "httpx", "httpx2", "httpcore", "httpcore2", "h11", "anyio", "sniffio",
                 "truststore", "click", "typer", "shellingham", "rich", "markdown_it", "mdurl", "pygments",
                 "boto3", "botocore", "s3transfer", "pip", "setuptools", "_distutils_hack", "bin"]
# paths (relative to the layer's python/) removed when present
DROP_PATHS = ["numba/cuda", "numba/tests", "numba/testing/notebook", "numpy/f2py", "numpy/typing/tests",
              "numpy/_pyinstaller", "numpy/_core/include", "numpy/_core/lib/pkgconfig", "numpy/distutils",
              "numpy/doc", "llvmlite/tests", "numba/scripts", "numba/pycc", "aws_lambda_powertools/utilities/parser",
              "aws_lambda_powertools/utilities/data_classes", "aws_lambda_powertools/event_handler",
              "aws_lambda_powertools/utilities/idempotency", "aws_lambda_powertools/utilities/batch"]
DROP_DIR_NAMES = {"tests", "test", "__pycache__", "testing_data"}
KEEP_DIR_PATHS = {"numba/testing", "numpy/testing"}     # imported by numba / numpy at import time
# Only these shared objects are stripped. auditwheel-repaired extensions (numpy's, numpy.libs/*)
# were rewritten by patchelf, and stripping them corrupts their program headers ("ELF load command
# address/offset not page-aligned" at import: measured here). llvmlite's LLVM is the big win.
STRIP = ["llvmlite/binding/libllvmlite.so"]
DROP_SUFFIXES = (".pyi", ".pyc", ".pyx", ".pxd", ".c", ".cpp", ".h", ".hpp", ".a")


def runtime_deps() -> list[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = []
    for d in deps:
        name = re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].strip().lower().replace("_", "-")
        if name.replace("-", "_") not in SKIP_DEPS and name not in SKIP_DEPS:
            out.append(d)
    return out


def pip_target_args(arch: str, py: str) -> list[str]:
    if arch == "host":
        return []
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", py]
    for p in PLATFORMS[arch]:
        args += ["--platform", p]
    return args


def install(arch: str, py: str, target: Path, deps: list[str]) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
           "--target", str(target), *pip_target_args(arch, py), *deps]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def find_strip(arch: str) -> list[str] | None:
    host = platform.machine().lower()
    same = arch == "host" or (arch == "arm64" and host in ("aarch64", "arm64")) or (arch == "x86_64" and host in ("x86_64", "amd64"))
    for tool in ("llvm-strip", *(f"llvm-strip-{v}" for v in range(21, 13, -1))):
        if shutil.which(tool):
            return [tool, "--strip-unneeded"]
    if arch == "arm64" and shutil.which("aarch64-linux-gnu-strip"):
        return ["aarch64-linux-gnu-strip", "--strip-unneeded"]
    if arch == "x86_64" and shutil.which("x86_64-linux-gnu-strip"):
        return ["x86_64-linux-gnu-strip", "--strip-unneeded"]
    if same and shutil.which("strip"):
        return ["strip", "--strip-unneeded"]
    return None


def slim(target: Path, arch: str) -> dict:
    removed = 0
    for name in DROP_PACKAGES:
        for p in [target / name, *target.glob(f"{name}-*.dist-info"), *target.glob(f"{name.replace('_', '-')}-*.dist-info")]:
            if p.exists():
                removed += tree_bytes(p) if p.is_dir() else p.stat().st_size
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    for rel in DROP_PATHS:
        p = target / rel
        if p.exists():
            removed += tree_bytes(p)
            shutil.rmtree(p)
    for root, dirs, files in os.walk(target, topdown=True):
        rel_root = os.path.relpath(root, target)
        for d in list(dirs):
            rel = os.path.normpath(os.path.join(rel_root, d))
            if d in DROP_DIR_NAMES and rel not in KEEP_DIR_PATHS:
                p = Path(root) / d
                removed += tree_bytes(p)
                shutil.rmtree(p)
                dirs.remove(d)
        for f in files:
            if f.endswith(DROP_SUFFIXES):
                p = Path(root) / f
                removed += p.stat().st_size
                p.unlink()
    strip = find_strip(arch)
    stripped_saved = 0
    if strip:
        for so in (target / rel for rel in STRIP):
            if so.is_file() and not so.is_symlink():
                before = so.stat().st_size
                r = subprocess.run([*strip, str(so)], capture_output=True)
                if r.returncode == 0:
                    stripped_saved += before - so.stat().st_size
    return {"removed_bytes": removed, "strip": strip[0] if strip else None, "strip_saved_bytes": stripped_saved}


def package_sizes(target: Path, top: int = 10) -> list[tuple[str, int]]:
    sizes: dict[str, int] = {}
    for p in target.iterdir():
        key = re.sub(r"-[0-9].*\.dist-info$", "", p.name).replace(".libs", "")
        sizes[key] = sizes.get(key, 0) + (tree_bytes(p) if p.is_dir() else p.stat().st_size)
    return sorted(sizes.items(), key=lambda kv: -kv[1])[:top]


def code_bytes() -> int:
    total = 0
    for d in ("engine", "function"):
        for p in (ROOT / d).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                total += p.stat().st_size
    return total


def zip_layer(layer_root: Path, out: Path) -> int:
    if out.exists():
        out.unlink()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for p in sorted(layer_root.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(layer_root))
    return out.stat().st_size


def build(arch: str, py: str, out: Path, do_zip: bool = True) -> dict:
    layer_root = out / arch
    target = layer_root / "python"
    deps = runtime_deps()
    install(arch, py, target, deps)
    raw = tree_bytes(target)
    info = slim(target, arch)
    size = tree_bytes(target)
    code = code_bytes()
    report = {"event": "layer", "arch": arch, "python": py, "path": str(layer_root), "deps": deps,
              "installed_bytes": raw, "slimmed_bytes": size, "function_code_bytes": code,
              "total_bytes": size + code, "limit_bytes": LIMIT_BYTES, "fits": size + code <= LIMIT_BYTES,
              "largest": package_sizes(target), **info}
    if do_zip:
        report["zip_bytes"] = zip_layer(layer_root, out / f"warmllm-deps-{arch}.zip")
    (layer_root / "layer-report.json").write_text(json.dumps(report, indent=2))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="arm64", choices=["arm64", "x86_64", "host"])
    ap.add_argument("--python", default=None, help="target Python version (default 3.12; host: this one)")
    ap.add_argument("--out", default=str(ROOT / "layers" / "build"))
    ap.add_argument("--no-zip", action="store_true")
    a = ap.parse_args(argv)
    py = a.python or (f"{sys.version_info.major}.{sys.version_info.minor}" if a.arch == "host" else "3.12")
    r = build(a.arch, py, Path(a.out), do_zip=not a.no_zip)
    mb = lambda b: f"{b / 1e6:.1f} MB"   # noqa: E731
    print(f"layer {r['arch']} (Python {r['python']}): installed {mb(r['installed_bytes'])} -> slimmed "
          f"{mb(r['slimmed_bytes'])} unzipped; + function code {mb(r['function_code_bytes'])} = "
          f"{mb(r['total_bytes'])} of the {mb(LIMIT_BYTES)} limit"
          + (f"; zip {mb(r['zip_bytes'])}" if "zip_bytes" in r else ""))
    print("strip:", r["strip"] or "none found (shared objects left unstripped)",
          f"saved {mb(r['strip_saved_bytes'])}")
    for name, b in r["largest"]:
        print(f"  {mb(b):>10}  {name}")
    print(json.dumps({k: v for k, v in r.items() if k not in ("largest", "deps")}))
    if not r["fits"]:
        print(f"FAIL: {mb(r['total_bytes'])} exceeds Lambda's 250 MB unzipped limit for function + layers",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
