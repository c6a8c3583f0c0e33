"""Elementwise and normalisation ops shared by the model's mixers (f32 in, f32 out)."""
from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) · w over the last axis."""
    ms = np.einsum("...d,...d->...", x, x, dtype=np.float32) / np.float32(x.shape[-1])
    y = x * (1.0 / np.sqrt(ms + np.float32(eps)))[..., None].astype(np.float32)
    return y * w if w is not None else y


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return (x * sigmoid(x)).astype(np.float32)


def softplus(x: np.ndarray) -> np.ndarray:
    # ggml: x > 20 → x, else log1p(exp(x)); logaddexp matches within f32 and never overflows
    return np.logaddexp(np.float32(0.0), x).astype(np.float32)
