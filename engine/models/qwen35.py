"""Qwen3.5 (GGUF architecture `qwen35`): hybrid Gated DeltaNet + gated attention.

Reads top to bottom as llama.cpp's src/models/qwen35.cpp: per layer
    x += Mixer(RMSNorm(x));  x += FFN(RMSNorm_post(x))
with every `full_attention_interval`-th layer full attention and the others Gated DeltaNet.
A forward over T new tokens is matrix products over the whole chunk; T == 1 (decode) runs the
same functions. Every intermediate has a name; pass `hook(name, layer, array)` to record them.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from engine import attention, deltanet
from engine.conventions import ChatConventions
from engine.errors import ModelLoadError
from engine.gguf_file import GGUFFile
from engine.ops import rms_norm, sigmoid, silu, silu_mul, softplus
from engine.state import AttentionState, DeltaNetState, LayerState, State
from engine.weights import Linear, ScratchBuffer

from .common import (CapturingForward, Tensors, attend, check_forward, each_row, empty_attention, n_vocab,
                     output_logits)

ARCH = "qwen35"
Hook = Callable[[str, int, np.ndarray], None]

# Reasoning in <think>…</think>; tool calls in the XML syntax its chat template teaches.
CONVENTIONS = ChatConventions("qwen3.5", "xml")


def conventions(f: GGUFFile) -> ChatConventions:
    """Qwen3.5's chat conventions (the same for every file of the family)."""
    return CONVENTIONS


