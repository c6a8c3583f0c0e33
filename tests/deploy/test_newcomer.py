"""What a new user meets first, one test per defect found by following the README as written:
the image build context and model baking, `make run`'s model choice and output, ignored build
output, 503 bodies, and a deployment without a model source."""
from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode import decode_str

ROOT = Path(__file__).resolve().parents[2]


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.startswith("#")]


def ignored_by_docker(rel: str, patterns: list[str]) -> bool:
    """Docker's rule for the paths used here: a pattern excludes the path or any parent of it."""
    parts = rel.split("/")
    out = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatch(prefix, pat) or (pat.startswith("**/") and fnmatch.fnmatch(parts[i - 1], pat[3:])):
                out = not neg
                break
    return out


def test_sam_reads_the_dockerignore_and_it_keeps_the_context_small():
    # SAM's image builder (docker-py) reads <DockerContext>/.dockerignore, never <Dockerfile>.dockerignore
    assert not (ROOT / "Dockerfile.dockerignore").exists()
    pats = dockerignore_patterns()
    for heavy in (".venv/lib/python3.12/site-packages/numpy/x.so", ".aws-sam/build/template.yaml",
                  "models/tiny-Q4_K_M.gguf", "models/0.8b-Q8_0.gguf", ".numba_cache/engine-x/k.nbi",
                  "layers/build/arm64/python/numba/__init__.py", ".git/HEAD", "tests/test_x.py"):
        assert ignored_by_docker(heavy, pats), heavy
    for needed in ("engine/generate.py", "function/app.py", "pyproject.toml", "model-bake/m.gguf"):
        assert not ignored_by_docker(needed, pats), needed


def test_the_image_bakes_no_model_unless_asked():
    d = (ROOT / "Dockerfile").read_text()
    copies = [x for x in d.splitlines() if x.startswith("COPY")]
    assert not any("models" in c.split() or "models*" in c for c in copies), copies
    bake = [c for c in copies if "/opt/model/" in c]
    assert bake == ["COPY pyproject.toml model-bake* /opt/model/"]
    mk = (ROOT / "Makefile").read_text()
    assert "image-model:" in mk and "model-bake" in mk


def test_build_output_and_staged_models_are_git_ignored():
    for p in (".aws-sam/build/template.yaml", "model-bake/m.gguf", "models/tiny-Q4_K_M.gguf"):
        r = subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT)
        assert r.returncode == 0, p


