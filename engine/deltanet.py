"""Gated DeltaNet (the linear-attention mixer of Qwen3.5), as llama.cpp computes it.

Per value head: S = exp(g)·S; S += k ⊗ beta·(v − Sᵀk); o = Sᵀq.
Prefill uses the chunked (WY) form so a chunk of C tokens is a handful of matrix products;
decode (T == 1) and short prefills (T <= RECURRENT_MAX) use the recurrence, fused in one kernel.
Both return the states after any token counts asked for (`capture`), so a prefill captures its
checkpoints in one pass. Shapes: q, k (T, H, d_k) with k-heads already repeated to
the value heads, v (T, H, d_v), g and beta (T, H), S (H, d_k, d_v).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange

from engine.jit import kernel
from engine.llvm_ops import fast_exp
from engine.threads import split_over_threads

CHUNK = 64
# Up to this many tokens the prefill runs the recurrence kernel: the chunked form's fixed costs
# (padding to a chunk, per-chunk numpy temporaries) lose below it. 0.8B shapes (16 heads,
# 128x128), 2 threads, per layer: T=18 1.4 vs 5.6 ms, T=128 6.7 vs 10.5, T=256 18.5 vs 17.9.
RECURRENT_MAX = 128


@kernel(fastmath=True, cache=True)
def _conv_silu_rows(tail, x, wt, y):
    """y = SiLU(depthwise causal conv of [tail; x]) without building [tail; x]: row t of the
    padded input is tail[t] for t < K-1, else x[t - (K-1)]. SiLU fused (one pass over y less)."""
    T, C = y.shape
    K = wt.shape[0]
    K1 = K - 1
    for t in prange(T):
        for c in range(C):
            y[t, c] = 0.0
        for j in range(K):
            p = t + j  # row of the padded input
            if p < K1:
                for c in range(C):
                    y[t, c] += tail[p, c] * wt[j, c]
            else:
                for c in range(C):
                    y[t, c] += x[p - K1, c] * wt[j, c]
        for c in range(C):
            v = y[t, c]
            y[t, c] = v / (np.float32(1.0) + fast_exp(-v))


def _padded_rows(tail: np.ndarray, x: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1 of [tail; x] as a new array (never a view: a state must not keep x alive)."""
    K1 = tail.shape[0]
    if r0 >= K1:
        return x[r0 - K1:r1 - K1].copy()
    return np.concatenate([tail[r0:min(r1, K1)], x[:max(0, r1 - K1)]], axis=0)


