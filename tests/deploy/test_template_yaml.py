"""template.yaml is cfn-lint clean and deploys what the design says: a container-image function
(arm64, 10,240 MB, timeout above the API deadline), the HTTP API routes the handler serves, model
source parameters, a snapshot bucket whose IAM is scoped to its prefix, optional EFS, outputs."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cfnlint.decode import decode_str

from engine.settings import SnapshotSettings
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
        assert integ["Uri"] == {"Fn::Sub": ["arn:${AWS::Partition}:apigateway:${AWS::Region}:lambda:path/2021-11-15/"
                                            "functions/${AliasArn}/response-streaming-invocations",
                                            {"AliasArn": {"Ref": "WarmLlmFunction.Alias"}}]}
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
    # no ARM64_CPU: every level of function/numba_cache.py (the arm64 image's N1 and V1-without-SVE)
    assert "ARG ARM64_CPU=\n" in d and "WARMLLM_NUMBA_CACHE_SRC=/opt/numba-cache" in d
    assert ('python -m function.numba_cache build --dir /opt/numba-cache ${ARM64_CPU:+--arm64-cpu "${ARM64_CPU}"} '
            '--models /opt/model') in d


# --- the snapshot HMAC key from SSM / Secrets Manager (engine/snapshots/keys.py) -------------------
# A small evaluator of the intrinsics these parts use, so the tests check what CloudFormation would
# deploy for given parameter values rather than the template's spelling.
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": "us-east-1", "AWS::AccountId": "123456789012"}
NO_VALUE = object()
SSM_NAME = "/warmllm/snapshot-hmac-key"
SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:warmllm-hmac-AbCdEf"


def _sub(text: str, names: dict) -> str:
    return re.sub(r"\$\{([^}]+)\}", lambda m: str(names.get(m.group(1), f"<{m.group(1)}>")), text)


def resolve(t: dict, node, params: dict):
    """`node` with Ref/Fn::If/Fn::Sub/... evaluated for `params` (the rest at their defaults)."""
    values = {k: v.get("Default", "") for k, v in t["Parameters"].items()} | params | PSEUDO

    def cond(name: str) -> bool:
        return bool(ev(t["Conditions"][name]))

    def ev(n):
        if isinstance(n, list):
            return [x for x in (ev(i) for i in n) if x is not NO_VALUE]
        if not isinstance(n, dict):
            return n
        if len(n) == 1:
            (k, v), = n.items()
            if k == "Ref":
                return NO_VALUE if v == "AWS::NoValue" else values.get(v, f"<{v}>")   # a resource: a placeholder
            if k == "Fn::If":
                return ev(v[1] if cond(v[0]) else v[2])
            if k == "Condition":
                return cond(v)
            if k == "Fn::Equals":
                return ev(v[0]) == ev(v[1])
            if k == "Fn::Not":
                return not ev(v[0])
            if k == "Fn::Or":
                return any(ev(x) for x in v)
            if k == "Fn::And":
                return all(ev(x) for x in v)
            if k == "Fn::Select":
                return ev(v[1])[int(v[0])]
            if k == "Fn::Split":
                return ev(v[1]).split(v[0])
            if k == "Fn::Sub":
                text, extra = (v, {}) if isinstance(v, str) else (v[0], {a: ev(b) for a, b in v[1].items()})
                return _sub(text, {**values, **extra})
            if k == "Fn::GetAtt":
                return f"<{'.'.join(v) if isinstance(v, list) else v}>"
        return {k: x for k, x in ((k, ev(v)) for k, v in n.items()) if x is not NO_VALUE}
    return ev(node)


def deployed(t: dict, params: dict) -> tuple[dict, list[dict]]:
    """The function's environment and its policy statements for `params`."""
    props = t["Resources"]["WarmLlmFunction"]["Properties"]
    env = resolve(t, props["Environment"]["Variables"], params)
    policies = resolve(t, props["Policies"], params)
    return env, [s for p in policies if isinstance(p, dict) for s in p["Statement"]]


def actions(stmts: list[dict]) -> set[str]:
    return {a for s in stmts for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}


@pytest.mark.parametrize("name", ["template.yaml", "template-zip.yaml"])
def test_hmac_key_parameters_are_optional_and_checked(name):
    t, errs = decode_str((ROOT / name).read_text())
    assert not errs, errs
    ssm, secret = t["Parameters"]["SnapshotHmacKeySsmParameter"], t["Parameters"]["SnapshotHmacKeySecretArn"]
    assert ssm["Default"] == "" and secret["Default"] == ""
    for ok in ("", SSM_NAME, "/a"):
        assert re.fullmatch(ssm["AllowedPattern"], ok), ok
    for bad in ("warmllm-key", "/has space", "arn:aws:ssm:us-east-1:123456789012:parameter/x"):
        assert not re.fullmatch(ssm["AllowedPattern"], bad), bad     # the ARN is built from a /path
    for ok in ("", SECRET_ARN, "arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:k-123456"):
        assert re.fullmatch(secret["AllowedPattern"], ok), ok
    for bad in ("warmllm-hmac", "arn:aws:ssm:us-east-1:123456789012:parameter/x"):
        assert not re.fullmatch(secret["AllowedPattern"], bad), bad


