"""SnapStart in the zip deployment (issue 53, deliverable 1): template-zip.yaml's `SnapStart`
parameter turns it on for the versions each deploy publishes; every way in (HTTP API routes, the
streaming REST API, the Function URL, the keep-warm rule) invokes the published alias, in both
templates, checked on SAM's own transform of them; a Rule refuses what SnapStart does not support."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cfnlint.decode import decode_str

from tests.deploy.test_deploy_zip import sam_exe
from tests.deploy.test_template_yaml import resolve

ROOT = Path(__file__).resolve().parents[2]
MODEL = "s3://models-bucket/qwen35-0.8b.gguf"
EFS = "arn:aws:elasticfilesystem:us-east-1:123456789012:access-point/fsap-0123456789abcdef0"


@pytest.fixture(scope="module")
def zp() -> dict:
    t, errs = decode_str((ROOT / "template-zip.yaml").read_text())
    assert not errs, errs
    return t


def function(t: dict, params: dict) -> dict:
    return resolve(t, t["Resources"]["WarmLlmFunction"]["Properties"], params)


def test_snapstart_is_off_unless_asked_and_then_applies_to_published_versions(zp):
    off = function(zp, {"ModelS3Uri": MODEL})
    assert "SnapStart" not in off and off["EphemeralStorage"] == {"Size": 10240}
    on = function(zp, {"ModelS3Uri": MODEL, "SnapStart": "Enabled", "EphemeralStorageMB": 4096})
    assert on["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    assert on["EphemeralStorage"] == {"Size": 512}            # SnapStart's limit: the model stays in memory
    assert on["AutoPublishAlias"] == "live"


def test_the_rule_refuses_efs_and_a_model_outside_s3_with_snapstart(zp):
    rule = zp["Rules"]["SnapStartLoadsTheModelFromS3"]

    def holds(params: dict) -> bool:
        if not resolve(zp, rule["RuleCondition"], params):
            return True
        return all(resolve(zp, a["Assert"], params) for a in rule["Assertions"])
    on = {"SnapStart": "Enabled", "ModelS3Uri": MODEL}
    assert holds(on)
    assert not holds({**on, "EfsAccessPointArn": EFS})
    assert not holds({"SnapStart": "Enabled", "ModelPath": "/mnt/models/m.gguf"})
    assert not holds({**on, "ModelPath": "/opt/model/m.gguf"})     # ModelPath would win over the S3 model
    assert holds({"EfsAccessPointArn": EFS, "ModelPath": "/mnt/models/m.gguf"})    # SnapStart off: not its business
    texts = " ".join(a["AssertDescription"] for a in rule["Assertions"])
    assert "EFS" in texts and "ModelS3Uri" in texts and "SnapStart=Disabled" in texts


TRANSFORM = r"""
import json, sys
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

class Policies:        # the managed policy names the templates use, without asking IAM
    def load(self):
        return {n: "arn:aws:iam::aws:policy/service-role/" + n
                for n in ("AWSLambdaVPCAccessExecutionRole", "AWSLambdaBasicExecutionRole")}

text = open(sys.argv[1]).read()
text = text.replace("CodeUri: .", "CodeUri: s3://code/function.zip").replace("ContentUri: .", "ContentUri: s3://code/layer.zip")
t = yaml_parse(text)
if "PackageType: Image" in text:
    t["Resources"]["WarmLlmFunction"]["Properties"]["ImageUri"] = "123456789012.dkr.ecr.us-east-1.amazonaws.com/warmllm:1"
print(json.dumps(transform(t, json.loads(sys.argv[2]), Policies())))
"""


def sam_transform(name: str, params: dict) -> dict:
    """The template as SAM's translator (the one `sam deploy` runs) turns it into CloudFormation."""
    python = Path(sam_exe()).parent / "python"
    r = subprocess.run([str(python), "-c", TRANSFORM, str(ROOT / name), json.dumps(params)], capture_output=True,
                       text=True, env={**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("name,params", [
    ("template-zip.yaml", {"ModelS3Uri": MODEL, "SnapStart": "Enabled", "KeepWarmSchedule": "rate(5 minutes)"}),
    ("template.yaml", {"ModelS3Uri": MODEL, "KeepWarmSchedule": "rate(5 minutes)"}),
])
def test_every_way_in_invokes_the_published_alias(name, params):
    res = sam_transform(name, params)["Resources"]
    (alias_id,) = [k for k, v in res.items() if v["Type"] == "AWS::Lambda::Alias"]
    alias = res[alias_id]["Properties"]
    (version_id,) = [k for k, v in res.items() if v["Type"] == "AWS::Lambda::Version"]
    assert alias["FunctionVersion"] == {"Fn::GetAtt": [version_id, "Version"]}
    to_alias = {"Ref": alias_id}
    perms = {k: v["Properties"] for k, v in res.items() if v["Type"] == "AWS::Lambda::Permission"}
    assert len(perms) >= 7                      # 5 HTTP API routes, the REST API, the keep-warm rule
    for k, p in perms.items():
        assert p["FunctionName"] == to_alias, k
    (url,) = [v["Properties"] for v in res.values() if v["Type"] == "AWS::Lambda::Url"]
    assert url["TargetFunctionArn"] == to_alias and url["InvokeMode"] == "RESPONSE_STREAM"
    http = res["HttpApi"]["Properties"]["Body"]["paths"]
    uris = [op["x-amazon-apigateway-integration"]["uri"]["Fn::Sub"] for ops in http.values() for op in ops.values()]
    assert len(uris) == 5 and all(f"${{{alias_id}}}" in u for u in uris), uris
    for m in ("StreamingApiChatCompletionsPost", "StreamingApiCompletionsPost"):
        sub = res[m]["Properties"]["Integration"]["Uri"]["Fn::Sub"]
        assert sub[1] == {"AliasArn": to_alias}, sub
    assert res["KeepWarmRule"]["Properties"]["Targets"][0]["Arn"] == to_alias
    fn = res["WarmLlmFunction"]["Properties"]
    if name == "template-zip.yaml":
        assert fn["SnapStart"]["Fn::If"][1] == {"ApplyOn": "PublishedVersions"}
