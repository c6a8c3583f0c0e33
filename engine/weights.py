"""A weight matrix in its stored format and the one way the model multiplies by it.

`Linear(x)` with x of shape (T, in): T == 1 runs the quantized matrix-vector kernel (decode
reads each weight byte once; Q4_K/Q5_K/Q6_K/Q8_0 and the low-bit Q2_K/Q3_K/IQ4_XS/IQ4_NL/IQ3_S
in int8 arithmetic on x86_64, engine/quant/paths.py). T > 1 of Q4_K/Q6_K
on an AVX-512 host runs the multi-token int8 kernel at every length (512-bit
`pmaddubsw`/`pmaddwd` tiles, faster than dequantize + fp32 BLAS from T = 2 to 512 and beyond,
`kernels.has_int8_prefill`); a short T (a chat turn's suffix) of those formats elsewhere on
x86_64 runs it too; otherwise the whole matrix is dequantized into a reused f32 buffer and
BLAS does `X @ W.T` (the other formats, longer prompts, and arm64, where the integer kernels
do not run).
F32 weights are used straight from the mmap in both cases. Where the float kernels run (arm64)
the Q8_0 and Q6_K decode kernels take per-block scales decoded once into f32
(`kernels.prepare`), made lazily on the first T == 1 call and kept beside the mmap'd bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from engine.gguf_file import TensorView
from engine.quant import formats, kernels
from engine.quant.activations import (Q8KTokens, Q80Tokens, activation_format, quantize_q8_0_tokens, quantize_q8_k_tokens,
                                      round_activations)


SHORT_PREFILL = kernels.SHORT_PREFILL  # the measurement is beside it in kernels.py


@dataclass
class ScratchBuffer:
    """What every Linear of a model shares in a batched prefill: one f32 buffer for dequantized
    weights, and the last input it prepared for a product (rounded as
    activations.round_activations, or quantized to Q8_K for the int8 kernels) with the result —
    the projections that read one input (a DeltaNet's qkv, gate, beta, alpha; attention's q,
    k, v; the FFN's gate and up) prepare it once, not once each (0.8B, 512 tokens: 57 ms of
    rounding, 36 beta/alpha products of 16 rows at 0.4 ms each, mostly rounding). Keyed by the
    input array itself: the model never writes into an activation it has multiplied."""

    data: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float32))
    _prepared_in: np.ndarray | None = None
    _prepared_as: str = ""
    _prepared: Any = None

    def take(self, rows: int, cols: int) -> np.ndarray:
        n = rows * cols
        if self.data.size < n:
            self.data = np.empty(n, dtype=np.float32)
        return self.data[:n].reshape(rows, cols)

    def _memo(self, x: np.ndarray, key: str, make: Callable[[], Any]) -> Any:
        if x is not self._prepared_in or key != self._prepared_as:
            self._prepared_in, self._prepared_as, self._prepared = x, key, make()
        return self._prepared

    def rounded(self, x: np.ndarray, weight_type: GGMLQuantizationType) -> np.ndarray:
        return self._memo(x, activation_format(weight_type), lambda: round_activations(x, weight_type))

    def q8k_tokens(self, x: np.ndarray) -> Q8KTokens:
        return self._memo(x, "q8_k tokens", lambda: quantize_q8_k_tokens(x, kernels.WIDE_TILE))

    def q8_0_tokens(self, x: np.ndarray, dtype) -> Q80Tokens:
        return self._memo(x, f"q8_0 tokens {np.dtype(dtype).name}", lambda: quantize_q8_0_tokens(x, kernels.TILE, dtype))

    def forget(self) -> None:
        """Drop the held input and its preparation (the end of a forward)."""
        self._prepared_in = self._prepared = None


class Linear:
    """y = x @ W.T for W stored as (out_features rows, in_features cols) in any weight format."""

    def __init__(self, view: TensorView, scratch: ScratchBuffer) -> None:
        if len(view.shape) != 2:
            raise ValueError(f"tensor {view.name} has shape {view.shape}; a matrix needs 2 dims")
        self.name = view.name
        self.qtype = view.qtype
        self.out_features, self.in_features = view.shape
        self.raw = view.data
        self._scratch = scratch
        self._plan: kernels.MatvecPlan | None = None  # decode kernel + prepared scales, made on first T == 1
        # asked once: per call it cost ~9 ms of a 30-token forward (372 calls, platform.machine())
        self._multi_token = kernels.has_multi_token_kernel(view.qtype)
        self._int8_prefill = kernels.has_int8_prefill(view.qtype)
        self._f32 = (
            view.data.view(np.float32).reshape(view.shape)
            if view.qtype == GGMLQuantizationType.F32 else None
        )

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self._f32 is not None:
            return x @ self._f32.T
        if x.shape[0] == 1:
            out = np.empty((1, self.out_features), dtype=np.float32)
            self._matvec_plan()(x[0], out[0])  # rounds the activations as llama.cpp does
            return out
        # ask before building the plan: for other formats it would prepare decode-only scales
        if self._int8_prefill or (x.shape[0] <= SHORT_PREFILL and self._multi_token):
            # the activations quantized once per input for all the matrices that read it: Q8_K
            # (the K formats, Q2_K .. IQ3_S) or Q8_0 (Q8_0, IQ4_NL, Q4_0, Q5_0); Q8_1's (Q4_1,
            # Q5_1) per product
            plan = self._matvec_plan()
            if activation_format(self.qtype) == "q8_k":
                return plan.tokens_q8k(self._scratch.q8k_tokens(x))
            dtype = plan.q8_0_dtype()
            return plan.tokens(x) if dtype is None else plan.tokens_q8_0(self._scratch.q8_0_tokens(x, dtype))
        x = self._scratch.rounded(x, self.qtype)
        w = self._scratch.take(self.out_features, self.in_features)
        kernels.dequantize_rows_into(self.qtype, self.raw, w)
        return x @ w.T

    def _matvec_plan(self) -> kernels.MatvecPlan:
        if self._plan is None:
            self._plan = kernels.MatvecPlan(self.qtype, self.raw, self.out_features, self.in_features)
        return self._plan

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Dequantized rows `ids` (an embedding lookup), shape (len(ids), in_features)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self._f32 is not None:
            return self._f32[ids].astype(np.float32, copy=True)
        return formats.dequantize(self.raw[ids], self.qtype, (len(ids), self.in_features))


def vector(view: TensorView) -> np.ndarray:
    """A 1-D (or small) tensor such as a norm weight, as f32."""
    if view.qtype == GGMLQuantizationType.F32:
        return np.array(view.data.view(np.float32).reshape(view.shape))
    return formats.dequantize(view.data.reshape(-1), view.qtype, view.shape)
