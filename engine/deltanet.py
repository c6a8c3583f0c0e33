"""Gated DeltaNet (the linear-attention mixer of Qwen3.5), as llama.cpp computes it.

Per value head: S = exp(g)·S; S += k ⊗ beta·(v − Sᵀk); o = Sᵀq.
Prefill uses the chunked (WY) form so a chunk of C tokens is a handful of matrix products;
decode (T == 1) uses the recurrence. Shapes: q, k (T, H, d_k) with k-heads already repeated to
the value heads, v (T, H, d_v), g and beta (T, H), S (H, d_k, d_v).
"""
from __future__ import annotations

import numpy as np

CHUNK = 64


def causal_conv1d(x: np.ndarray, tail: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv over time. x (T, C), tail (K-1, C) previous inputs, w (C, K).

    Returns (y (T, C), new tail (K-1, C)).
    """
    K = w.shape[1]
    T = x.shape[0]
    xp = np.concatenate([tail, x], axis=0)  # (T + K - 1, C)
    y = xp[0:T] * w[:, 0]
    for j in range(1, K):
        y += xp[j:j + T] * w[:, j]
    return y, np.ascontiguousarray(xp[T:])


def l2_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x²) + eps) over the last axis (llama.cpp's gdn l2 norm)."""
    ss = np.einsum("...d,...d->...", x, x, dtype=np.float32)
    return x / np.sqrt(ss + np.float32(eps))[..., None]


def gated_delta_step(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                     beta: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One token (T == 1): the recurrence. S is updated in place and returned."""
    q0, k0, v0 = q[0], k[0], v[0]
    S *= np.exp(g[0])[:, None, None]
    kv_mem = np.einsum("hkv,hk->hv", S, k0)
    delta = (v0 - kv_mem) * beta[0][:, None]
    S += k0[:, :, None] * delta[:, None, :]
    o = np.einsum("hkv,hk->hv", S, q0)
    return o[None].astype(np.float32, copy=False), S


def gated_delta_chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                        beta: np.ndarray, S: np.ndarray, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """T tokens in chunks of `chunk`: intra-chunk parts for all chunks at once, then one
    short loop over chunks carrying the state. Padded positions have beta = 0 and g = 0,
    so they change nothing."""
    T, H, dk = q.shape
    dv = v.shape[2]
    C = chunk
    pad = (-T) % C
    N = (T + pad) // C

    def heads_chunks(a: np.ndarray) -> np.ndarray:
        if pad:
            a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], dtype=a.dtype)], axis=0)
        a = np.moveaxis(a, 1, 0)  # (H, T', ...)
        return np.ascontiguousarray(a.reshape((H, N, C) + a.shape[2:]))

    qc, kc, vc = heads_chunks(q), heads_chunks(k), heads_chunks(v)  # (H, N, C, d)
    gc, bc = heads_chunks(g), heads_chunks(beta)  # (H, N, C)

    G = np.cumsum(gc, axis=2, dtype=np.float32)  # cumulative log-decay within each chunk
    incl = np.tril(np.ones((C, C), dtype=bool))
    strict = np.tril(np.ones((C, C), dtype=bool), -1)
    diff = G[..., :, None] - G[..., None, :]  # (H, N, C_t, C_s)
    decay = np.exp(np.where(incl, diff, -np.inf)).astype(np.float32)

    kk = kc @ np.swapaxes(kc, -1, -2)
    A = np.where(strict, kk * decay * bc[..., :, None], 0.0).astype(np.float32)
    M = A + np.eye(C, dtype=np.float32)
    eG = np.exp(G)
    rhs = np.concatenate([bc[..., None] * vc, (bc * eG)[..., None] * kc], axis=-1)
    sol = np.linalg.solve(M, rhs).astype(np.float32)  # unit lower-triangular systems
    Ub, W = sol[..., :dv], sol[..., dv:]

    qk = np.where(incl, (qc @ np.swapaxes(kc, -1, -2)) * decay, 0.0).astype(np.float32)
    qg = qc * eG[..., None]
    G_last = G[..., -1]  # (H, N)
    kd = np.swapaxes(kc * np.exp(G_last[..., None] - G)[..., None], -1, -2)  # (H, N, dk, C)
    g_last = np.exp(G_last)

    out = np.empty((H, N, C, dv), dtype=np.float32)
    S = np.array(S, dtype=np.float32, copy=True)
    for n in range(N):
        U = Ub[:, n] - W[:, n] @ S  # (H, C, dv)
        out[:, n] = qg[:, n] @ S + qk[:, n] @ U
        S = g_last[:, n, None, None] * S + kd[:, n] @ U
    o = np.moveaxis(out.reshape(H, N * C, dv)[:, :T], 0, 1)  # (T, H, dv)
    return np.ascontiguousarray(o), S
