"""The function's settings: the engine's `Settings` plus what only the Lambda function reads,
built once from the environment in ``function/app.py`` (or a test) and handed to the Runtime.
One parser for every variable (``engine.settings.env_value``): an invalid value is an error
at init naming the variable and the fix, never a silent fallback."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.settings import Settings, env_str, env_value, flag, non_negative, positive

from .limits import Limits

DEFAULT_API_DEADLINE_S = 28.0
DEFAULT_MARGIN_S = 0.5
DEFAULT_MODEL_RETRY_S = 30.0
DEFAULT_INIT_BUDGET_S = 8.0
DEFAULT_MODEL_DIR = "/tmp/warmllm-models"
DEFAULT_WATCHDOG_MARGIN_S = 1.0
DEFAULT_STREAM_DEADLINE_S = 300.0
DEFAULT_STREAM_KEEPALIVE_S = 5.0


def _url_auth(env: Mapping[str, str]) -> str:
    v = (env_str(env, "FUNCTION_URL_AUTH_TYPE") or "NONE").upper()
    if v not in ("AWS_IAM", "NONE"):
        raise ValueError(f"FUNCTION_URL_AUTH_TYPE={v!r} is invalid: set it to AWS_IAM or NONE (the Function "
                         "URL's AuthType), or unset it for NONE")
    return v


def _api_key(env: Mapping[str, str]) -> str | None:
    """WARMLLM_API_KEY: unset means no key; set but blank is an error, not "auth off" (a
    template that fills it from an empty parameter would otherwise open the API silently)."""
    if "WARMLLM_API_KEY" in env and not env["WARMLLM_API_KEY"].strip():
        raise ValueError("WARMLLM_API_KEY is set but empty: set it to the bearer token clients must send, "
                         "or unset it (remove the variable) to leave the API open")
    return env_str(env, "WARMLLM_API_KEY")


@dataclass(frozen=True)
class FunctionSettings:
    engine: Settings = field(default_factory=Settings)
    model_path: str | None = None                   # MODEL_PATH: a GGUF on disk (EFS, the image)
    model_s3_uri: str | None = None                 # MODEL_S3_URI: s3://bucket/key.gguf, downloaded once
    model_dir: str = DEFAULT_MODEL_DIR              # MODEL_DIR: where the download goes
    api_key: str | None = None                      # WARMLLM_API_KEY: Bearer token required when set
    api_deadline_s: float = DEFAULT_API_DEADLINE_S  # API_DEADLINE_S: API Gateway's integration timeout
    deadline_margin_s: float = DEFAULT_MARGIN_S     # DEADLINE_MARGIN_S: answer this long before it
    model_retry_s: float = DEFAULT_MODEL_RETRY_S    # MODEL_RETRY_S: wait before retrying a failed load
    init_budget_s: float = DEFAULT_INIT_BUDGET_S    # INIT_BUDGET_S: how long init waits for the model
    watchdog_margin_s: float = DEFAULT_WATCHDOG_MARGIN_S  # WATCHDOG_MARGIN_S: the timeout line this long before Lambda's
    limits: Limits = field(default_factory=Limits)  # MAX_BODY_BYTES, MAX_JSON_DEPTH, ... (function/limits.py)
    # STREAM_DEADLINE_S: the deadline of an invocation through a streaming integration (Function URL,
    # REST API), counted like API_DEADLINE_S; still capped by Lambda's remaining time
    stream_deadline_s: float = DEFAULT_STREAM_DEADLINE_S
    stream_keepalive_s: float = DEFAULT_STREAM_KEEPALIVE_S  # STREAM_KEEPALIVE_S: ": keep-alive" while prefilling
    # FUNCTION_URL_AUTH_TYPE=AWS_IAM: Lambda authenticated every Function URL request (SigV4), whose
    # Authorization header is the signature: the bearer check does not apply to those events
    function_url_iam: bool = False
    # MODEL_IN_MEMORY: download MODEL_S3_URI into memory, not MODEL_DIR. Default: on in a SnapStart
    # init (AWS_LAMBDA_INITIALIZATION_TYPE=snap-start), whose snapshot may hold at most 512 MB of /tmp
    model_in_memory: bool = False

    @property
    def model_source(self) -> str | None:
        """"path" / "s3" / None: what a health body may say (the path or URI stays in the log)."""
        return "path" if self.model_path else "s3" if self.model_s3_uri else None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> FunctionSettings:
        return cls(
            engine=Settings.from_env(env),
            model_path=env_str(env, "MODEL_PATH"),
            model_s3_uri=env_str(env, "MODEL_S3_URI"),
            model_dir=env_str(env, "MODEL_DIR") or DEFAULT_MODEL_DIR,
            api_key=_api_key(env),
            api_deadline_s=positive(env, "API_DEADLINE_S", DEFAULT_API_DEADLINE_S),
            deadline_margin_s=non_negative(env, "DEADLINE_MARGIN_S", DEFAULT_MARGIN_S),
            model_retry_s=non_negative(env, "MODEL_RETRY_S", DEFAULT_MODEL_RETRY_S),
            init_budget_s=non_negative(env, "INIT_BUDGET_S", DEFAULT_INIT_BUDGET_S),
            watchdog_margin_s=non_negative(env, "WATCHDOG_MARGIN_S", DEFAULT_WATCHDOG_MARGIN_S),
            limits=Limits.from_env(env),
            stream_deadline_s=positive(env, "STREAM_DEADLINE_S", DEFAULT_STREAM_DEADLINE_S),
            stream_keepalive_s=non_negative(env, "STREAM_KEEPALIVE_S", DEFAULT_STREAM_KEEPALIVE_S),
            function_url_iam=_url_auth(env) == "AWS_IAM",
            model_in_memory=env_value(env, "MODEL_IN_MEMORY", flag, snapstart_init(env),
                                      takes="true or false", default_is="true in a SnapStart init"),
        )


def snapstart_init(env: Mapping[str, str]) -> bool:
    """This init is the one Lambda snapshots (SnapStart), not an ordinary cold start."""
    return env.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "snap-start"