def causal_conv1d_silu(x: np.ndarray, tail: np.ndarray, w: np.ndarray,
                       capture: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """SiLU of the depthwise causal conv over time. x (T, C), tail (K-1, C) previous inputs, w (C, K).

    Returns (y (T, C), new tail (K-1, C), the tails after each of the `capture` token counts).
    """
    T = x.shape[0]
    K1 = tail.shape[0]
    x = np.ascontiguousarray(x, dtype=np.float32)
    tail = np.ascontiguousarray(tail, dtype=np.float32)
    if not tail.flags.writeable:
        # a frozen snapshot's tail (State.fork): numba types a read-only array apart, and the
        # first turn restored from memory compiled the kernel again for it (0.6 s of its TTFT)
        tail = tail.copy()
    y = np.empty((T, x.shape[1]), dtype=np.float32)
    # decode (T == 1) runs serially: a parallel launch cost ~190 us of a 6144-channel step
    # w.T is a view, not a copy, when w is F-ordered (the model stores it so)
    _conv_silu_rows(y.size, tail, x, np.ascontiguousarray(w.T, dtype=np.float32), y)
    # copies, not views: a view of the input kept the whole (T + K - 1, C) padded input alive in
    # the state (217 MB over 18 layers after a 512-token prefill of the 0.8B model)
    return y, _padded_rows(tail, x, T, T + K1), [_padded_rows(tail, x, r, r + K1) for r in capture]


@kernel(fastmath=True, cache=True)
def _l2_heads(src, col0, H, d, eps, scale, out):
    """out[t, h] = scale · x / sqrt(sum(x²) + eps) for x = src[t, col0 + h·d : col0 + (h+1)·d]:
    straight from the conv output's columns (a (T, H, d) view of them is not C-contiguous, and
    numba does not vectorise strided rows)."""
    for th in prange(out.shape[0] * H):
        t = th // H
        h = th % H
        base = col0 + h * d
        ss = np.float32(0.0)
        for i in range(d):
            v = src[t, base + i]
            ss += v * v
        inv = scale / np.sqrt(ss + eps)
        for i in range(d):
            out[t, h, i] = src[t, base + i] * inv


def l2_normalize(x: np.ndarray, eps: float, heads: int, d: int, col0: int = 0,
                 scale: float = 1.0) -> np.ndarray:
    """scale · x / sqrt(sum(x²) + eps) over each head's d values (llama.cpp's gdn l2 norm), for
    the heads in columns col0 .. col0 + heads·d of the (T, C) matrix x; returns (T, heads, d)."""
    src = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((src.shape[0], heads, d), dtype=np.float32)
    _l2_heads(out.size, src, col0, heads, d, np.float32(eps), np.float32(scale), out)
    return out


@njit(inline="always", fastmath=True, cache=True)
def _head_step(Sh, qh, kh, vh, decay, b, mem, oh):
    """One token through one value head's state Sh (d_k, d_v), in place; oh = its output. Two
    passes over Sh: mem = Shᵀk, then Sh = decay·Sh + k ⊗ delta with oh = Shᵀq as it is written."""
    dk, dv = Sh.shape
    for j in range(dv):
        mem[j] = 0.0
    for i in range(dk):
        ki = kh[i]
        for j in range(dv):
            mem[j] += Sh[i, j] * ki
    for j in range(dv):
        mem[j] = (vh[j] - mem[j] * decay) * b  # now delta
    for j in range(dv):
        oh[j] = 0.0
    for i in range(dk):
        ki = kh[i]
        qi = qh[i]
        for j in range(dv):
            s = Sh[i, j] * decay + ki * mem[j]
            Sh[i, j] = s
            oh[j] += s * qi


@njit(parallel=True, fastmath=True, cache=True)
def _delta_steps(q, k, v, g, beta, S, o, cap_at, caps):
    """The recurrence over T tokens, fused per head: two passes over the head's (d_k, d_v) state
    per token instead of numpy's four (decay, Sᵀk, rank-1 update, Sᵀq) with temporaries, and only
    the second writes: (decay·S)ᵀk = decay·(Sᵀk), so the decay is applied where S is rewritten.
    The 18 layers' states (1 MB each on the 0.8B model) do not stay in cache beside the weights
    streaming through it, so each pass over S is a pass over memory (decode over 18 layers:
    13 -> ~2 ms per token fused; a write pass fewer: 108 -> 86 us per layer with the state in cache,
    153 vs 164 us cycling through 18 states: memory, not arithmetic, bounds it there).
    S is advanced in place; after token t, caps[c] = S for every c with cap_at[c] == t + 1."""
    T = q.shape[0]
    H, dk, dv = S.shape
    for h in prange(H):
        mem = np.empty(dv, dtype=np.float32)
        c = 0
        for t in range(T):
            _head_step(S[h], q[t, h], k[t, h], v[t, h], np.exp(g[t, h]), beta[t, h], mem, o[t, h])
            while c < cap_at.shape[0] and cap_at[c] == t + 1:
                caps[c, h] = S[h]
                c += 1


# The decode step captures nothing: empty arrays made once, not per layer and token (they hold
# no element, so nothing can write to them; numba types read-only arrays apart, so not frozen).
_NO_CAPTURE_AT = np.empty(0, np.int64)
_NO_CAPTURES = np.empty((0, 1, 1, 1), np.float32)


def gated_delta_step(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                     beta: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One token (T == 1): the recurrence. S is updated in place and returned."""
    f32 = np.float32
    o = np.empty((1, S.shape[0], S.shape[2]), dtype=f32)
    _delta_steps(np.ascontiguousarray(q, f32), np.ascontiguousarray(k, f32), np.ascontiguousarray(v, f32),
                 np.ascontiguousarray(g, f32), np.ascontiguousarray(beta, f32), S, o, _NO_CAPTURE_AT, _NO_CAPTURES)
    return o, S


@njit(parallel=True, fastmath=True, cache=True, error_model="numpy")
def _decode_token(qkv, z, beta_in, alpha_in, tail, wt, dt_bias, a, norm_w, eps, hk, q_scale, S, out):
    """One token through a DeltaNet layer between its projections and its output matrix, in one
    launch (`decode_token`): what _conv_silu_rows, _l2_heads, the ops and _delta_steps compute,
    in their order. The conv over all channels (its tail shifted in place), the q/k norms, beta
    and g run serially (~6k values); each value head's recurrence and gated RMS norm in parallel."""
    K1, C = tail.shape
    H, dk, dv = S.shape
    kd = hk * dk
    conv = np.zeros(C, dtype=np.float32)
    for j in range(K1):  # taps outside, channels inside: the channel loops vectorise
        for c in range(C):
            conv[c] += tail[j, c] * wt[j, c]
    for c in range(C):
        acc = conv[c] + qkv[c] * wt[K1, c]
        conv[c] = acc / (np.float32(1.0) + fast_exp(-acc))
    for j in range(K1 - 1):
        for c in range(C):
            tail[j, c] = tail[j + 1, c]
    for c in range(C):
        tail[K1 - 1, c] = qkv[c]
    qn = np.empty((hk, dk), dtype=np.float32)
    kn = np.empty((hk, dk), dtype=np.float32)
    for hh in range(hk):
        for which in range(2):
            base = hh * dk + which * kd
            ss = np.float32(0.0)
            for i in range(dk):
                ss += conv[base + i] * conv[base + i]
            inv = (q_scale if which == 0 else np.float32(1.0)) / np.sqrt(ss + eps)
            dst = qn if which == 0 else kn
            for i in range(dk):
                dst[hh, i] = conv[base + i] * inv
    beta = np.empty(H, dtype=np.float32)
    g = np.empty(H, dtype=np.float32)
    for h in range(H):
        beta[h] = np.float32(1.0) / (np.float32(1.0) + fast_exp(-beta_in[h]))
        x = alpha_in[h] + dt_bias[h]
        # np.logaddexp(0, x) (ops.softplus), in float32
        g[h] = (max(x, np.float32(0.0)) + np.log1p(np.exp(-abs(x)))) * a[h]
    for h in prange(H):
        kh = h % hk  # value head h reads key head h % n_k_heads
        mem = np.empty(dv, dtype=np.float32)
        o = np.empty(dv, dtype=np.float32)
        v0 = 2 * kd + h * dv
        _head_step(S[h], qn[kh], kn[kh], conv[v0:v0 + dv], np.exp(g[h]), beta[h], mem, o)
        ss = np.float32(0.0)
        for j in range(dv):
            ss += o[j] * o[j]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(dv) + eps)
        for j in range(dv):
            zj = z[h * dv + j]
            out[h * dv + j] = o[j] * inv * norm_w[j] * (zj / (np.float32(1.0) + fast_exp(-zj)))


def decode_token(qkv: np.ndarray, z: np.ndarray, beta: np.ndarray, alpha: np.ndarray, tail: np.ndarray,
                 conv_w: np.ndarray, dt_bias: np.ndarray, a: np.ndarray, norm_w: np.ndarray, eps: float,
                 n_k_heads: int, S: np.ndarray) -> np.ndarray:
    """A decode step's DeltaNet between the projections (qkv (conv_dim,), z (H·d_v,), the raw
    beta and alpha (H,)) and the output matrix: the causal conv + SiLU, q/k L2 norms (q scaled
    by 1/sqrt(d_k)), beta = sigmoid, g = softplus(alpha + dt_bias)·a, the recurrence, and the RMS
    norm of each head's output gated by SiLU(z); returns that (H·d_v,) vector. The conv tail
    (K-1, conv_dim) and S (H, d_k, d_v) advance in place: the caller passes writeable arrays no
    one else holds (a frozen snapshot's are copied first). conv_w is (conv_dim, K) F-ordered,
    as the model keeps it. One kernel launch for what was ~20 numpy and numba calls a layer."""
    f32 = np.float32
    H, dk, dv = S.shape
    out = np.empty(H * dv, dtype=f32)
    _decode_token(np.ascontiguousarray(qkv, f32).reshape(-1), np.ascontiguousarray(z, f32).reshape(-1),
                  np.ascontiguousarray(beta, f32).reshape(-1), np.ascontiguousarray(alpha, f32).reshape(-1),
                  tail, np.ascontiguousarray(conv_w.T, f32), np.ascontiguousarray(dt_bias, f32),
                  np.ascontiguousarray(a, f32), np.ascontiguousarray(norm_w, f32), f32(eps), n_k_heads,
                  f32(1.0 / np.sqrt(dk)), S, out)
    return out


def gated_delta_recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                          S: np.ndarray, capture: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray, list]:
    """T tokens through the recurrence in one kernel call (short prefills: below ~CHUNK tokens
    the chunked form pays for a padded chunk). S is not modified; returns (o (T, H, d_v), the
    new state, the states after each of the `capture` token counts)."""
    f32 = np.float32
    T = q.shape[0]
    H, dk, dv = S.shape
    S = np.array(S, dtype=f32, copy=True)
    o = np.empty((T, H, dv), dtype=f32)
    cap_at = np.asarray(sorted(capture), dtype=np.int64)
    caps = np.empty((cap_at.size, H, dk, dv), dtype=f32)
    _delta_steps(np.ascontiguousarray(q, f32), np.ascontiguousarray(k, f32), np.ascontiguousarray(v, f32),
                 np.ascontiguousarray(g, f32), np.ascontiguousarray(beta, f32), S, o, cap_at, caps)
    order = {r: i for i, r in enumerate(cap_at.tolist())}
    return o, S, [caps[order[r]] for r in capture]


