"""The engine's settings: one frozen dataclass, built from the environment once at an edge (the
CLI, the Lambda function) and passed down. Nothing below the edges reads ``os.environ`` for a
setting; the exceptions are the process setup that must run before a native library loads and
reads its own variables (``NUMBA_*``, ``OPENBLAS_*``/``OMP_*``, ``MALLOC_*``: ``engine/__init__``,
``engine/threads``, ``engine/allocator``, ``engine/fpmode``).

``env_value`` is the one parser: unset or empty means the default; anything else must parse
and pass the check, or the error names the variable, what it got and what it takes.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

DEFAULT_N_CTX = 32768
DEFAULT_PREFILL_CHUNK = 512
DEFAULT_BATCH_PREFILL_CHUNK = 64
DEFAULT_BATCH_PREFILL_RATIO = 4.0
DEFAULT_SNAPSHOT_EVERY = 256
DEFAULT_SNAPSHOT_MEMORY_MB = 512.0
DEFAULT_SNAPSHOT_DIR_MB = 10240.0
DEFAULT_SNAPSHOT_FLUSH_S = 30.0
DEFAULT_SNAPSHOT_LOOKUP_BUDGET_S = 2.0
DEFAULT_SNAPSHOT_COOLDOWN_S = 60.0
DEFAULT_TEMPLATE_MAX_CHARS = 1 << 20   # engine/chat_template.py's own defaults
DEFAULT_TEMPLATE_TIME_S = 2.0


def env_value(env: Mapping[str, str], name: str, parse: Callable[[str], T], default: T, *,
              check: Callable[[T], bool] = lambda v: True, takes: str, default_is: str | None = None) -> T:
    """`env[name]` parsed, or `default` when unset or blank; an invalid value raises
    ValueError("NAME=... is invalid: set it to <takes>, or unset it for the default ...")."""
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not check(value):
        raise ValueError(f"{name}={raw!r} is invalid: set it to {takes}, "
                         f"or unset it for the default ({default if default_is is None else default_is})")
    return value


def env_str(env: Mapping[str, str], name: str) -> str | None:
    """A string setting, as given: None when unset or empty."""
    return env.get(name) or None


def flag(raw: str) -> bool:
    """A true/false variable's value (env_value's parser for them)."""
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    return env_value(env, name, int, default, check=lambda v: v >= 1, takes="a whole number >= 1")


def non_negative(env: Mapping[str, str], name: str, default: float) -> float:
    return env_value(env, name, float, default, check=lambda v: v >= 0, takes="a number >= 0")


def positive(env: Mapping[str, str], name: str, default: float) -> float:
    return env_value(env, name, float, default, check=lambda v: v > 0, takes="a number > 0")


@dataclass(frozen=True)
class SnapshotSettings:
    """The prefix-snapshot tiers (docs/snapshots.md); memory-only by default."""

    memory_mb: float = DEFAULT_SNAPSHOT_MEMORY_MB   # SNAPSHOT_MEMORY_MB (0 turns the memory tier off)
    dir: str | None = None                          # SNAPSHOT_DIR (EFS mount)
    dir_mb: float = DEFAULT_SNAPSHOT_DIR_MB         # SNAPSHOT_DIR_MB
    s3_uri: str | None = None                       # SNAPSHOT_S3_URI
    s3_endpoint_url: str | None = None              # SNAPSHOT_S3_ENDPOINT_URL
    every: int = DEFAULT_SNAPSHOT_EVERY             # SNAPSHOT_EVERY (checkpoint interval, tokens)
    max_age_s: float = 0.0                          # SNAPSHOT_MAX_AGE_S (0: no age limit)
    flush_s: float = DEFAULT_SNAPSHOT_FLUSH_S       # SNAPSHOT_FLUSH_S (0: no flush at exit)
    s3_connect_timeout_s: float = 1.0               # SNAPSHOT_S3_CONNECT_TIMEOUT_S
    s3_read_timeout_s: float = 2.0                  # SNAPSHOT_S3_READ_TIMEOUT_S (between bytes)
    s3_attempts: int = 2                            # SNAPSHOT_S3_ATTEMPTS (per call, first included)
    lookup_budget_s: float = DEFAULT_SNAPSHOT_LOOKUP_BUDGET_S   # SNAPSHOT_LOOKUP_BUDGET_S (per slow tier)
    cooldown_s: float = DEFAULT_SNAPSHOT_COOLDOWN_S  # SNAPSHOT_TIER_COOLDOWN_S (a failing tier is skipped)
    hmac_key: bytes | None = field(default=None, repr=False)    # SNAPSHOT_HMAC_KEY (shared buckets)
    hmac_key_ssm: str | None = None                 # SNAPSHOT_HMAC_KEY_SSM: an SSM parameter holding it
    hmac_key_secret: str | None = None              # SNAPSHOT_HMAC_KEY_SECRET: a Secrets Manager secret

    def __post_init__(self) -> None:
        given = [n for n, v in (("SNAPSHOT_HMAC_KEY", self.hmac_key), ("SNAPSHOT_HMAC_KEY_SSM", self.hmac_key_ssm),
                                ("SNAPSHOT_HMAC_KEY_SECRET", self.hmac_key_secret)) if v]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are both set: set one source for the snapshot HMAC key")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SnapshotSettings:
        return cls(
            memory_mb=non_negative(env, "SNAPSHOT_MEMORY_MB", DEFAULT_SNAPSHOT_MEMORY_MB),
            dir=env_str(env, "SNAPSHOT_DIR"),
            dir_mb=non_negative(env, "SNAPSHOT_DIR_MB", DEFAULT_SNAPSHOT_DIR_MB),
            s3_uri=env_str(env, "SNAPSHOT_S3_URI"),
            s3_endpoint_url=env_str(env, "SNAPSHOT_S3_ENDPOINT_URL"),
            every=positive_int(env, "SNAPSHOT_EVERY", DEFAULT_SNAPSHOT_EVERY),
            max_age_s=non_negative(env, "SNAPSHOT_MAX_AGE_S", 0.0),
            flush_s=non_negative(env, "SNAPSHOT_FLUSH_S", DEFAULT_SNAPSHOT_FLUSH_S),
            s3_connect_timeout_s=positive(env, "SNAPSHOT_S3_CONNECT_TIMEOUT_S", 1.0),
            s3_read_timeout_s=positive(env, "SNAPSHOT_S3_READ_TIMEOUT_S", 2.0),
            s3_attempts=positive_int(env, "SNAPSHOT_S3_ATTEMPTS", 2),
            lookup_budget_s=positive(env, "SNAPSHOT_LOOKUP_BUDGET_S", DEFAULT_SNAPSHOT_LOOKUP_BUDGET_S),
            cooldown_s=non_negative(env, "SNAPSHOT_TIER_COOLDOWN_S", DEFAULT_SNAPSHOT_COOLDOWN_S),
            hmac_key=(env_str(env, "SNAPSHOT_HMAC_KEY") or "").encode() or None,
            hmac_key_ssm=env_str(env, "SNAPSHOT_HMAC_KEY_SSM"),
            hmac_key_secret=env_str(env, "SNAPSHOT_HMAC_KEY_SECRET"),
        )


@dataclass(frozen=True)
class Settings:
    """Everything the engine is configured with; `Settings()` is the defaults."""

    threads: int | None = None                      # WARMLLM_THREADS (None: the CPUs this process may use)
    n_ctx: int = DEFAULT_N_CTX                      # WARMLLM_N_CTX (capped by the model's training context)
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK      # WARMLLM_PREFILL_CHUNK (tokens per batched forward)
    # WARMLLM_MAX_NUM_SEQS: generations decoding together (engine/batch.py); 1, the Lambda
    # function's (one request per environment), runs the model on the caller's thread
    max_num_seqs: int = 1
    # WARMLLM_BATCH_PREFILL_CHUNK: with max_num_seqs > 1, the prompt tokens one step prefills
    # beside the decoding streams (each chunk delays their next token by its time)
    batch_prefill_chunk: int = DEFAULT_BATCH_PREFILL_CHUNK
    # WARMLLM_BATCH_EXACT: a batched step multiplies each sequence's row on its own (each one's
    # decode kernel, bit for bit its output alone) instead of all rows in the int8 tiles (~2.5x
    # the aggregate at 16 sequences, each product rounded ~1 ulp differently)
    batch_exact: bool = False
    # WARMLLM_BATCH_PREFILL_RATIO: while others decode, a step's prompt piece takes at most this
    # many times the last decode step (engine/batch.py); 0: whole WARMLLM_BATCH_PREFILL_CHUNKs
    batch_prefill_ratio: float = DEFAULT_BATCH_PREFILL_RATIO
    snapshots: SnapshotSettings = SnapshotSettings()
    template_max_chars: int = DEFAULT_TEMPLATE_MAX_CHARS   # TEMPLATE_MAX_CHARS (a chat template's output)
    template_time_s: float = DEFAULT_TEMPLATE_TIME_S       # TEMPLATE_TIME_S (rendering one chat prompt)
    tokenizer_cache_dir: str | None = None          # TOKENIZER_CACHE_DIR (engine/tokenizer_cache.py)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(
            threads=env_value(env, "WARMLLM_THREADS", int, None, check=lambda v: v is not None and v >= 1,
                              takes="a whole number >= 1", default_is="the CPUs this process may use"),
            n_ctx=positive_int(env, "WARMLLM_N_CTX", DEFAULT_N_CTX),
            prefill_chunk=positive_int(env, "WARMLLM_PREFILL_CHUNK", DEFAULT_PREFILL_CHUNK),
            max_num_seqs=positive_int(env, "WARMLLM_MAX_NUM_SEQS", 1),
            batch_prefill_chunk=positive_int(env, "WARMLLM_BATCH_PREFILL_CHUNK", DEFAULT_BATCH_PREFILL_CHUNK),
            batch_exact=env_value(env, "WARMLLM_BATCH_EXACT", flag, False, takes="true or false"),
            batch_prefill_ratio=non_negative(env, "WARMLLM_BATCH_PREFILL_RATIO", DEFAULT_BATCH_PREFILL_RATIO),
            snapshots=SnapshotSettings.from_env(env),
            template_max_chars=positive_int(env, "TEMPLATE_MAX_CHARS", DEFAULT_TEMPLATE_MAX_CHARS),
            template_time_s=positive(env, "TEMPLATE_TIME_S", DEFAULT_TEMPLATE_TIME_S),
            tokenizer_cache_dir=tokenizer_cache_dir(env),
        )


def tokenizer_cache_dir(env: Mapping[str, str]) -> str | None:
    """TOKENIZER_CACHE_DIR, or "off" for none; unset: a ``tokenizers`` folder in numba's kernel
    cache (NUMBA_CACHE_DIR, already versioned by the engine's sources), none without one."""
    given = env_str(env, "TOKENIZER_CACHE_DIR")
    if given is not None:
        return None if given.strip().lower() == "off" else given
    numba_dir = env_str(env, "NUMBA_CACHE_DIR")
    return os.path.join(numba_dir, "tokenizers") if numba_dir else None
