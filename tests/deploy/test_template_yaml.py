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
    assert "    Default: 310\n" in text
    broken.write_text(text.replace("    Default: 310\n", "    Default: 1000\n"))    # a timeout above Lambda's 900 s
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
    # a stream ends on our clock (final chunk + [DONE]), never by Lambda's kill
    assert p["StreamDeadlineSeconds"]["Default"] == 300
    assert p["FunctionTimeout"]["Default"] > p["StreamDeadlineSeconds"]["Default"] + 1
    assert p["ApiDeadlineSeconds"]["Default"] == 28
    env = props["Environment"]["Variables"]
    assert env["STREAM_DEADLINE_S"] == {"Ref": "StreamDeadlineSeconds"}
    assert env["STREAM_EVENT_KINDS"] == "function_url,rest_v1"
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


def test_function_url_streams_with_iam_by_default(tpl):
    p = tpl["Parameters"]
    url = tpl["Resources"]["WarmLlmFunction"]["Properties"]["FunctionUrlConfig"]
    assert url == {"AuthType": {"Ref": "FunctionUrlAuthType"}, "InvokeMode": "RESPONSE_STREAM"}
    assert p["FunctionUrlAuthType"]["Default"] == "AWS_IAM" and p["FunctionUrlAuthType"]["AllowedValues"] == [
        "AWS_IAM", "NONE"]
    rule = tpl["Rules"]["PublicFunctionUrlNeedsAnApiKey"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "FunctionUrlAuthType"}, "NONE"]}
    assert rule["Assertions"][0]["Assert"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "ApiKey"}, ""]}]}
    assert "FunctionUrl" in tpl["Outputs"]


def test_rest_api_streams_the_generation_routes(tpl):
    res = tpl["Resources"]
    methods = {k: v for k, v in res.items() if v["Type"] == "AWS::ApiGateway::Method"}
    paths = {}

    def path_of(ref):
        parts = []
        while isinstance(ref, dict) and "Ref" in ref:
            r = res[ref["Ref"]]["Properties"]
            parts.append(r["PathPart"])
            ref = r["ParentId"]
        return "/" + "/".join(reversed(parts))
    for m in methods.values():
        paths[path_of(m["Properties"]["ResourceId"])] = m["Properties"]
    assert set(paths) == {"/v1/chat/completions", "/v1/completions"}
    for props in paths.values():
        integ = props["Integration"]
        assert props["HttpMethod"] == "POST"
        assert integ["Type"] == "AWS_PROXY" and integ["IntegrationHttpMethod"] == "POST"
        assert integ["ResponseTransferMode"] == "STREAM" and integ["TimeoutInMillis"] == 900000
        assert integ["Uri"] == {"Fn::Sub": "arn:${AWS::Partition}:apigateway:${AWS::Region}:lambda:path/2021-11-15/"
                                           "functions/${WarmLlmFunction.Arn}/response-streaming-invocations"}
    perm = res["StreamingApiInvokePermission"]["Properties"]
    assert perm["Action"] == "lambda:InvokeFunction" and perm["Principal"] == "apigateway.amazonaws.com"
    assert "/*/POST/v1/*" in perm["SourceArn"]["Fn::Sub"]
    assert "/api/v1" in tpl["Outputs"]["StreamingApiUrl"]["Value"]["Fn::Sub"]
    # the HTTP API stays for buffered clients
    assert "ApiUrl" in tpl["Outputs"] and res["HttpApi"]["Type"] == "AWS::Serverless::HttpApi"


def test_dockerfile_entry_point_and_kernel_cache():
    d = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.12" in d
    assert 'ENTRYPOINT ["python", "-m", "function.stream_runtime"]' in d and 'CMD ["function.app.handler"]' in d
    assert "neoverse-n1" in d and "engine warm-kernels" in d and "WARMLLM_NUMBA_CACHE_SRC=/opt/numba-cache" in d
