"""Gated full attention pieces: rotary embedding (NEOX pairing, Qwen3.5's interleaved
multi-section layout reduced to text positions) and causal GQA attention over the KV cache,
computed in query blocks so memory stays bounded (never T×T for long prompts)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from engine.jit import kernel
from engine.llvm_ops import fast_exp, half_bits_to_f32

# Bound on one block of attention scores, in floats (64 MiB).
SCORE_BLOCK_FLOATS = 16 * 1024 * 1024
# A decode step's keys per work item (`_decode_attention`): the items of all KV heads split
# between the threads, whatever the head count, each item's scores and K/V rows in L1/L2.
KEY_CHUNK = 256


def rope_angles(positions: np.ndarray, n_rot: int, base: float, sections: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of shape (T, n_rot/2) for pair i (dims i and i + n_rot/2).

    Interleaved M-RoPE assigns each pair to the t/h/w/e position stream; text uses the same
    position for t, h and w and 0 for e, so pairs falling in the e stream do not rotate.
    """
    half = n_rot // 2
    inv = (np.float32(base) ** (-2.0 * np.arange(half, dtype=np.float32) / np.float32(n_rot))).astype(np.float32)
    uses_pos = np.ones(half, dtype=bool)
    if sections and any(sections):
        total = sum(sections)
        for i in range(half):
            s = i % total
            uses_pos[i] = (
                (s % 3 == 0 and s < 3 * sections[0])
                or (s % 3 == 1 and s < 3 * sections[1])
                or (s % 3 == 2 and s < 3 * sections[2])
            )
    ang = positions.astype(np.float32)[:, None] * inv[None, :]
    ang = np.where(uses_pos[None, :], ang, 0.0)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the first n_rot dims of x (T, H, head_dim) in NEOX pairs; the rest pass through."""
    half = cos.shape[1]
    out = x.copy()
    a = x[..., :half]
    b = x[..., half:2 * half]
    c = cos[:, None, :]
    s = sin[:, None, :]
    out[..., :half] = a * c - b * s
    out[..., half:2 * half] = b * c + a * s
    return out


@kernel(fastmath=True, cache=True)
def _causal_softmax_rows(scores, first_pos, group, scale):
    """In place, per row: softmax(scale · scores) over the keys the row's query may see. Row r is
    query head r % group of the query at position first_pos + r // group, which sees keys
    0..that position; later keys get probability 0. One pass per row instead of numpy's six
    (scale, mask through a boolean index, max, subtract, exp, sum, divide: 58 ms of a 512-token
    0.8B prefill's 6 attention layers)."""
    n = scores.shape[1]
    for r in prange(scores.shape[0]):
        last = min(n, first_pos + r // group + 1)
        m = scores[r, 0] * scale
        for j in range(1, last):
            m = max(m, scores[r, j] * scale)
        total = np.float32(0.0)
        for j in range(last):
            e = fast_exp(scores[r, j] * scale - m)
            scores[r, j] = e
            total += e
        inv = np.float32(1.0) / total
        for j in range(last):
            scores[r, j] *= inv
        for j in range(last, n):
            scores[r, j] = 0.0


@njit(parallel=True, fastmath=True, cache=True, error_model="numpy")
def _decode_attention(q, k, v, n, scale, out):
    """One query position over a half-precision cache (k, v (H_kv, capacity, d) as uint16 bits,
    the first n positions valid): each
    K and V row read once for the `group` query heads that share it. Work items are (KV head,
    KEY_CHUNK keys), each with its own max, sum and weighted V sum; the heads' items are then
    merged (the softmax over all keys, split: flash-decoding)."""
    H, d = q.shape
    H_kv = k.shape[0]
    group = H // H_kv
    nch = (n + KEY_CHUNK - 1) // KEY_CHUNK
    mx = np.empty((H_kv, nch, group), dtype=np.float32)
    tot = np.empty((H_kv, nch, group), dtype=np.float32)
    acc = np.zeros((H_kv, nch, group, d), dtype=np.float32)
    for item in prange(H_kv * nch):
        kv = item // nch
        c = item % nch
        j0 = c * KEY_CHUNK
        j1 = min(n, j0 + KEY_CHUNK)
        s = np.empty((group, j1 - j0), dtype=np.float32)
        row = np.empty(d, dtype=np.float32)
        for j in range(j0, j1):
            for i in range(d):
                row[i] = half_bits_to_f32(k[kv, j, i])
            for g in range(group):
                t = np.float32(0.0)
                for i in range(d):
                    t += q[kv * group + g, i] * row[i]
                s[g, j - j0] = t * scale
        for g in range(group):
            m = s[g, 0]
            for j in range(1, j1 - j0):
                m = max(m, s[g, j])
            total = np.float32(0.0)
            for j in range(j1 - j0):
                e = fast_exp(s[g, j] - m)
                s[g, j] = e
                total += e
            mx[kv, c, g] = m
            tot[kv, c, g] = total
        for j in range(j0, j1):
            for i in range(d):
                row[i] = half_bits_to_f32(v[kv, j, i])
            for g in range(group):
                p = s[g, j - j0]
                for i in range(d):
                    acc[kv, c, g, i] += p * row[i]
    for h in prange(H):
        kv = h // group
        g = h % group
        m = mx[kv, 0, g]
        for c in range(1, nch):
            m = max(m, mx[kv, c, g])
        total = np.float32(0.0)
        for i in range(d):
            out[h, i] = 0.0
        for c in range(nch):
            w = fast_exp(mx[kv, c, g] - m)
            total += w * tot[kv, c, g]
            for i in range(d):
                out[h, i] += w * acc[kv, c, g, i]
        inv = np.float32(1.0) / total
        for i in range(d):
            out[h, i] *= inv


def decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n: int, scale: float) -> np.ndarray:
    """One query position (q (1, H, d)) over the first n positions of a float16 cache (k, v
    (H_kv, capacity, d), C-contiguous: the cache arrays themselves, not a copy): (1, H, d),
    what `causal_attention` computes, each K and V row read once (`_decode_attention`)."""
    if k.dtype != np.float16 or v.dtype != np.float16 or not (k.flags.c_contiguous and v.flags.c_contiguous):
        raise ValueError("decode_attention reads a C-contiguous float16 cache")
    out = np.empty(q.shape, dtype=np.float32)
    _decode_attention(np.ascontiguousarray(q[0], dtype=np.float32), k.view(np.uint16), v.view(np.uint16), n,
                      np.float32(scale), out[0])
    return out


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, scale: float) -> np.ndarray:
    """q (T, H, d) for positions start..start+T-1; k, v (H_kv, n, d) with n = start + T, float32
    or the cache's float16 (state.KV_DTYPE, converted per KV head for BLAS).

    Query head h reads KV head h // (H / H_kv) (grouped, as ggml broadcasts).
    Returns (T, H, d).
    """
    T, H, d = q.shape
    H_kv, n, _ = k.shape
    group = H // H_kv
    out = np.empty((T, H, d), dtype=np.float32)
    block = max(1, min(T, SCORE_BLOCK_FLOATS // max(1, group * n)))
    for kv in range(H_kv):
        qh = q[:, kv * group:(kv + 1) * group, :]  # (T, group, d)
        kf = k[kv].astype(np.float32, copy=False)
        vf = v[kv].astype(np.float32, copy=False)
        for t0 in range(0, T, block):
            t1 = min(T, t0 + block)
            n_keys = start + t1  # causal: later keys are never needed for this block
            qb = np.ascontiguousarray(qh[t0:t1]).reshape(-1, d)  # ((t1-t0)*group, d)
            scores = qb @ kf[:n_keys].T
            _causal_softmax_rows(scores.size, scores, start + t0, group, np.float32(scale))
            out[t0:t1, kv * group:(kv + 1) * group, :] = (scores @ vf[:n_keys]).reshape(t1 - t0, group, d)
    return out
