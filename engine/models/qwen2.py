"""Qwen2 / Qwen2.5 and Qwen3 dense (GGUF architectures `qwen2`, `qwen3`): every layer attention.

Reads top to bottom as llama.cpp's src/models/qwen2.cpp and qwen3.cpp: per layer
    x += Attention(RMSNorm(x));  x += FFN(RMSNorm_ffn(x))
with grouped-query attention, NEOX rotary embedding over the whole head, and a SwiGLU FFN.
The two differ in one place each: Qwen2 adds a bias to Q, K and V; Qwen3 has none and
RMS-normalises each query and key head before the rotation (`attn_q_norm`, `attn_k_norm`).
The output head is `output.weight` or, when the file has none, the embedding (tied).
A forward over T new tokens is matrix products over the whole chunk (batched prefill), and the
state is one `AttentionState` per layer: sessions, extend, checkpoints and snapshots keep and
slice it like the hybrid model's attention layers. Named intermediates as llama.cpp's
callbacks name them; pass `hook(name, layer, array)` to record them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from engine import attention
from engine.conventions import ChatConventions
from engine.errors import ModelLoadError
from engine.gguf_file import GGUFFile
from engine.ops import rms_norm, silu_mul
from engine.state import AttentionState, LayerState, State
from engine.weights import Linear, ScratchBuffer

from .common import CapturingForward, Tensors, attend, check_forward, empty_attention, n_vocab, output_logits

QWEN2, QWEN3 = "qwen2", "qwen3"
ARCHS = (QWEN2, QWEN3)
Hook = Callable[[str, int, np.ndarray], None]

# Hermes tool calls ({"name", "arguments"} JSON in <tool_call>), as both families' templates teach;
# Qwen3 reasons in <think>…</think>, Qwen2.5 does not (the engine drops reasoning for a template
# that never closes the block: Engine.__init__).
HERMES = ChatConventions("hermes", "json")


def conventions(f: GGUFFile) -> ChatConventions:
    """Qwen3's conventions, or Qwen2's (no reasoning block)."""
    return HERMES if f.architecture == QWEN3 else HERMES.without_reasoning()


@dataclass(frozen=True)
class Qwen2Config:
    arch: str
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
    n_ctx_train: int

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Qwen2Config:
        arch = f.architecture
        if arch not in ARCHS:
            raise ModelLoadError(f"{f.path}: architecture {arch!r} is not one of {', '.join(ARCHS)}")
        p = f"{arch}."
        n_embd = int(f.require(p + "embedding_length"))
        n_head = int(f.require(p + "attention.head_count"))
        head_dim = int(f.get(p + "attention.key_length", n_embd // n_head))
        cfg = cls(
            arch=arch,
            n_vocab=n_vocab(f),
            n_embd=n_embd,
            n_layer=int(f.require(p + "block_count")),
            n_ff=int(f.require(p + "feed_forward_length")),
            n_head=n_head,
            n_head_kv=int(f.get(p + "attention.head_count_kv", n_head)),
            head_dim=head_dim,
            rms_eps=float(f.require(p + "attention.layer_norm_rms_epsilon")),
            rope_base=float(f.get(p + "rope.freq_base", 10000.0)),
            n_rot=int(f.get(p + "rope.dimension_count", head_dim)),
            n_ctx_train=int(f.get(p + "context_length", 4096)),
        )
        if cfg.n_head_kv < 1 or cfg.n_head % cfg.n_head_kv:
            raise ModelLoadError(f"{f.path}: {cfg.n_head} query heads do not divide into {cfg.n_head_kv} KV heads")
        if int(f.get(p + "attention.value_length", head_dim)) != head_dim:
            raise ModelLoadError(f"{f.path}: key and value head sizes differ; not a {arch} model")
        if cfg.n_rot > head_dim or cfg.n_rot % 2:
            raise ModelLoadError(f"{f.path}: rope.dimension_count {cfg.n_rot} does not fit heads of {head_dim}")
        return cfg


@dataclass
class AttentionWeights:
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    q_bias: np.ndarray | None  # qwen2
    k_bias: np.ndarray | None
    v_bias: np.ndarray | None
    q_norm: np.ndarray | None  # qwen3
    k_norm: np.ndarray | None


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    attn: AttentionWeights
    ffn_norm: np.ndarray
    ffn_gate: Linear
    ffn_up: Linear
    ffn_down: Linear


class Qwen2(CapturingForward):
    """The model: weights (views into the mmap) and the forward over a State."""

    def __init__(self, f: GGUFFile) -> None:
        self.file = f
        self.config = cfg = Qwen2Config.from_gguf(f)
        self.scratch = ScratchBuffer()
        t = Tensors(f, self.scratch)
        E, hd = cfg.n_embd, cfg.head_dim
        q_dim, kv_dim = cfg.n_head * hd, cfg.n_head_kv * hd
        self.token_embd = t.linear("token_embd.weight", cfg.n_vocab, E)
        self.output_norm = t.vector("output_norm.weight", (E,))
        self.output = t.linear("output.weight", cfg.n_vocab, E) if t.has("output.weight") else self.token_embd
        self.tied_output = self.output is self.token_embd
        biased = cfg.arch == QWEN2
        self.layers: list[LayerWeights] = []

        def bias(name: str, n: int) -> np.ndarray | None:
            # llama.cpp requires them for qwen2 and reads none for qwen3
            return t.vector(name, (n,)) if biased else None

        def norm(name: str) -> np.ndarray | None:
            return None if biased else t.vector(name, (hd,))

        for il in range(cfg.n_layer):
            b = f"blk.{il}."
            self.layers.append(LayerWeights(
                attn_norm=t.vector(b + "attn_norm.weight", (E,)),
                attn=AttentionWeights(
                    q=t.linear(b + "attn_q.weight", q_dim, E),
                    k=t.linear(b + "attn_k.weight", kv_dim, E),
                    v=t.linear(b + "attn_v.weight", kv_dim, E),
                    o=t.linear(b + "attn_output.weight", E, q_dim),
                    q_bias=bias(b + "attn_q.bias", q_dim),
                    k_bias=bias(b + "attn_k.bias", kv_dim),
                    v_bias=bias(b + "attn_v.bias", kv_dim),
                    q_norm=norm(b + "attn_q_norm.weight"),
                    k_norm=norm(b + "attn_k_norm.weight"),
                ),
                ffn_norm=t.vector(b + "ffn_norm.weight", (E,)),
                ffn_gate=t.linear(b + "ffn_gate.weight", cfg.n_ff, E),
                ffn_up=t.linear(b + "ffn_up.weight", cfg.n_ff, E),
                ffn_down=t.linear(b + "ffn_down.weight", E, cfg.n_ff),
            ))

    # ---- state ---------------------------------------------------------------------------

    def new_state(self) -> State:
        cfg = self.config
        layers: list[LayerState] = []
        for _ in range(cfg.n_layer):
            layers.append(empty_attention(cfg.n_head_kv, cfg.head_dim))
        return State(0, layers)

    # ---- forward -------------------------------------------------------------------------

    def forward_capturing(self, tokens: np.ndarray, state: State, capture: Sequence[int], *,
                          logits: str = "last", hook: Hook | None = None
                          ) -> tuple[np.ndarray | None, dict[int, State]]:
        """`forward`, also returning independent copies of the state as it was after each
        position in `capture` (absolute token counts in (state.n_tokens, state.n_tokens + T]):
        the K/V of the first p positions, sliced from the one batched pass."""
        cfg = self.config
        start = state.n_tokens
        tokens, capture = check_forward(tokens, start, capture, cfg.n_vocab)
        x = self.token_embd.rows(tokens)
        if hook:
            hook("model.input_embed", -1, x)
        rope = attention.rope_angles(np.arange(start, start + tokens.size), cfg.n_rot, cfg.rope_base, [])
        for il, lw in enumerate(self.layers):
            h = rms_norm(x, lw.attn_norm, cfg.rms_eps)
            if hook:
                hook("attn_norm", il, h)
            h = self._attention(lw.attn, h, cast(AttentionState, state.layers[il]), start, il, hook, rope)
            x = x + h
            if hook:
                hook("ffn_inp", il, x)
            h = rms_norm(x, lw.ffn_norm, cfg.rms_eps)
            if hook:
                hook("ffn_norm", il, h)
            h = lw.ffn_down(silu_mul(lw.ffn_gate(h), lw.ffn_up(h)))
            if hook:
                hook("ffn_out", il, h)
            x = x + h
            if hook:
                hook("l_out", il, x)
        self.scratch.forget()
        state.n_tokens = start + tokens.size
        states = {p: State(p, [layer.copy(p) for layer in state.layers]) for p in capture}
        return output_logits(x, self.output_norm, self.output, cfg.rms_eps, logits, hook), states

    def _attention(self, w: AttentionWeights, x: np.ndarray, st: AttentionState, start: int, il: int,
                   hook: Hook | None, rope: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        cfg = self.config
        T, hd = x.shape[0], cfg.head_dim
        q, k, v = w.q(x), w.k(x), w.v(x)
        if w.q_bias is not None and w.k_bias is not None and w.v_bias is not None:
            q, k, v = q + w.q_bias, k + w.k_bias, v + w.v_bias
        q = q.reshape(T, cfg.n_head, hd)
        k = k.reshape(T, cfg.n_head_kv, hd)
        v = v.reshape(T, cfg.n_head_kv, hd)
        if w.q_norm is not None and w.k_norm is not None:
            q = rms_norm(q, w.q_norm, cfg.rms_eps)
            k = rms_norm(k, w.k_norm, cfg.rms_eps)
        if hook:
            hook("Qcur", il, q)
            hook("Kcur", il, k)
            hook("Vcur", il, v)
        cos, sin = rope
        q = attention.apply_rope(q, cos, sin)
        k = attention.apply_rope(k, cos, sin)
        a = attend(st, q, k, v, start)
        if hook:
            hook("kqv_out", il, a)
        out = w.o(a.reshape(T, cfg.n_head * hd))
        if hook:
            hook("attn_out", il, out)
        return out
