"""``python -m function [EVENT.json]``: invoke the handler once, locally, as ``make run`` does.

Prints the request's log line(s) as the handler writes them, the raw response (what API Gateway
would send), and then, apart, the answer's text — with a notice when the model is one of our
factory's random-weights test models, whose text is noise by design. Loading (and the first
run's kernel compile) reports progress on stderr. Uses ``MODEL_PATH`` / ``MODEL_S3_URI`` like
the Lambda does.
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid

from .progress import heartbeat

RANDOM_WEIGHTS_NOTICE = ("NOTE: {path} is a test model with random weights (built by our model factory): "
                         "its answer is random text by design. For real answers: `make real-model` (the trained "
                         "Qwen2.5-Coder-0.5B-Instruct, what `make run` uses when it can fetch it), or a GGUF of "
                         "your own: make run MODEL=path/to/Qwen3.5-0.8B-Q4_K_M.gguf (README: 'Start here', "
                         "'Which model, which memory').")


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


def answer_text(resp) -> str | None:
    """The generated text inside a handler response (chat, completion, or an SSE stream), if any."""
    body = resp.get("body") if isinstance(resp, dict) and "statusCode" in resp else resp
    if isinstance(body, str):
        if body.startswith("data:"):
            parts = []
            for line in body.splitlines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:]).get("choices", []):
                        parts.append((c.get("delta") or {}).get("content") or c.get("text") or "")
            return "".join(parts)
        try:
            body = json.loads(body)
        except ValueError:
            return None
    if not isinstance(body, dict) or not body.get("choices"):
        return None
    c = body["choices"][0]
    msg = c.get("message") or {}
    if msg.get("tool_calls"):
        return json.dumps(msg["tool_calls"], ensure_ascii=False)
    return msg.get("content") if "message" in c else c.get("text")


def main(argv: list[str]) -> int:
    path = argv[0] if argv else "events/chat_http_api.json"
    with open(path) as f:
        event = json.load(f)
    model = os.environ.get("MODEL_PATH") or os.environ.get("MODEL_S3_URI") or "(no MODEL_PATH set)"
    cache = os.environ.get("NUMBA_CACHE_DIR", "numba's default cache")
    with heartbeat(f"loading {model} and answering {path}",
                   f"the first run compiles the numba kernels, ~15-25 s; later runs reuse {cache}"):
        from .app import RUNTIME, handler
        from .errors import APIError
        # a local run waits for the load (the first run's compile can outlast API Gateway's 28 s
        # request deadline on a slow or busy machine); a failed load is the handler's 503 below
        try:
            RUNTIME.wait_for_engine(time.monotonic() + LocalContext().get_remaining_time_in_millis() / 1000)
        except APIError:
            pass
        resp = handler(event, LocalContext())
    print("--- raw response (what API Gateway returns) ---")
    print(json.dumps(resp, indent=2, ensure_ascii=False))
    text = answer_text(resp)
    if text is not None:
        print("--- answer ---")
        print(text)
    from .dev_model import is_factory_model
    local = os.environ.get("MODEL_PATH")
    if local and is_factory_model(local):
        print(RANDOM_WEIGHTS_NOTICE.format(path=local))
    status = resp.get("statusCode", 200) if isinstance(resp, dict) else 200
    return 0 if status < 500 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
