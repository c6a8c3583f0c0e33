"""One warm Runtime per test module, as a Lambda execution environment after its init."""
from __future__ import annotations

import os
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