@njit(parallel=True, fastmath=True, cache=True)
def _chunk_terms(q, k, v, g, beta, C):
    """Per (head, chunk), everything that does not depend on the carried state, read straight
    from the (T, H, d) projections (no padded head-major copies; positions past T count as
    k = q = v = 0, g = beta = 0, which change nothing). With G the cumulative log-decay within the
    chunk and M = I + strictly-lower(diag(β)·(KKᵀ ∘ e^{G_t−G_s})), M⁻¹ applied by forward
    substitution:
      WQ[:C]  = W = M⁻¹·diag(β·e^G)K      WQ[C:] = diag(e^G)Q   (one product with S per chunk)
      Ub      = M⁻¹·diag(β)V               QK = QKᵀ ∘ e^{G_t−G_s} (inclusive lower triangle)
      KdT     = (diag(e^{G_last−G})K)ᵀ     g_last = e^{G_last}
    Shapes: WQ (H, N, 2C, dk), Ub (H, N, C, dv), QK (H, N, C, C), KdT (H, N, dk, C), g_last (H, N),
    and G itself (H, N, C) for the checkpoints inside a chunk."""
    T, H, dk = k.shape
    dv = v.shape[2]
    N = (T + C - 1) // C
    WQ = np.empty((H, N, 2 * C, dk), dtype=np.float32)
    Ub = np.empty((H, N, C, dv), dtype=np.float32)
    QK = np.zeros((H, N, C, C), dtype=np.float32)
    KdT = np.empty((H, N, dk, C), dtype=np.float32)
    g_last = np.empty((H, N), dtype=np.float32)
    Gc = np.empty((H, N, C), dtype=np.float32)
    for hn in prange(H * N):
        h = hn // N
        n = hn % N
        t0 = n * C
        m = min(C, T - t0)  # real tokens in this chunk
        G = np.zeros(C, dtype=np.float32)
        acc = np.float32(0.0)
        for t in range(m):
            acc += g[t0 + t, h]
            G[t] = acc
        for t in range(m, C):
            G[t] = acc
        Gc[h, n] = G
        kb = np.zeros((C, dk), dtype=np.float32)
        kb[:m] = k[t0:t0 + m, h]
        kbT = np.ascontiguousarray(kb.T)  # rows of KKᵀ and QKᵀ as vector loops over s
        rk = np.empty(C, dtype=np.float32)
        rq = np.empty(C, dtype=np.float32)
        A = np.zeros((C, C), dtype=np.float32)
        qk = QK[h, n]
        for t in range(m):
            rk[:t + 1] = 0.0
            rq[:t + 1] = 0.0
            for i in range(dk):
                kti = kb[t, i]
                qti = q[t0 + t, h, i]
                for s in range(t + 1):
                    rk[s] += kti * kbT[i, s]
                    rq[s] += qti * kbT[i, s]
            bt = beta[t0 + t, h]
            for s in range(t + 1):
                d = G[t] - G[s]
                # below e^-80 a term is zero at f32 precision; flushing it keeps denormals out
                decay = fast_exp(d) if d > -80.0 else np.float32(0.0)
                qk[t, s] = rq[s] * decay
                A[t, s] = bt * rk[s] * decay
            A[t, t] = 0.0
        u = Ub[h, n]
        w = WQ[h, n]
        u[m:] = 0.0
        w[m:C] = 0.0
        w[C + m:] = 0.0
        for t in range(m):
            bt = beta[t0 + t, h]
            eg = fast_exp(G[t])
            be = bt * eg
            for i in range(dv):
                u[t, i] = bt * v[t0 + t, h, i]
            for i in range(dk):
                w[t, i] = be * kb[t, i]
                w[C + t, i] = eg * q[t0 + t, h, i]
            for s in range(t):
                a = A[t, s]
                if a != 0.0:
                    for i in range(dv):
                        u[t, i] -= a * u[s, i]
                    for i in range(dk):
                        w[t, i] -= a * w[s, i]
        gl = G[C - 1]
        g_last[h, n] = fast_exp(gl)
        e = np.empty(C, dtype=np.float32)
        for t in range(C):
            e[t] = fast_exp(gl - G[t])
        kd = KdT[h, n]
        for i in range(dk):
            for t in range(C):
                kd[i, t] = kbT[i, t] * e[t]
    return WQ, Ub, QK, KdT, g_last, Gc


