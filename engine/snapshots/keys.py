"""The snapshot HMAC key from where the deployment keeps it: the environment
(SNAPSHOT_HMAC_KEY), an SSM parameter (SNAPSHOT_HMAC_KEY_SSM, SecureString decrypted) or a
Secrets Manager secret (SNAPSHOT_HMAC_KEY_SECRET), read once when the store is built (init)."""
from __future__ import annotations

import dataclasses
from typing import Any

from engine.settings import SnapshotSettings

KEY_CONNECT_TIMEOUT_S = 2.0   # per attempt; worst case ~2 x (2 + 2) s + backoff, inside Lambda's 10 s init
KEY_READ_TIMEOUT_S = 2.0
KEY_ATTEMPTS = 2


def resolve_hmac_key(s: SnapshotSettings, *, ssm_client: Any = None, secrets_client: Any = None) -> SnapshotSettings:
    """`s` with `hmac_key` filled from SSM or Secrets Manager when one is named; a key that
    cannot be read is an error naming the variable and the permission it needs (a store must
    not silently run without the key it was configured to require)."""
    if s.hmac_key or not (s.hmac_key_ssm or s.hmac_key_secret):
        return s
    import boto3
    from botocore.config import Config
    # bounded like the S3 tier: in a VPC without a route to SSM / Secrets Manager (EFS and no NAT
    # or interface endpoint) botocore's defaults (60 s timeouts, retries) would hang init for minutes
    cfg = Config(connect_timeout=KEY_CONNECT_TIMEOUT_S, read_timeout=KEY_READ_TIMEOUT_S,
                 retries={"total_max_attempts": KEY_ATTEMPTS, "mode": "standard"})
    try:
        if s.hmac_key_ssm:
            client = ssm_client or boto3.client("ssm", config=cfg)
            value = client.get_parameter(Name=s.hmac_key_ssm, WithDecryption=True)["Parameter"]["Value"]
        else:
            client = secrets_client or boto3.client("secretsmanager", region_name=_arn_region(s.hmac_key_secret),
                                                   config=cfg)
            value = client.get_secret_value(SecretId=s.hmac_key_secret)["SecretString"]
    except Exception as exc:
        name, ref, perm = (("SNAPSHOT_HMAC_KEY_SSM", s.hmac_key_ssm, "ssm:GetParameter (and kms:Decrypt)")
                           if s.hmac_key_ssm else
                           ("SNAPSHOT_HMAC_KEY_SECRET", s.hmac_key_secret, "secretsmanager:GetSecretValue"))
        raise ValueError(f"{name}={ref!r} could not be read ({type(exc).__name__}: {exc}); check the name and "
                         f"that the function's role has {perm}") from None
    if not value:
        raise ValueError("the snapshot HMAC key read from SSM / Secrets Manager is empty")
    return dataclasses.replace(s, hmac_key=str(value).encode(), hmac_key_ssm=None, hmac_key_secret=None)


def _arn_region(ref: str | None) -> str | None:
    """The region of a secret's ARN (a secret is read from its own region's endpoint, and the
    templates scope the role to the ARN they are given); None for a name: the default region."""
    parts = (ref or "").split(":")
    return (parts[3] or None) if len(parts) > 6 and parts[0] == "arn" and parts[2] == "secretsmanager" else None
