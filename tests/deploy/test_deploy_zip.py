"""The zip + layer deployment (template-zip.yaml): lint-clean like template.yaml and the same stack
except how the code is packaged; `sam build` builds it here without Docker or python3.12 (SAM runs
our Makefile's build-* targets), and the handler answers from the built artifacts alone."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode import decode_str

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ("template.yaml", "template-zip.yaml")


def sam_exe() -> str:
    exe = ROOT / ".venv-sam" / "bin" / "sam"
    if exe.exists():
        return str(exe)
    found = shutil.which("sam")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("SAM CLI is missing: `make test` installs it into .venv-sam (make sam)")
    pytest.skip("SAM CLI is not installed here: `make sam` (make test does it) installs it into .venv-sam")


def sam(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    e = {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1", **(env or {})}
    return subprocess.run([sam_exe(), *args], cwd=ROOT, capture_output=True, text=True, env=e, timeout=timeout)


def load(name: str) -> dict:
    t, errs = decode_str((ROOT / name).read_text())
    assert not errs, errs
    return t


@pytest.mark.parametrize("name", TEMPLATES)
def test_sam_validate_lint_clean(name):
    r = sam("validate", "--lint", "-t", name, "--region", "us-east-1")
    assert r.returncode == 0 and "is a valid SAM Template" in r.stdout + r.stderr, r.stdout + r.stderr


def test_sam_validate_lint_is_not_vacuous(tmp_path):
    bad = tmp_path / "template.yaml"
    text = (ROOT / "template-zip.yaml").read_text()
    assert "    Default: 310\n" in text
    bad.write_text(text.replace("    Default: 310\n", "    Default: 1000\n"))    # a timeout above Lambda's 900 s
    assert sam("validate", "--lint", "-t", str(bad), "--region", "us-east-1").returncode != 0


def test_cfn_lint_clean_zip():
    exe = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or "cfn-lint"
    r = subprocess.run([exe, str(ROOT / "template-zip.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_zip_template_is_the_image_template_but_for_packaging():
    img, zp = load("template.yaml"), load("template-zip.yaml")
    fn = zp["Resources"]["WarmLlmFunction"]
    props = fn["Properties"]
    assert props["Runtime"] == "python3.12" and props["Architectures"] == ["arm64"]
    assert props["Handler"] == "function.app.handler" and props["Layers"] == [{"Ref": "DepsLayer"}]
    assert fn["Metadata"] == {"BuildMethod": "makefile"}
    layer = zp["Resources"]["DepsLayer"]
    assert layer["Metadata"]["BuildMethod"] == "makefile" and layer["Properties"]["CompatibleArchitectures"] == ["arm64"]
    # the zip has no pre-built kernel cache: it compiles into NUMBA_CACHE_DIR, on EFS when there is one
    assert props["Environment"]["Variables"]["NUMBA_CACHE_DIR"] == {
        "Fn::If": ["UseEfs", "/mnt/models/numba-cache", "/tmp/numba-cache"]}
    # the managed runtime's loop cannot stream: ./bootstrap (exec wrapper) runs ours
    assert props["Environment"]["Variables"]["AWS_LAMBDA_EXEC_WRAPPER"] == "/var/task/bootstrap"

    # SnapStart is the zip's alone (AWS's docs list managed runtimes, not container images)
    assert zp["Parameters"]["SnapStart"]["Default"] == "Disabled" and "SnapStart" not in img["Parameters"]

    # everything else is the same stack: a change to one template must be made to both
    a, b = copy.deepcopy(img), copy.deepcopy(zp)
    b["Parameters"].pop("SnapStart")
    b["Rules"].pop("SnapStartLoadsTheModelFromS3")
    b["Conditions"].pop("UseSnapStart")
    b["Resources"]["WarmLlmFunction"]["Properties"].pop("SnapStart")
    for t in (a, b):
        t["Parameters"]["EphemeralStorageMB"].pop("Description")
        t["Resources"]["WarmLlmFunction"]["Properties"].pop("EphemeralStorage")
    for t in (a, b):
        t.pop("Description")
        t["Parameters"].pop("Architecture", None)
        t["Resources"].pop("DepsLayer", None)
        f = t["Resources"]["WarmLlmFunction"]
        f.pop("Metadata")
        for k in ("PackageType", "CodeUri", "Handler", "Runtime", "Architectures", "Layers"):
            f["Properties"].pop(k, None)
        f["Properties"]["Environment"]["Variables"].pop("NUMBA_CACHE_DIR", None)
        f["Properties"]["Environment"]["Variables"].pop("AWS_LAMBDA_EXEC_WRAPPER", None)
    assert a == b


def test_sam_build_zip_offline_and_the_handler_runs_from_the_artifacts(tmp_path, tiny_model_path):
    """`sam build` for the zip path (the layer for this host, so the artifacts can be run here;
    `make deploy-zip` builds it for arm64 the same way), then the handler from those artifacts
    alone: /var/task = the function artifact, /opt/python = the layer, no site-packages."""
    out = tmp_path / "sam-build"
    r = sam("build", "-t", "template-zip.yaml", "--build-in-source", "--build-dir", str(out),
            env={"LAYER_ARCH": "host", "LAYER_OUT": str(tmp_path / "layer")})
    if r.returncode != 0 and any(m in r.stdout + r.stderr for m in ("Temporary failure in name resolution",
                                                                     "NewConnectionError")):
        pytest.skip("pip cannot reach the package registry for the layer")
    assert r.returncode == 0 and "Build Succeeded" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])
    task, opt = out / "WarmLlmFunction", out / "DepsLayer" / "python"
    assert sorted(p.name for p in task.iterdir()) == ["bootstrap", "engine", "function"]
    assert os.access(task / "bootstrap", os.X_OK)
    assert not list(task.rglob("__pycache__")) and not (opt / "numba" / "tests").exists()
    assert not (opt / "huggingface_hub").exists() and (opt / "numpy").is_dir()
    built = load(str(out / "template.yaml"))
    assert built["Resources"]["WarmLlmFunction"]["Properties"]["CodeUri"] == "WarmLlmFunction"
    assert built["Resources"]["DepsLayer"]["Properties"]["ContentUri"] == "DepsLayer"

    script = f"""