def make(*args: str) -> subprocess.CompletedProcess:
    # -o: never reinstall the venv from inside a test; PY: this interpreter
    return subprocess.run(["make", "-s", "-o", ".venv/.installed", f"PY={sys.executable}", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_make_model_refuses_a_missing_model_path(tmp_path):
    typo = tmp_path / "no" / "such-model.gguf"
    r = make("model", f"MODEL={typo}")
    assert r.returncode != 0
    assert f"MODEL={typo} does not exist" in r.stderr and "random-weights" in r.stderr
    assert not typo.exists() and not typo.parent.exists()


def test_make_model_builds_only_the_default_path_with_progress(tmp_path, monkeypatch):
    from function import dev_model
    out = tmp_path / "models" / "tiny-Q8_0.gguf"
    lines = []
    monkeypatch.setattr(sys, "stderr", type("W", (), {"write": lambda self, s: lines.append(s),
                                                     "flush": lambda self: None})())
    assert dev_model.ensure(str(out), str(out), "tiny", "Q8_0") == 0
    text = "".join(lines)
    assert out.is_file() and dev_model.is_factory_model(str(out))
    assert "random weights" in text and "done in" in text
    assert dev_model.ensure(str(out), str(out), "tiny", "Q8_0") == 0      # present: used as it is


def test_make_run_says_random_weights_and_prints_the_answer_apart(tiny_model_path):
    env = {**os.environ, "MODEL_PATH": str(tiny_model_path), "POWERTOOLS_METRICS_DISABLED": "true"}
    r = subprocess.run([sys.executable, "-m", "function", "events/chat_http_api.json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "--- raw response (what API Gateway returns) ---" in out and "--- answer ---" in out
    raw = out.split("--- raw response (what API Gateway returns) ---\n", 1)[1].split("\n--- answer ---\n")[0]
    resp = json.loads(raw)
    content = json.loads(resp["body"])["choices"][0]["message"]["content"]
    answer = out.split("\n--- answer ---\n", 1)[1]
    assert answer.startswith(content + "\n")
    assert "random weights" in answer and "random text" in answer
    # the load (and a first run's kernel compile) says what it is doing and how long it took
    assert "warmllm: loading" in r.stderr and "compiles the numba kernels" in r.stderr and "done in" in r.stderr


def test_503_bodies_name_the_problem_without_internal_paths(tmp_path, capsys):
    from function.runtime import Runtime
    secret = tmp_path / "internal" / "dir" / "model.gguf"
    r = Runtime.from_env({**os.environ, "MODEL_PATH": str(secret)})
    r.start_init(budget_s=30)
    ev = json.loads((ROOT / "events" / "chat_http_api.json").read_text())
    health = json.loads((ROOT / "events" / "health.json").read_text())
    capsys.readouterr()
    for e in (ev, health):
        resp = r.handle(e)
        assert resp["statusCode"] == 503
        assert "internal" not in resp["body"] and str(tmp_path) not in resp["body"], resp["body"]
        assert "does not exist" in resp["body"]
    log = capsys.readouterr().out
    assert str(secret) in log or str(secret) in (r.error or "")      # the operator still sees the path


def rule_holds(expr, params: dict):
    """Evaluate a CloudFormation rule expression (the rule intrinsics the templates use)."""
    if isinstance(expr, dict):
        (fn, arg), = expr.items()
        if fn == "Ref":
            return params[arg]
        if fn == "Fn::Equals":
            return rule_holds(arg[0], params) == rule_holds(arg[1], params)
        if fn == "Fn::Not":
            return not rule_holds(arg[0], params)
        if fn == "Fn::Or":
            return any(rule_holds(a, params) for a in arg)
        if fn == "Fn::And":
            return all(rule_holds(a, params) for a in arg)
        if fn == "Fn::Contains":
            return rule_holds(arg[1], params) in rule_holds(arg[0], params)
        raise AssertionError(f"unexpected intrinsic {fn}")
    return expr


def deployable(t: dict, **given) -> bool:
    """Would CloudFormation accept these parameter values (the template's Rules)?"""
    params = {}
    for name, p in t["Parameters"].items():
        v = given.get(name, p.get("Default"))
        params[name] = [x.strip() for x in str(v).split(",")] if p["Type"] == "CommaDelimitedList" else v
    for rule in t.get("Rules", {}).values():
        if "RuleCondition" in rule and not rule_holds(rule["RuleCondition"], params):
            continue
        if not all(rule_holds(a["Assert"], params) for a in rule["Assertions"]):
            return False
    return True


@pytest.mark.parametrize("template", ["template.yaml", "template-zip.yaml"])
def test_a_deployment_without_a_model_source_is_refused(template):
    t, errs = decode_str((ROOT / template).read_text())
    assert not errs and t.get("Rules"), "no CloudFormation Rule guards the parameters"
    assert not deployable(t)
    assert deployable(t, ModelS3Uri="s3://b/m.gguf") and deployable(t, ModelPath="/mnt/models/m.gguf")


@pytest.mark.parametrize("template", ["template.yaml", "template-zip.yaml"])
def test_efs_in_a_vpc_gets_a_route_to_s3(template):
    t, _ = decode_str((ROOT / template).read_text())
    efs = dict(ModelPath="/mnt/models/m.gguf", EfsAccessPointArn="arn:aws:elasticfilesystem:r:1:access-point/fsap-1",
               SubnetIds="subnet-1,subnet-2", SecurityGroupIds="sg-1")
    assert not deployable(t, **{**efs, "SubnetIds": ""})                 # EFS without its subnets
    assert not deployable(t, **efs)                                       # no route to S3 from the VPC
    assert deployable(t, **efs, VpcId="vpc-1", RouteTableIds="rtb-1,rtb-2")
    assert deployable(t, **efs, VpcS3Access="existing")                   # the VPC has a NAT or an endpoint
    ep = t["Resources"]["S3GatewayEndpoint"]
    assert ep["Condition"] == "CreateS3Endpoint" and ep["Properties"]["VpcEndpointType"] == "Gateway"
    assert ep["Properties"]["RouteTableIds"] == {"Ref": "RouteTableIds"}
    assert t["Conditions"]["CreateS3Endpoint"] == {
        "Fn::And": [{"Condition": "UseEfs"}, {"Fn::Equals": [{"Ref": "VpcS3Access"}, "endpoint"]}]}