@dataclass(frozen=True)
class Qwen35Config:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    n_rot: int
    rope_sections: tuple[int, ...]
    n_ctx_train: int
    conv_kernel: int
    d_state: int  # d_k = d_v per DeltaNet head
    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank
    d_inner: int  # n_v_heads * d_v
    full_attention_interval: int

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.d_state

    @property
    def value_dim(self) -> int:
        return self.d_inner

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval != 0

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Qwen35Config:
        p = f"{ARCH}."
        n_embd = int(f.require(p + "embedding_length"))
        n_head = int(f.require(p + "attention.head_count"))
        head_dim = int(f.get(p + "attention.key_length", n_embd // n_head))
        n_head_kv = f.require(p + "attention.head_count_kv")
        if isinstance(n_head_kv, list):  # per-layer arrays are allowed by GGUF; take the attention value
            n_head_kv = max(n_head_kv)
        sections = f.get(p + "rope.dimension_sections", [])
        cfg = cls(
            n_vocab=n_vocab(f),
            n_embd=n_embd,
            n_layer=int(f.require(p + "block_count")),
            n_ff=int(f.require(p + "feed_forward_length")),
            n_head=n_head,
            n_head_kv=int(n_head_kv),
            head_dim=head_dim,
            rms_eps=float(f.require(p + "attention.layer_norm_rms_epsilon")),
            rope_base=float(f.get(p + "rope.freq_base", 10000.0)),
            n_rot=int(f.get(p + "rope.dimension_count", head_dim)),
            rope_sections=tuple(int(s) for s in (sections or [])),
            n_ctx_train=int(f.get(p + "context_length", 4096)),
            conv_kernel=int(f.require(p + "ssm.conv_kernel")),
            d_state=int(f.require(p + "ssm.state_size")),
            n_k_heads=int(f.require(p + "ssm.group_count")),
            n_v_heads=int(f.require(p + "ssm.time_step_rank")),
            d_inner=int(f.require(p + "ssm.inner_size")),
            full_attention_interval=int(f.get(p + "full_attention_interval", 4)),
        )
        if cfg.d_inner != cfg.n_v_heads * cfg.d_state:
            raise ModelLoadError(
                f"{f.path}: ssm.inner_size {cfg.d_inner} != time_step_rank {cfg.n_v_heads} × state_size {cfg.d_state}"
            )
        if cfg.n_v_heads % cfg.n_k_heads or cfg.n_head % cfg.n_head_kv:
            raise ModelLoadError(f"{f.path}: head counts do not divide (v {cfg.n_v_heads} / k {cfg.n_k_heads}, "
                                 f"q {cfg.n_head} / kv {cfg.n_head_kv})")
        return cfg


@dataclass
class DeltaNetWeights:
    qkv: Linear
    gate: Linear  # z
    beta: Linear
    alpha: Linear
    conv: np.ndarray  # (conv_dim, kernel), F-ordered (see Qwen35.__init__)
    dt_bias: np.ndarray  # (n_v_heads,)
    a: np.ndarray  # (n_v_heads,) = -exp(A_log)
    norm: np.ndarray  # (d_v,)
    out: Linear


@dataclass
class AttentionWeights:
    q: Linear  # query and gate interleaved per head
    k: Linear
    v: Linear
    o: Linear
    q_norm: np.ndarray
    k_norm: np.ndarray


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    post_norm: np.ndarray
    mixer: DeltaNetWeights | AttentionWeights
    ffn_gate: Linear
    ffn_up: Linear
    ffn_down: Linear


def _all_rows(lin: Linear, h: np.ndarray) -> np.ndarray:
    """`lin` over every row of `h` in one product (decode_batch's default)."""
    return lin(h)


class Qwen35(CapturingForward):
    """The model: weights (views into the mmap) and the forward over a State."""

    def __init__(self, f: GGUFFile) -> None:
        if f.architecture != ARCH:
            raise ModelLoadError(f"{f.path}: architecture {f.architecture!r} is not supported; supported: {ARCH}")
        self.file = f
        self.config = cfg = Qwen35Config.from_gguf(f)
        self.scratch = ScratchBuffer()
        tensors = Tensors(f, self.scratch)
        lin, vec = tensors.linear, tensors.vector

        E = cfg.n_embd
        self.token_embd = lin("token_embd.weight", cfg.n_vocab, E)
        self.output_norm = vec("output_norm.weight", (E,))
        self.output = lin("output.weight", cfg.n_vocab, E) if f.has_tensor("output.weight") else self.token_embd
        self.tied_output = self.output is self.token_embd
        self.layers: list[LayerWeights] = []
        for il in range(cfg.n_layer):
            b = f"blk.{il}."
            mixer: DeltaNetWeights | AttentionWeights
            if cfg.is_recurrent(il):
                mixer = DeltaNetWeights(
                    qkv=lin(b + "attn_qkv.weight", cfg.conv_dim, E),
                    gate=lin(b + "attn_gate.weight", cfg.value_dim, E),
                    beta=lin(b + "ssm_beta.weight", cfg.n_v_heads, E),
                    alpha=lin(b + "ssm_alpha.weight", cfg.n_v_heads, E),
                    # kept as the transpose of a C-contiguous (kernel, conv_dim) array: the conv
                    # kernel reads taps by row, and a per-call transposed copy cost every layer
                    # of every decode step
                    conv=np.ascontiguousarray(vec(b + "ssm_conv1d.weight", (cfg.conv_dim, cfg.conv_kernel)).T).T,
                    dt_bias=vec(b + "ssm_dt.bias", (cfg.n_v_heads,)),
                    a=vec(b + "ssm_a", (cfg.n_v_heads,)),
                    norm=vec(b + "ssm_norm.weight", (cfg.d_state,)),
                    out=lin(b + "ssm_out.weight", E, cfg.value_dim),
                )
            else:
                hd = cfg.head_dim
                mixer = AttentionWeights(
                    q=lin(b + "attn_q.weight", 2 * cfg.n_head * hd, E),
                    k=lin(b + "attn_k.weight", cfg.n_head_kv * hd, E),
                    v=lin(b + "attn_v.weight", cfg.n_head_kv * hd, E),
                    o=lin(b + "attn_output.weight", E, cfg.n_head * hd),
                    q_norm=vec(b + "attn_q_norm.weight", (hd,)),
                    k_norm=vec(b + "attn_k_norm.weight", (hd,)),
                )
            self.layers.append(LayerWeights(
                attn_norm=vec(b + "attn_norm.weight", (E,)),
                post_norm=vec(b + "post_attention_norm.weight", (E,)),
                mixer=mixer,
                ffn_gate=lin(b + "ffn_gate.weight", cfg.n_ff, E),
                ffn_up=lin(b + "ffn_up.weight", cfg.n_ff, E),
                ffn_down=lin(b + "ffn_down.weight", E, cfg.n_ff),
            ))

    # ---- state ---------------------------------------------------------------------------

    def new_state(self) -> State:
        cfg = self.config
        layers: list[LayerState] = []
        for il in range(cfg.n_layer):
            if cfg.is_recurrent(il):
                layers.append(DeltaNetState(
                    conv=np.zeros((cfg.conv_kernel - 1, cfg.conv_dim), dtype=np.float32),
                    S=np.zeros((cfg.n_v_heads, cfg.d_state, cfg.d_state), dtype=np.float32),
                ))
            else:
                layers.append(empty_attention(cfg.n_head_kv, cfg.head_dim))
        return State(0, layers)

    # ---- forward -------------------------------------------------------------------------

    def forward_capturing(self, tokens: np.ndarray, state: State, capture: Sequence[int], *,
                          logits: str = "last", hook: Hook | None = None
                          ) -> tuple[np.ndarray | None, dict[int, State]]:
        """`forward`, also returning independent copies of the state as it was after each
        position in `capture` (absolute token counts in (state.n_tokens, state.n_tokens + T]):
        prefix checkpoints from one batched pass, without splitting it."""
        cfg = self.config
        start = state.n_tokens
        tokens, capture = check_forward(tokens, start, capture, cfg.n_vocab)
        rel = [p - start for p in capture]
        captured: dict[int, list[DeltaNetState]] = {}
        x = self.token_embd.rows(tokens)
        rope = None  # cos/sin of this pass's positions, made once for all attention layers
        if hook:
            hook("model.input_embed", -1, x)
        for il, lw in enumerate(self.layers):
            h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
            if hook:
                hook("attn_norm", il, h)
            if isinstance(lw.mixer, DeltaNetWeights):
                h, captured[il] = self._deltanet(lw.mixer, h, cast(DeltaNetState, state.layers[il]), il, hook, rel)
            else:
                if rope is None:  # ~120 us a layer per decode step when each layer made its own
                    rope = attention.rope_angles(np.arange(start, start + tokens.size), cfg.n_rot, cfg.rope_base,
                                                 list(cfg.rope_sections))
                h = self._attention(lw.mixer, h, cast(AttentionState, state.layers[il]), start, il, hook, rope)
            x = x + h
            if hook:
                hook("attn_residual", il, x)
            h = rms_norm(x, lw.post_norm, cfg.rms_eps)
            h = lw.ffn_down(silu_mul(lw.ffn_gate(h), lw.ffn_up(h)))
            if hook:
                hook("ffn_out", il, h)
            x = x + h
            if hook:
                hook("l_out", il, x)
        self.scratch.forget()
        state.n_tokens = start + tokens.size
        states = {p: State(p, [captured[il][c] if il in captured else layer.copy(p)
                               for il, layer in enumerate(state.layers)])
                  for c, p in enumerate(capture)}
        return output_logits(x, self.output_norm, self.output, cfg.rms_eps, logits, hook), states

    def decode_batch(self, tokens: Sequence[int], states: Sequence[State], *, exact: bool = False) -> np.ndarray:
        """One token for each of B sequences through every layer together (see
        CapturingForward.decode_batch): the matrices multiply the B rows at once (the int8 tiles:
        each weight block unpacked once for every row), the DeltaNet step and attention run on
        each sequence's own state. `exact`: the rows one after another instead (`each_row`: bit
        for bit each sequence's own decode, ~2.5x slower at 16 rows)."""
        mm = each_row if exact else _all_rows
        cfg = self.config
        B = len(states)
        if B != len(tokens):
            raise ValueError(f"{len(tokens)} tokens for {B} states")
        ids = np.asarray(tokens, dtype=np.int64)
        check_forward(ids, 0, (), cfg.n_vocab)
        starts = [st.n_tokens for st in states]
        x = self.token_embd.rows(ids)
        rope = None
        for il, lw in enumerate(self.layers):
            h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
            if isinstance(lw.mixer, DeltaNetWeights):
                h = self._deltanet_batch(lw.mixer, h, [cast(DeltaNetState, st.layers[il]) for st in states], mm)
            else:
                if rope is None:
                    rope = attention.rope_angles(np.asarray(starts), cfg.n_rot, cfg.rope_base, list(cfg.rope_sections))
                h = self._attention_batch(lw.mixer, h, [cast(AttentionState, st.layers[il]) for st in states],
                                          starts, rope, mm)
            x = x + h
            h = rms_norm(x, lw.post_norm, cfg.rms_eps)
            h = mm(lw.ffn_down, silu_mul(mm(lw.ffn_gate, h), mm(lw.ffn_up, h)))
            x = x + h
        self.scratch.forget()
        for st in states:
            st.n_tokens += 1
        return mm(self.output, rms_norm(x, self.output_norm, cfg.rms_eps))

    def _deltanet_batch(self, w: DeltaNetWeights, x: np.ndarray, sts: list[DeltaNetState],
                        mm: Callable[[Linear, np.ndarray], np.ndarray]) -> np.ndarray:
        cfg = self.config
        qkv, z, beta, alpha = mm(w.qkv, x), mm(w.gate, x), mm(w.beta, x), mm(w.alpha, x)
        o = np.empty((len(sts), cfg.value_dim), dtype=np.float32)
        for b, st in enumerate(sts):
            if not st.S.flags.writeable:  # shared with a stored snapshot (State.fork)
                st.S = st.S.copy()
            if not (st.conv.flags.writeable and st.conv.flags.c_contiguous):
                st.conv = np.ascontiguousarray(st.conv).copy()
            o[b] = deltanet.decode_token(qkv[b], z[b], beta[b], alpha[b], st.conv, w.conv, w.dt_bias, w.a, w.norm,
                                         cfg.rms_eps, cfg.n_k_heads, st.S)
        return mm(w.out, o)

    def _attention_batch(self, w: AttentionWeights, x: np.ndarray, sts: list[AttentionState], starts: list[int],
                         rope: tuple[np.ndarray, np.ndarray], mm: Callable[[Linear, np.ndarray], np.ndarray]
                         ) -> np.ndarray:
        cfg = self.config
        B, hd = x.shape[0], cfg.head_dim
        qg = mm(w.q, x).reshape(B, cfg.n_head, 2 * hd)
        q = rms_norm(qg[..., :hd], w.q_norm, cfg.rms_eps)
        gate = qg[..., hd:].reshape(B, cfg.n_head * hd)
        k = rms_norm(mm(w.k, x).reshape(B, cfg.n_head_kv, hd), w.k_norm, cfg.rms_eps)
        v = mm(w.v, x).reshape(B, cfg.n_head_kv, hd)
        cos, sin = rope
        q = attention.apply_rope(q, cos, sin)
        k = attention.apply_rope(k, cos, sin)
        a = np.concatenate([attend(st, q[b:b + 1], k[b:b + 1], v[b:b + 1], starts[b]) for b, st in enumerate(sts)])
        return mm(w.o, a.reshape(B, cfg.n_head * hd) * sigmoid(gate))

    def _deltanet(self, w: DeltaNetWeights, x: np.ndarray, st: DeltaNetState, il: int,
                  hook: Hook | None, capture: Sequence[int] = ()) -> tuple[np.ndarray, list[DeltaNetState]]:
        cfg = self.config
        T = x.shape[0]
        if T == 1 and not capture and hook is None:
            return self._deltanet_token(w, x, st), []
        qkv = w.qkv(x)
        z = w.gate(x)
        beta = sigmoid(w.beta(x))
        g = softplus(w.alpha(x) + w.dt_bias) * w.a  # log-decay per value head, ≤ 0
        conv, st.conv, conv_at = deltanet.causal_conv1d_silu(qkv, st.conv, w.conv, capture)
        if hook:
            hook("conv_output_silu", il, conv)
        kd, hk, dk = cfg.key_dim, cfg.n_k_heads, cfg.d_state
        q = deltanet.l2_normalize(conv, cfg.rms_eps, hk, dk, col0=0, scale=1.0 / math.sqrt(dk))
        k = deltanet.l2_normalize(conv, cfg.rms_eps, hk, dk, col0=kd)
        v = conv[:, 2 * kd:].reshape(T, cfg.n_v_heads, cfg.d_state)
        if cfg.n_v_heads != cfg.n_k_heads:  # tiled: value head h reads key head h % n_k_heads
            reps = cfg.n_v_heads // cfg.n_k_heads
            q = np.tile(q, (1, reps, 1))
            k = np.tile(k, (1, reps, 1))
        if T == 1:
            if not st.S.flags.writeable:  # shared with a stored snapshot (State.fork)
                st.S = st.S.copy()
            o, st.S = deltanet.gated_delta_step(q, k, v, g, beta, st.S)
            S_at = [st.S.copy() for _ in capture]
        else:
            o, st.S, S_at = deltanet.gated_delta_prefill(q, k, v, g, beta, st.S, capture)
        if hook:
            hook("delta_out", il, o)
        o = rms_norm(o, w.norm, cfg.rms_eps) * silu(z.reshape(T, cfg.n_v_heads, cfg.d_state))
        out = w.out(o.reshape(T, cfg.value_dim))
        if hook:
            hook("linear_attn_out", il, out)
        return out, [DeltaNetState(c, S) for c, S in zip(conv_at, S_at)]

    def _deltanet_token(self, w: DeltaNetWeights, x: np.ndarray, st: DeltaNetState) -> np.ndarray:
        """A decode step's layer (no checkpoints, no hook): the projections, one kernel for the
        rest up to the output matrix (deltanet.decode_token), the output matrix. The state
        advances in place, on arrays of its own (a frozen snapshot's are copied first)."""
        cfg = self.config
        if not st.S.flags.writeable:  # shared with a stored snapshot (State.fork)
            st.S = st.S.copy()
        if not (st.conv.flags.writeable and st.conv.flags.c_contiguous):
            st.conv = np.ascontiguousarray(st.conv).copy()
        o = deltanet.decode_token(w.qkv(x), w.gate(x), w.beta(x), w.alpha(x), st.conv, w.conv, w.dt_bias, w.a,
                                  w.norm, cfg.rms_eps, cfg.n_k_heads, st.S)
        return w.out(o.reshape(1, cfg.value_dim))

    def _attention(self, w: AttentionWeights, x: np.ndarray, st: AttentionState, start: int, il: int,
                   hook: Hook | None, rope: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        cfg = self.config
        T, hd = x.shape[0], cfg.head_dim
        qg = w.q(x).reshape(T, cfg.n_head, 2 * hd)
        q = rms_norm(qg[..., :hd], w.q_norm, cfg.rms_eps)
        gate = qg[..., hd:].reshape(T, cfg.n_head * hd)
        k = rms_norm(w.k(x).reshape(T, cfg.n_head_kv, hd), w.k_norm, cfg.rms_eps)
        v = w.v(x).reshape(T, cfg.n_head_kv, hd)
        cos, sin = rope
        q = attention.apply_rope(q, cos, sin)
        k = attention.apply_rope(k, cos, sin)
        a = attend(st, q, k, v, start)
        if hook:
            hook("attn_pregate", il, a)
        out = w.o(a.reshape(T, cfg.n_head * hd) * sigmoid(gate))
        if hook:
            hook("attn_output", il, out)
        return out