import sys, json, os
sys.path[:0] = [{str(task)!r}, {str(opt)!r}]
import numpy, numba, function
assert numpy.__file__.startswith({str(opt)!r}), numpy.__file__
assert numba.__file__.startswith({str(opt)!r}), numba.__file__
assert function.__file__.startswith({str(task)!r}), function.__file__
from function.app import handler
ev = json.load(open({str(ROOT / "events" / "chat_http_api.json")!r}))
r = handler(ev, None)
assert r["statusCode"] == 200, r
print("ZIP_OK", json.loads(r["body"])["usage"]["completion_tokens"])
"""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the artifacts carry no numba cache: the first request compiles the kernels, which on a loaded
    # 2-core host outlasts API Gateway's 28 s; this test is about what the zip holds, not timing
    env.update(MODEL_PATH=str(tiny_model_path), POWERTOOLS_METRICS_DISABLED="true", API_DEADLINE_S="600")
    run = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env,
                         timeout=900, cwd=tmp_path)
    assert "ZIP_OK" in run.stdout, (run.stdout[-2000:], run.stderr[-4000:])


def make_n(*args: str) -> str:
    r = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-o", ".venv-sam/.installed", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.replace("\\\n", " ")              # one line per command


def test_deploy_targets_run_and_print_the_sam_commands():
    out = make_n("deploy-zip", "MODEL_S3_URI=s3://my-models/Qwen3.5-0.8B-Q4_K_M.gguf")
    build, deploy = [x for x in out.splitlines() if "/sam " in x or x.startswith("sam ")][:2]
    assert build.endswith("sam build -t template-zip.yaml --build-in-source")
    assert "sam deploy -t .aws-sam/build/template.yaml --stack-name warmllm --capabilities CAPABILITY_IAM" in deploy
    assert "--parameter-overrides ModelS3Uri=s3://my-models/Qwen3.5-0.8B-Q4_K_M.gguf" in deploy
    assert "--guided" not in deploy                          # non-interactive unless asked
    out = make_n("deploy-zip", "MODEL_S3_URI=s3://b/m.gguf", "SNAPSTART=Enabled")
    assert "--parameter-overrides ModelS3Uri=s3://b/m.gguf SnapStart=Enabled" in out
    out = make_n("deploy-image", "MODEL_S3_URI=s3://b/m.gguf")
    assert "sam build -t template.yaml" in out and "--resolve-image-repos" in out and "ModelS3Uri=s3://b/m.gguf" in out


def test_readme_first_screen_deploys_a_real_model():
    text = (ROOT / "README.md").read_text()
    start = text.split("## Start here", 1)[1]
    first_block = start.split("```sh\n", 1)[1].split("```", 1)[0]
    steps = [x.split("#")[0].strip() for x in first_block.splitlines() if x.strip()]
    assert steps[0].startswith("git clone")
    assert any(s.startswith("aws s3 cp ") and ".gguf" in s for s in steps)
    deploy = [s for s in steps if s.startswith("make ")]
    assert deploy and deploy[-1].startswith("make deploy-zip MODEL_S3_URI=s3://")
    # the model the deploy names is the one uploaded, and the make target exists
    assert deploy[-1].rsplit("/", 1)[1] == [s for s in steps if s.startswith("aws s3 cp ")][0].split()[3].rsplit("/", 1)[1]
    assert "\ndeploy-zip:" in (ROOT / "Makefile").read_text()
