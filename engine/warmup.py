"""Warm the request path at load, so the first request pays for nothing a later one does not.

A request runs kernels by the size of its work: one token (decode, every matrix's matvec plan), a
short prefill (the multi-token kernels, up to ``SHORT_PREFILL`` tokens), a long one (the int8 tile
kernels or dequantize + BLAS, DeltaNet in chunks past ``RECURRENT_MAX`` tokens, the parallel twin
of every elementwise kernel, engine/jit.py). Each is compiled or loaded from numba's cache on its
first call, and the first parallel launch starts numba's thread pool (~0.7 s measured on a loaded
2-vCPU host in a first request of 421 tokens, before this). :func:`warm_up` runs all three sizes:

1. two tokens then one through the whole model: every layer's short-prefill and decode kernels,
   every weight page touched and every matvec plan made;
2. ``RECURRENT_MAX + 1`` tokens through one layer of each kind -- a layer's mixer class and the
   weight format of each of its matrices -- (:func:`representative_layers`: 4 of the 0.8B
   Q4_K_M file's 24 layers), so the long-prefill kernels load without the cost of a long prompt
   through every layer;
3. every elementwise kernel's other launch mode (serial or parallel, picked by the size of the
   work) loaded for the argument types the passes gave it (``jit.warm_twins``).

The timings split what numba did (compiles and cache loads: ``kernels_ms``) from running the
passes (``warmup_ms``); they sum to the warm-up's wall time.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine import jit
from engine.deltanet import RECURRENT_MAX
from engine.stages import kernel_work
from engine.state import State
from engine.weights import Linear

__all__ = ["WarmUp", "representative_layers", "warm_up"]

LONG_TOKENS = RECURRENT_MAX + 1


@dataclass(frozen=True)
class WarmUp:
    kernels_ms: float     # numba compiling or loading kernels
    warmup_ms: float      # the passes themselves (first touch of weights and buffers included)
    kernels_compiled: int
    layers: tuple[int, ...]


def _signature(obj: Any) -> tuple:
    """A layer's kind: its class and, field by field, each matrix's weight format."""
    out: list[Any] = [type(obj).__name__]
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, Linear):
            out.append((f.name, int(v.qtype)))
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            out.append((f.name, _signature(v)))
    return tuple(out)


def representative_layers(model: Any) -> list[int]:
    """The first layer of each kind (:func:`_signature`), in order."""
    first: dict[tuple, int] = {}
    for il, lw in enumerate(model.layers):
        first.setdefault(_signature(lw), il)
    return sorted(first.values())


def warm_up(model: Any, tokenizer: Any = None, long_tokens: int = LONG_TOKENS) -> WarmUp:
    """Run the request path's three sizes once (the module doc), and the tokenizer's merges
    (engine/bpe.py, numba too); the model's state is untouched."""
    t0 = time.perf_counter()
    layers = representative_layers(model)
    with kernel_work() as work:
        state = model.new_state()
        model.forward(np.zeros(2, dtype=np.int64), state, logits="last")
        model.forward(np.zeros(1, dtype=np.int64), state, logits="last")
        # the same model over a few of its layers: a shallow copy shares the weights and scratch
        part = copy.copy(model)
        part.layers = [model.layers[i] for i in layers]
        full = model.new_state()
        part.forward(np.zeros(long_tokens, dtype=np.int64), State(0, [full.layers[i] for i in layers]),
                     logits="last")
        jit.warm_twins()   # sizes past these passes' pick the other twin of a kernel (engine/jit.py)
        if tokenizer is not None:
            tokenizer.encode_text("warm up")
    total = (time.perf_counter() - t0) * 1e3
    return WarmUp(kernels_ms=work.ms, warmup_ms=max(0.0, total - work.ms), kernels_compiled=work.compiled,
                  layers=tuple(layers))
