"""What every model file shares: reading its tensors with their shapes checked, an empty
attention layer's state, the checks a forward makes of its tokens and capture positions, the
attention cache's append + causal attention, and the head over the final norm."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from engine import attention
from engine.errors import ModelLoadError
from engine.gguf_file import GGUFFile
from engine.ops import rms_norm
from engine.state import KV_DTYPE, AttentionState, State
from engine.weights import Linear, ScratchBuffer, vector


class Tensors:
    """The file's tensors as the model needs them: matrices as `Linear` (quantized kernels),
    vectors as float32 arrays; a shape other than the expected one is a ModelLoadError naming
    the tensor."""

    def __init__(self, f: GGUFFile, scratch: ScratchBuffer) -> None:
        self.f, self.scratch = f, scratch

    def linear(self, name: str, out_f: int, in_f: int) -> Linear:
        t = self.f.tensor(name)
        if t.shape != (out_f, in_f):
            raise ModelLoadError(f"{self.f.path}: tensor {name} has shape {t.shape}, expected {(out_f, in_f)}")
        return Linear(t, self.scratch)

    def vector(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        t = self.f.tensor(name)
        if t.shape != shape:
            raise ModelLoadError(f"{self.f.path}: tensor {name} has shape {t.shape}, expected {shape}")
        return vector(t)

    def has(self, name: str) -> bool:
        return self.f.has_tensor(name)


Hook = Callable[[str, int, np.ndarray], None]


class CapturingForward:
    """`forward` as `forward_capturing` with nothing captured (each model defines the latter)."""

    def forward_capturing(self, tokens: np.ndarray, state: State, capture: Sequence[int], *,
                          logits: str = "last", hook: Hook | None = None
                          ) -> tuple[np.ndarray | None, dict[int, State]]:
        raise NotImplementedError

    def forward(self, tokens: np.ndarray, state: State, *, logits: str = "last",
                hook: Hook | None = None) -> np.ndarray | None:
        """Run T new tokens through every layer as one batch, advancing `state` in place.

        logits: "last" → (n_vocab,) for the last position; "all" → (T, n_vocab); "none" → None.
        """
        return self.forward_capturing(tokens, state, (), logits=logits, hook=hook)[0]

    def decode_batch(self, tokens: Sequence[int], states: Sequence[State], *, exact: bool = False) -> np.ndarray:
        """One new token for each of B sequences, each on its own state (advanced in place):
        logits (B, n_vocab), row b what `forward` of tokens[b] on states[b] gives (`exact`: bit
        for bit; else up to the rounding of multi-row products). This default runs the sequences
        one after another (exact either way); a model overrides it to run each layer for all of
        them together (continuous batching, the resident server)."""
        rows = [self.forward(np.asarray([t], dtype=np.int64), st) for t, st in zip(tokens, states)]
        return np.stack([r for r in rows if r is not None])


def empty_attention(n_head_kv: int, head_dim: int) -> AttentionState:
    """An attention layer's state before any token: K and V of no positions."""
    empty = np.zeros((n_head_kv, 0, head_dim), dtype=KV_DTYPE)
    return AttentionState(empty, empty.copy())


def n_vocab(f: GGUFFile) -> int:
    """The vocabulary size: the tokenizer's token list, else the embedding's rows."""
    tokens = f.get("tokenizer.ggml.tokens")
    return len(tokens) if tokens else f.tensor("token_embd.weight").shape[0]


def check_forward(tokens: np.ndarray, start: int, capture: Sequence[int], n_vocab: int) -> tuple[np.ndarray, list[int]]:
    """`tokens` as int64 ids within the vocabulary and `capture` as sorted absolute positions in
    (start, start + T]; ValueError naming what is wrong otherwise."""
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if tokens.size == 0:
        raise ValueError("forward needs at least one token")
    positions = sorted(set(int(p) for p in capture))
    if positions and not (start < positions[0] and positions[-1] <= start + tokens.size):
        raise ValueError(f"capture positions {positions} must lie in ({start}, {start + tokens.size}]")
    if tokens.min() < 0 or tokens.max() >= n_vocab:
        bad = int(tokens[(tokens < 0) | (tokens >= n_vocab)][0])
        raise ValueError(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})")
    return tokens, positions


def output_logits(x: np.ndarray, norm: np.ndarray, output: Linear, eps: float, logits: str,
                  hook: Hook | None) -> np.ndarray | None:
    """The final RMS norm and the head over the last layer's output `x` (T, n_embd): logits "last"
    (n_vocab,), "all" (T, n_vocab) or "none" (None, no work)."""
    if logits == "none":
        return None
    if logits == "last":
        x = x[-1:]
    h = rms_norm(x, norm, eps)
    if hook:
        hook("result_norm", -1, h)
    out = lm_head(output, h)
    return out[0] if logits == "last" else out


def each_row(lin: Linear, h: np.ndarray) -> np.ndarray:
    """`lin` over the rows of `h` one at a time: each row's product is the decode kernel's, bit for
    bit what the row alone gets (a multi-row product accumulates in another order), while the
    matrix, read for the first row, is still in the cache for the next."""
    if h.shape[0] == 1:
        return lin(h)
    return np.concatenate([lin(h[i:i + 1]) for i in range(h.shape[0])], axis=0)


def lm_head(output: Linear, h: np.ndarray) -> np.ndarray:
    """Logits of the normed positions `h` (T, n_embd). Row blocks keep the dequantized head
    bounded when all positions are asked for."""
    return each_row(output, h)


def attend(st: AttentionState, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
    """This pass's roped K and V (T, H_kv, d) appended to the layer's cache at `start`, then
    causal attention of q (T, H, d) over every position so far, scaled 1/sqrt(d): (T, H, d)."""
    T, d = q.shape[0], q.shape[2]
    st.reserve(start + T, start)
    # stored in the cache's type (float16, as llama.cpp's cache), then read back from it: a
    # prompt's own positions attend to the rounded K/V as later tokens will
    st.k[:, start:start + T] = np.swapaxes(k, 0, 1)
    st.v[:, start:start + T] = np.swapaxes(v, 0, 1)
    n = start + T
    if T == 1 and st.k.dtype == np.float16:
        return attention.decode_attention(q, st.k, st.v, n, 1.0 / math.sqrt(d))
    return attention.causal_attention(q, st.k[:, :n], st.v[:, :n], start, 1.0 / math.sqrt(d))
