"""``python -m function [EVENT.json]``: invoke the handler once, locally, as ``make run`` does.

Prints the request's log line(s) as the handler writes them, then the response. Uses
``MODEL_PATH`` / ``MODEL_S3_URI`` like the Lambda does.
"""
from __future__ import annotations

import json
import sys
import time
import uuid


class LocalContext:
    """The parts of the Lambda context object the handler reads."""

    def __init__(self, timeout_s: float = 900.0, function_name: str = "warmllm-local") -> None:
        self.aws_request_id = str(uuid.uuid4())
        self.function_name = function_name
        self.memory_limit_in_mb = 10240
        self.invoked_function_arn = f"arn:aws:lambda:local:000000000000:function:{function_name}"
        self._end = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._end - time.monotonic()) * 1000))


def main(argv: list[str]) -> int:
    path = argv[0] if argv else "events/chat_http_api.json"
    with open(path) as f:
        event = json.load(f)
    from .app import handler
    resp = handler(event, LocalContext())
    print(json.dumps(resp, indent=2, ensure_ascii=False))
    status = resp.get("statusCode", 200) if isinstance(resp, dict) else 200
    return 0 if status < 500 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
