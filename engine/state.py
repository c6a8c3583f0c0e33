"""Per-sequence model state: what a snapshot stores and a session keeps warm.

DeltaNet layers hold the conv tail (kernel-1 rows of qkv) and the recurrent matrix S per
value head; attention layers hold K and V for every position so far. Plain data: it can be
copied, compared, sliced to a prefix (attention only) and serialized through one protocol,
`LayerState`, that both kinds implement.

A state held by the snapshot store is frozen (its arrays read-only) and sessions continue from
a `fork` that shares them: the forward replaces the DeltaNet arrays and grows K/V into new
arrays instead of writing into frozen ones (restoring a 504-token prefix of the 0.8B model
copied 33 MB, ~30 ms, before).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np


class LayerState(Protocol):
    """What every per-layer state offers the session, the snapshot format and the model.

    `n` is the number of valid positions (State.n_tokens); a kind that keeps no per-position
    data ignores it. `named_arrays(n)` is the state as data: the arrays a snapshot stores,
    under names stable across versions, and `from_arrays` builds the state back from them."""

    kind: ClassVar[str]
    dtypes: ClassVar[dict[str, type]]  # each named array's element type (a snapshot stores it so)

    def copy(self, n: int) -> LayerState: ...
    def fork(self) -> LayerState: ...
    def nbytes(self, n: int) -> int: ...
    def named_arrays(self, n: int) -> dict[str, np.ndarray]: ...
    def arrays(self) -> list[np.ndarray]: ...
    def layout(self) -> tuple[tuple[int, ...], tuple[int, ...]]: ...


@dataclass
class DeltaNetState:
    kind: ClassVar[str] = "deltanet"
    dtypes: ClassVar[dict[str, type]] = {"conv": np.float32, "S": np.float32}  # per named array
    conv: np.ndarray  # (d_conv - 1, conv_dim) f32: last inputs of the causal conv
    S: np.ndarray  # (n_v_heads, d_k, d_v) f32

    def copy(self, n: int) -> DeltaNetState:
        return DeltaNetState(self.conv.copy(), self.S.copy())

    def fork(self) -> DeltaNetState:
        return DeltaNetState(self.conv, self.S)

    def arrays(self) -> list[np.ndarray]:
        return [self.conv, self.S]

    def named_arrays(self, n: int) -> dict[str, np.ndarray]:
        return {"conv": self.conv, "S": self.S}

    def nbytes(self, n: int) -> int:
        return int(self.conv.nbytes + self.S.nbytes)

    def layout(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes a snapshot's arrays must have for this model: (conv, S)."""
        return tuple(self.conv.shape), tuple(self.S.shape)

    @staticmethod
    def expected_shapes(layout: tuple[tuple[int, ...], tuple[int, ...]], n: int) -> dict[str, tuple[int, ...]]:
        return {"conv": layout[0], "S": layout[1]}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> DeltaNetState:
        return cls(a["conv"], a["S"])


# The attention cache's element type: IEEE half, llama.cpp's default (type_k = type_v = f16). A
# decode step reads the whole cache: at 4096 tokens of context the 0.8B model's 6 layers hold
# 50 MB of it at f16 (100 MB at f32, beside 516 MB of Q4_K_M weights), at 32k 400 MB (800).
KV_DTYPE = np.float16


@dataclass
class AttentionState:
    """K/V with spare capacity; only the first `n` positions (State.n_tokens) are valid."""

    kind: ClassVar[str] = "attention"
    dtypes: ClassVar[dict[str, type]] = {"k": KV_DTYPE, "v": KV_DTYPE}
    k: np.ndarray  # (n_kv_heads, capacity, head_dim) KV_DTYPE
    v: np.ndarray  # (n_kv_heads, capacity, head_dim) KV_DTYPE

    @property
    def capacity(self) -> int:
        return int(self.k.shape[1])

    def reserve(self, n: int, used: int) -> None:
        """Room for n positions in writable arrays (frozen ones are never written)."""
        if n <= self.capacity and self.k.flags.writeable and self.v.flags.writeable:
            return
        cap = max(n, 2 * self.capacity, 64)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = np.empty((old.shape[0], cap, old.shape[2]), dtype=KV_DTYPE)
            new[:, :used] = old[:, :used]
            setattr(self, name, new)

    def copy(self, n: int) -> AttentionState:
        return AttentionState(self.k[:, :n].copy(), self.v[:, :n].copy())

    def fork(self) -> AttentionState:
        return AttentionState(self.k, self.v)

    def arrays(self) -> list[np.ndarray]:
        return [self.k, self.v]

    def named_arrays(self, n: int) -> dict[str, np.ndarray]:
        return {"k": self.k[:, :n], "v": self.v[:, :n]}

    def nbytes(self, n: int) -> int:
        return int(2 * self.k.shape[0] * n * self.k.shape[2] * self.k.itemsize)

    def layout(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shapes that must match for this model: (n_kv_heads, head_dim), ()."""
        return (self.k.shape[0], self.k.shape[2]), ()

    @staticmethod
    def expected_shapes(layout: tuple[tuple[int, ...], tuple[int, ...]], n: int) -> dict[str, tuple[int, ...]]:
        want = (layout[0][0], n, layout[0][1])
        return {"k": want, "v": want}

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray]) -> AttentionState:
        return cls(a["k"], a["v"])


# The layer kinds by the name a snapshot records (adding a kind is one class and one entry).
LAYER_KINDS: dict[str, type[DeltaNetState] | type[AttentionState]] = {
    DeltaNetState.kind: DeltaNetState,
    AttentionState.kind: AttentionState,
}


@dataclass
class State:
    n_tokens: int
    layers: list[LayerState] = field(default_factory=list)

    def copy(self) -> State:
        """An independent copy holding exactly n_tokens positions (no spare KV capacity)."""
        return State(self.n_tokens, [l.copy(self.n_tokens) for l in self.layers])

    def freeze(self) -> State:
        """Make every array read-only (a state many sessions may continue from); returns self."""
        for layer in self.layers:
            for a in layer.arrays():
                a.flags.writeable = False
        return self

    def fork(self) -> State:
        """A state that continues from this one without changing it: it shares the arrays, and
        the forward writes into none of them while they are frozen."""
        return State(self.n_tokens, [layer.fork() for layer in self.layers])

    @property
    def nbytes(self) -> int:
        return sum(l.nbytes(self.n_tokens) for l in self.layers)

    def max_abs_diff(self, other: State, kv_ulps: int = 0) -> float:
        """Largest elementwise difference over every array (inf when shapes differ). With
        `kv_ulps`, differences in float16 arrays (the attention cache) up to that many units in
        the last place count as none: a K or V computed along another path (another chunking,
        the decode kernels) may round to the neighbouring half."""
        if self.n_tokens != other.n_tokens or len(self.layers) != len(other.layers):
            return float("inf")
        worst = 0.0
        n = self.n_tokens
        for a, b in zip(self.layers, other.layers):
            if a.kind != b.kind:
                return float("inf")
            xs, ys = a.named_arrays(n), b.named_arrays(n)
            for name, x in xs.items():
                y = ys[name]
                if x.shape != y.shape:
                    return float("inf")
                if not x.size:
                    continue
                d = np.abs(x.astype(np.float32) - y.astype(np.float32))
                if kv_ulps and x.dtype == np.float16:
                    big = np.maximum(np.abs(x), np.abs(y)).astype(np.float16)
                    d[d <= kv_ulps * np.spacing(big).astype(np.float32)] = 0.0
                worst = max(worst, float(d.max()))
        return worst
