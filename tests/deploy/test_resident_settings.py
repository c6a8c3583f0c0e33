"""docs/resident.md's deployment settings (issue 54, deliverable 3), held to the code they configure:
the ECS task definition runs `python -m function.serve` on the port it maps and health-checks a
route that exists; its drain fits in the stop timeout; every variable it and the Web Adapter table
set is one the server reads, with a value it accepts; the adapter talks to the port the entry
point listens on and waits for /health. No Docker here: the settings are checked, not deployed."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.settings import Settings
from function.asgi import ServeSettings
from function.runtime import ROUTES
from function.settings import FunctionSettings

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "resident.md").read_text()


def task_definition() -> dict:
    (block,) = re.findall(r"```json\n(.*?)```", DOC, re.S)
    return json.loads(block)


def adapter_table() -> dict[str, str]:
    section = DOC.split("## Lambda with the Web Adapter", 1)[1]
    return dict(re.findall(r"^\| `([A-Z_]+)` \| `([^`]*)` \|", section, re.M))


def serve_args(argv: list[str]) -> dict[str, str]:
    return {argv[i].lstrip("-"): argv[i + 1] for i in range(0, len(argv) - 1) if argv[i].startswith("--")}


def test_the_task_runs_the_server_on_the_port_it_maps_and_checks_a_real_route():
    (c,) = task_definition()["containerDefinitions"]
    assert c["entryPoint"] == ["python", "-m", "function.serve"]
    args = serve_args(c["command"])
    assert args["host"] == "0.0.0.0"
    assert [p["containerPort"] for p in c["portMappings"]] == [int(args["port"])]
    health = c["healthCheck"]["command"][1]
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*?)'", health)
    assert url and int(url.group(1)) == int(args["port"]) and ROUTES[url.group(2)] == ("GET", "health")
    env = {e["name"]: e["value"] for e in c["environment"]}
    serve = ServeSettings.from_env(env)                      # every SERVE_* value is one it accepts
    assert serve.queue == int(env["SERVE_QUEUE"]) and serve.drain_s == float(env["SERVE_DRAIN_S"])
    assert c["stopTimeout"] > serve.drain_s and c["stopTimeout"] <= 120     # Fargate's ceiling
    fs = FunctionSettings.from_env(env)                       # and the function's own variables
    assert fs.model_s3_uri == env["MODEL_S3_URI"] and fs.stream_deadline_s == float(env["STREAM_DEADLINE_S"])
    assert fs.engine.max_num_seqs == int(env["WARMLLM_MAX_NUM_SEQS"]) > 1      # the task batches
    assert task_definition()["runtimePlatform"]["cpuArchitecture"] == "ARM64"


def test_the_web_adapter_talks_to_the_entry_points_port_and_waits_for_health():
    table = adapter_table()
    entry = re.search(r'^ENTRYPOINT (\[.*\])$', DOC, re.M)
    assert entry, "the adapter section gives the image's ENTRYPOINT"
    argv = json.loads(entry.group(1))
    assert argv[:3] == ["python", "-m", "function.serve"]
    assert table["AWS_LWA_PORT"] == serve_args(argv[3:])["port"]
    assert ROUTES[table["AWS_LWA_READINESS_CHECK_PATH"]] == ("GET", "health")
    assert table["AWS_LWA_READINESS_CHECK_HEALTHY_STATUS"] == "200"   # a 503 while loading is not ready
    assert table["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert ServeSettings.from_env({"SERVE_QUEUE": table["SERVE_QUEUE"]}).queue == 0
    # one request per environment: one session (the server's own default would hold sixteen)
    assert Settings.from_env({"WARMLLM_MAX_NUM_SEQS": table["WARMLLM_MAX_NUM_SEQS"]}).max_num_seqs == 1
    assert re.search(r"COPY --from=public\.ecr\.aws/awsguru/aws-lambda-adapter:\d+\.\d+\.\d+ /lambda-adapter "
                     r"/opt/extensions/lambda-adapter", DOC)


@pytest.mark.parametrize("name,bad", [("SERVE_QUEUE", "-1"), ("SERVE_DRAIN_S", "0"),
                                      ("SERVE_HEADER_TIMEOUT_S", "soon"), ("SERVE_WRITE_TIMEOUT_S", "nan")])
def test_a_bad_serve_setting_names_itself_and_the_fix(name, bad):
    with pytest.raises(ValueError, match=name):
        ServeSettings.from_env({name: bad})
