"""One warm Runtime per test module, as a Lambda execution environment after its init."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from function.runtime import Runtime


def warm_runtime(model_path: Path, **env: str) -> Runtime:
    """Runtime.from_env on this process's environment plus MODEL_PATH and `env`, with its init done
    (the model loaded, the kernels compiled): a failed init fails the test with the runtime's error."""
    r = Runtime.from_env({**os.environ, "MODEL_PATH": str(model_path), **env})
    r.start_init(budget_s=300)
    assert r.engine is not None, r.error
    return r


class Ctx:
    """A Lambda context: a request id and the time left (a deadline `remaining_ms` from now)."""

    def __init__(self, remaining_ms: int = 120_000, rid: str = "req-test") -> None:
        self.aws_request_id = rid
        self._end = time.monotonic() + remaining_ms / 1000.0

    def get_remaining_time_in_millis(self) -> int:
        return int((self._end - time.monotonic()) * 1000)


ROOT = Path(__file__).resolve().parents[2]


def start_serve(model_path: Path, **env: str) -> tuple[subprocess.Popen, str | None]:
    """``python -m function.serve --port 0`` (what ``make serve`` runs) on `model_path`: the process
    and its base URL once it listens (None if it ended first; its stderr says why)."""
    full = {**os.environ, "MODEL_PATH": str(model_path), "INIT_BUDGET_S": "120",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep), **env}
    proc = subprocess.Popen([sys.executable, "-m", "function.serve", "--port", "0"], cwd=ROOT, env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if line.startswith("{") and '"event": "serve"' in line:
            return proc, json.loads(line)["url"]
    return proc, None


def stop_serve(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