def test_hmac_key_env_vars_only_when_given_and_read_by_the_engine(tpl):
    env, _ = deployed(tpl, {})
    assert "SNAPSHOT_HMAC_KEY_SSM" not in env and "SNAPSHOT_HMAC_KEY_SECRET" not in env   # unset, not ""
    env, _ = deployed(tpl, {"SnapshotHmacKeySsmParameter": SSM_NAME})
    assert env["SNAPSHOT_HMAC_KEY_SSM"] == SSM_NAME and "SNAPSHOT_HMAC_KEY_SECRET" not in env
    assert SnapshotSettings.from_env(env).hmac_key_ssm == SSM_NAME
    env, _ = deployed(tpl, {"SnapshotHmacKeySecretArn": SECRET_ARN})
    assert env["SNAPSHOT_HMAC_KEY_SECRET"] == SECRET_ARN and "SNAPSHOT_HMAC_KEY_SSM" not in env
    assert SnapshotSettings.from_env(env).hmac_key_secret == SECRET_ARN


def test_hmac_key_rule_refuses_both_like_the_engine(tpl):
    rule = tpl["Rules"]["OneSnapshotHmacKeySource"]
    both = {"SnapshotHmacKeySsmParameter": SSM_NAME, "SnapshotHmacKeySecretArn": SECRET_ARN}
    assert "RuleCondition" not in rule
    (assertion,) = rule["Assertions"]
    assert resolve(tpl, assertion["Assert"], both) is False
    for one in ({}, {"SnapshotHmacKeySsmParameter": SSM_NAME}, {"SnapshotHmacKeySecretArn": SECRET_ARN}):
        assert resolve(tpl, assertion["Assert"], one) is True, one
    with pytest.raises(ValueError, match="one source"):        # what the rule saves a deployment from
        SnapshotSettings.from_env({"SNAPSHOT_HMAC_KEY_SSM": SSM_NAME, "SNAPSHOT_HMAC_KEY_SECRET": SECRET_ARN})


def test_hmac_key_policies_only_under_their_condition(tpl):
    _, stmts = deployed(tpl, {})
    assert not {a for a in actions(stmts) if a.split(":")[0] in ("ssm", "secretsmanager", "kms")}
    _, stmts = deployed(tpl, {"SnapshotHmacKeySsmParameter": SSM_NAME})
    assert {a for a in actions(stmts) if a.split(":")[0] in ("ssm", "secretsmanager", "kms")} == {
        "ssm:GetParameter", "kms:Decrypt"}
    _, stmts = deployed(tpl, {"SnapshotHmacKeySecretArn": SECRET_ARN})
    assert {a for a in actions(stmts) if a.split(":")[0] in ("ssm", "secretsmanager", "kms")} == {
        "secretsmanager:GetSecretValue", "kms:Decrypt"}
    # and in the template itself each is an !If on its condition (not a statement resolved away by luck)
    conditional = {p["Fn::If"][0]: p["Fn::If"][1] for p in tpl["Resources"]["WarmLlmFunction"]["Properties"]["Policies"]
                   if isinstance(p, dict) and "Fn::If" in p and isinstance(p["Fn::If"][1], dict)}
    assert {s["Sid"] for s in conditional["HasHmacKeySsm"]["Statement"]} == {
        "ReadSnapshotHmacKeyParameter", "DecryptSnapshotHmacKeyParameter"}
    assert {s["Sid"] for s in conditional["HasHmacKeySecret"]["Statement"]} == {
        "ReadSnapshotHmacKeySecret", "DecryptSnapshotHmacKeySecret"}


def test_hmac_key_policies_are_scoped_to_that_parameter_and_secret(tpl):
    param_arn = f"arn:aws:ssm:us-east-1:123456789012:parameter{SSM_NAME}"
    _, stmts = deployed(tpl, {"SnapshotHmacKeySsmParameter": SSM_NAME})
    by_sid = {s["Sid"]: s for s in stmts}
    assert by_sid["ReadSnapshotHmacKeyParameter"]["Resource"] == param_arn
    dec = by_sid["DecryptSnapshotHmacKeyParameter"]
    # a customer managed key, and only when SSM decrypts this parameter (its encryption context)
    assert dec["Condition"]["StringEquals"] == {"kms:ViaService": "ssm.us-east-1.amazonaws.com",
                                                "kms:EncryptionContext:PARAMETER_ARN": param_arn}
    assert dec["Resource"].startswith("arn:aws:kms:us-east-1:")

    _, stmts = deployed(tpl, {"SnapshotHmacKeySecretArn": SECRET_ARN})
    by_sid = {s["Sid"]: s for s in stmts}
    assert by_sid["ReadSnapshotHmacKeySecret"]["Resource"] == SECRET_ARN
    dec = by_sid["DecryptSnapshotHmacKeySecret"]
    assert dec["Condition"]["StringEquals"] == {"kms:ViaService": "secretsmanager.eu-west-1.amazonaws.com",
                                                "kms:EncryptionContext:SecretARN": SECRET_ARN}
    assert dec["Resource"].startswith("arn:aws:kms:eu-west-1:")       # the secret's region, not the stack's
    for s in stmts:
        assert "*" not in actions([s]) and not any(a.endswith("*") for a in actions([s])), s
