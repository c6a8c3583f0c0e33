"""template.yaml is cfn-lint clean and deploys what the design says: a container-image function
(arm64, 10,240 MB, timeout above the API deadline), the HTTP API routes the handler serves, model
source parameters, a snapshot bucket whose IAM is scoped to its prefix, optional EFS, outputs."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode import decode_str

from function.runtime import ROUTES

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"


def lint(path: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("cfn-lint", path=str(Path(sys.executable).parent)) or "cfn-lint"
    return subprocess.run([exe, str(path)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def tpl():
    t, errs = decode_str(TEMPLATE.read_text())
    assert not errs, errs
    return t


def test_cfn_lint_clean():
    r = lint(TEMPLATE)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cfn_lint_is_not_vacuous(tmp_path):
    broken = tmp_path / "template.yaml"
    text = TEMPLATE.read_text()
    assert "    Default: 60\n" in text
    broken.write_text(text.replace("    Default: 60\n", "    Default: 1000\n"))    # a timeout above Lambda's 900 s
    assert lint(broken).returncode != 0


def test_function(tpl):
    p = tpl["Parameters"]
    fn = tpl["Resources"]["WarmLlmFunction"]
    assert fn["Type"] == "AWS::Serverless::Function"
    props = fn["Properties"]
    assert props["PackageType"] == "Image" and fn["Metadata"]["Dockerfile"] == "Dockerfile"
    assert p["Architecture"]["Default"] == "arm64" and props["Architectures"] == [{"Ref": "Architecture"}]
    assert p["MemorySize"]["Default"] == 10240
    assert p["FunctionTimeout"]["Default"] > p["ApiDeadlineSeconds"]["Default"] + 1
    assert p["ApiDeadlineSeconds"]["Default"] == 28
    env = props["Environment"]["Variables"]
    for k in ("MODEL_PATH", "MODEL_S3_URI", "API_DEADLINE_S", "SNAPSHOT_S3_URI", "SNAPSHOT_DIR"):
        assert k in env, k
    # the engine's snapshot store reads SNAPSHOT_S3_URI: it must name the bucket and the prefix
    # that the IAM policy scopes the function to
    assert env["SNAPSHOT_S3_URI"] == {"Fn::Sub": "s3://${SnapshotBucket}/${SnapshotPrefix}"}
    assert "ModelS3Uri" in p and "ModelPath" in p


def test_routes_match_the_handler(tpl):
    ev = tpl["Resources"]["WarmLlmFunction"]["Properties"]["Events"]
    routes = {(e["Properties"]["Method"].upper(), e["Properties"]["Path"]) for e in ev.values()
              if e["Type"] == "HttpApi"}
    assert {(m, path) for path, (m, _) in ROUTES.items()} <= routes
    assert ("ANY", "/{proxy+}") in routes          # everything else reaches our 404/405


def test_snapshot_iam_is_scoped_to_the_prefix(tpl):
    policies = tpl["Resources"]["WarmLlmFunction"]["Properties"]["Policies"]
    stmts = [s for pol in policies if isinstance(pol, dict) and "Statement" in pol for s in pol["Statement"]]
    objects = next(s for s in stmts if s["Sid"] == "SnapshotObjects")
    assert objects["Resource"] == {"Fn::Sub": "${SnapshotBucket.Arn}/${SnapshotPrefix}*"}
    listing = next(s for s in stmts if s["Sid"] == "SnapshotList")
    assert listing["Condition"]["StringLike"]["s3:prefix"] == {"Fn::Sub": "${SnapshotPrefix}*"}
    for s in stmts:
        assert s.get("Resource") != "*" or "Condition" in s, s
    bucket = tpl["Resources"]["SnapshotBucket"]["Properties"]
    assert bucket["PublicAccessBlockConfiguration"]["BlockPublicPolicy"] is True


def test_efs_is_optional_via_a_condition(tpl):
    assert "UseEfs" in tpl["Conditions"]
    props = tpl["Resources"]["WarmLlmFunction"]["Properties"]
    assert props["FileSystemConfigs"]["Fn::If"][0] == "UseEfs"
    assert props["VpcConfig"]["Fn::If"][0] == "UseEfs"
    assert props["FileSystemConfigs"]["Fn::If"][2] == {"Ref": "AWS::NoValue"}


def test_outputs(tpl):
    out = tpl["Outputs"]
    assert "/v1" in str(out["ApiUrl"]["Value"]) and {"FunctionArn", "SnapshotBucketName"} <= set(out)


def test_dockerfile_entry_point_and_kernel_cache():
    d = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.12" in d
    assert 'ENTRYPOINT ["python", "-m", "awslambdaric"]' in d and 'CMD ["function.app.handler"]' in d
    assert "neoverse-n1" in d and "engine warm-kernels" in d and "WARMLLM_NUMBA_CACHE_SRC=/opt/numba-cache" in d