def gated_delta_chunked(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                        S: np.ndarray, chunk: int = CHUNK,
                        capture: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray, list]:
    """T tokens in chunks of `chunk`: the state-independent terms of every chunk at once
    (`_chunk_terms`, numba, parallel over head × chunk), then one short loop over chunks carrying
    the state with batched matrix products (BLAS), the heads split over the threads.

    With U = U_b − W·S₀ per chunk: O = diag(e^G)·Q·S₀ + (QKᵀ∘decay)·U and
    S₁ = e^{G_last}·S₀ + (K∘e^{G_last−G})ᵀ·U. The state after j tokens of a chunk is the same
    formula over its first j rows, so the states after each of the `capture` token counts
    (returned third, in that order) come out of the one pass: a checkpoint needs no split."""
    f32 = np.float32
    T, H, dk = q.shape
    dv = v.shape[2]
    C = chunk
    N = (T + C - 1) // C
    k = np.ascontiguousarray(k, f32)
    WQ, Ub, QK, KdT, g_last, G = _chunk_terms(np.ascontiguousarray(q, f32), k,
                                           np.ascontiguousarray(v, f32), np.ascontiguousarray(g, f32),
                                           np.ascontiguousarray(beta, f32), C)
    o = np.empty((N * C, H, dv), dtype=f32)  # token-major, as the caller wants it; padded rows dropped
    S_out = np.empty((H, dk, dv), dtype=f32)
    cap_S = np.empty((len(capture), H, dk, dv), dtype=f32)

    def heads(h0: int, h1: int) -> None:
        # OpenBLAS's SVE kernels (neoverse-v1/v2 under make test-arm64) raise floating-point
        # flags numpy reports as "divide by zero / overflow / invalid value in matmul" on these
        # products while the results are finite and right (they match the recurrence and llama.cpp's
        # fixtures on every target): a Graviton3 function would print them into CloudWatch
        with np.errstate(all="ignore"):
            _heads(h0, h1)

    def _heads(h0: int, h1: int) -> None:
        S_h = np.array(S[h0:h1], dtype=f32, copy=True)
        X = np.empty((h1 - h0, 2 * C, dv), dtype=f32)
        Y = np.empty((h1 - h0, dk, dv), dtype=f32)
        Z = np.empty((h1 - h0, C, dv), dtype=f32)
        for n in range(N):
            np.matmul(WQ[h0:h1, n], S_h, out=X)  # [W; Q∘e^G]·S in one product
            U = np.subtract(Ub[h0:h1, n], X[:, :C])
            np.matmul(QK[h0:h1, n], U, out=Z)
            np.add(X[:, C:], Z, out=o[n * C:(n + 1) * C, h0:h1].transpose(1, 0, 2))
            for c, r in enumerate(capture):
                j = r - n * C  # tokens of this chunk before the capture point
                if 0 < j < C:  # the update over the chunk's first j rows, decayed to row j
                    kj = np.swapaxes(k[n * C:n * C + j, h0:h1], 0, 1)  # (heads, j, dk)
                    kj = kj * np.exp(G[h0:h1, n, j - 1, None] - G[h0:h1, n, :j])[..., None]
                    cap_S[c, h0:h1] = (np.exp(G[h0:h1, n, j - 1])[:, None, None] * S_h
                                       + np.swapaxes(kj, -1, -2) @ U[:, :j])
            np.matmul(KdT[h0:h1, n], U, out=Y)
            S_h *= g_last[h0:h1, n, None, None]
            S_h += Y
            for c, r in enumerate(capture):
                if r == (n + 1) * C:
                    cap_S[c, h0:h1] = S_h
        S_out[h0:h1] = S_h

    split_over_threads(heads, H)
    return o[:T], S_out, [cap_S[c] for c in range(len(capture))]


def gated_delta_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                        S: np.ndarray, capture: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray, list]:
    """T > 1 tokens: the recurrence kernel up to RECURRENT_MAX tokens, else the chunked form.
    Returns (o, new S, the states after each of the `capture` token counts)."""
    if q.shape[0] <= RECURRENT_MAX:
        return gated_delta_recurrent(q, k, v, g, beta, S, capture)
    return gated_delta_chunked(q, k, v, g, beta, S, capture=capture)
