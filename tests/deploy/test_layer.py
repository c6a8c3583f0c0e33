"""``make layer``: the arm64 dependency set resolves from manylinux wheels; slimming keeps what the
engine imports (proved by building the host-architecture equivalent and running the engine and the
handler from it alone, in tests/deploy/test_deploy_zip.py); the size check fails a layer above Lambda's 250 MB. Tests that need the
package registry are skipped, saying so, only when pip cannot reach it."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("layer_build", ROOT / "layers" / "build.py")
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)

NETWORK_MARKERS = ("NewConnectionError", "Temporary failure in name resolution", "Max retries exceeded",
                   "Network is unreachable", "ConnectTimeout", "Failed to establish a new connection",
                   "Could not fetch URL")


def skip_if_offline(output: str):
    if any(m in output for m in NETWORK_MARKERS):
        pytest.skip("pip cannot reach the package registry: " + next(m for m in NETWORK_MARKERS if m in output))


def test_arm64_dependency_set_resolves(tmp_path):
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--report", str(report), "--target", str(tmp_path / "t"),
           *build.pip_target_args("arm64", "3.12"), *build.runtime_deps()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        skip_if_offline(r.stdout + r.stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    wheels = {i["metadata"]["name"].lower(): i["download_info"]["url"] for i in installs}
    for name in ("numpy", "numba", "llvmlite", "gguf", "tokenizers", "jinja2", "llguidance"):
        assert name in wheels, name
    for name in ("numpy", "numba", "llvmlite"):
        assert "aarch64" in wheels[name] and "cp312" in wheels[name], wheels[name]
    # llguidance ships one abi3 wheel per platform (cp39-abi3), built for glibc 2.31: Lambda's
    # Python 3.12 runtime (Amazon Linux 2023, glibc 2.34) loads it
    assert "aarch64" in wheels["llguidance"] and "abi3" in wheels["llguidance"], wheels["llguidance"]
    assert "boto3" not in wheels and "awslambdaric" not in wheels


def _fake_tree(root: Path, mb: int = 1):
    files = {"numba/__init__.py": b"x", "numba/tests/test_a.py": b"x" * 1000, "numba/testing/__init__.py": b"x",
             "numba/cuda/__init__.py": b"x" * 1000, "numpy/_core/tests/t.py": b"x", "numpy/__init__.pyi": b"x",
             "huggingface_hub/__init__.py": b"x" * 1000, "pkg/big.bin": b"\0" * (mb * 1024 * 1024),
             "pkg/__pycache__/m.cpython-312.pyc": b"x"}
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def test_slimming_rules(tmp_path):
    _fake_tree(tmp_path)
    info = build.slim(tmp_path, "host")
    left = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert left == {"numba/__init__.py", "numba/testing/__init__.py", "pkg/big.bin"}
    assert info["removed_bytes"] > 3000


def test_size_check_fails_above_the_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(build, "install", lambda arch, py, target, deps: _fake_tree(target, mb=3))
    monkeypatch.setattr(build, "LIMIT_BYTES", 2 * 1024 * 1024)
    assert build.main(["--arch", "arm64", "--out", str(tmp_path), "--no-zip"]) == 1
    assert "exceeds Lambda's 250 MB" in capsys.readouterr().err
    monkeypatch.setattr(build, "LIMIT_BYTES", 250 * 1024 * 1024)
    assert build.main(["--arch", "arm64", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "slimmed" in out and (tmp_path / "warmllm-deps-arm64.zip").exists()


# The host-architecture layer running the engine and the handler alone is now built the way a
# deployment builds it, through `sam build -t template-zip.yaml`: tests/deploy/test_deploy_zip.py.


@pytest.mark.slow
def test_arm64_layer_fits(tmp_path):
    """The real arm64 build (downloads ~110 MB of wheels): slimmed layer + code under 250 MB."""
    report = build.build("arm64", "3.12", tmp_path, do_zip=False)
    assert report["fits"] and report["total_bytes"] <= build.LIMIT_BYTES, report


def test_the_resident_server_stays_out_of_the_layer():
    """uvicorn and prometheus-client serve `make serve` and the container (the `serve` extra);
    Lambda's zip never runs them, so the layer does not carry them."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"uvicorn", "prometheus-client"} <= {d.split(">")[0].split("=")[0] for d in extras["serve"]}
    names = {d.split(">")[0].split("=")[0].split("<")[0].lower() for d in build.runtime_deps()}
    assert not names & {"uvicorn", "prometheus-client", "h11", "starlette"}, names
