"""OpenAI error objects and the HTTP statuses that go with them.

Every failure the handler answers is an ``APIError``; ``body()`` is the exact JSON the OpenAI
API returns: ``{"error": {"message", "type", "param", "code"}}``. User input can only produce
4xx errors; a 500 means a bug in warmllm and says so.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class APIError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def invalid_json(detail: str) -> APIError:
    return APIError(400, f"request body is not valid JSON: {detail}", "invalid_request_error", None, "invalid_json")


def unauthorized() -> APIError:
    return APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "invalid_request_error",
                    None, "invalid_api_key")


def not_found(method: str, path: str) -> APIError:
    return APIError(404, f"no route for {method} {path}; routes: POST /v1/chat/completions, "
                         "POST /v1/completions, GET /v1/models, GET /health",
                    "invalid_request_error", None, "not_found")


def method_not_allowed(method: str, path: str, allowed: str) -> APIError:
    return APIError(405, f"{method} is not allowed on {path}; use {allowed}", "invalid_request_error", None,
                    "method_not_allowed")


def context_overflow(prompt_tokens: int, max_tokens: int, n_ctx: int, param: str) -> APIError:
    return APIError(
        413,
        f"this model's maximum context length is {n_ctx} tokens, but the request asks for "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt + {max_tokens} for max_tokens); "
        "shorten the prompt or lower max_tokens",
        "invalid_request_error", param, "context_length_exceeded")


def model_unavailable(why: str) -> APIError:
    return APIError(503, f"the model is not available: {why}", "server_error", None, "model_not_loaded")


def internal(request_id: str, exc: BaseException) -> APIError:
    return APIError(500, f"internal error in warmllm ({type(exc).__name__}); this is a bug, please report "
                         f"request id {request_id}", "server_error", None, "internal_error")
