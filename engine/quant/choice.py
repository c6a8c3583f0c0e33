"""Which kernel runs each weight format on this CPU, as the init log line and the bench receipt
say it: ``{"Q4_K": {"decode": "avx2-int8", "prefill": "avx512vnni-int8"}, ...}``.

Above the traits rows (traits.py) and the dispatcher (kernels.py): it reads them, nothing below
imports it.
"""
from __future__ import annotations

from gguf import GGMLQuantizationType as T

from . import kernels
from .formats import supported_types
from .traits import int8_row

__all__ = ["decode_path", "kernel_paths", "prefill_path"]


def decode_path(qtype) -> str:
    """The decode row `qtype` runs here: its traits row's name, else the float product."""
    k = int8_row(qtype)
    return k.decode if k is not None else "float"


def prefill_path(qtype, tokens: int = 512) -> str:
    """The kernel a prefill of `tokens` tokens runs for `qtype` (weights.Linear asks the same)."""
    if T(qtype) == T.F32:
        return "blas"
    k = int8_row(qtype)
    if k is not None and kernels.int8_prefill_wins(qtype, tokens):
        return f"{k.level}-int8" + ("x4" if k.x4 else "")
    return "dequantize+blas"


def kernel_paths(qtypes=None) -> dict[str, dict[str, str]]:
    """Per format: the decode kernel and the 512-token prefill kernel chosen on this CPU."""
    qts = qtypes if qtypes is not None else supported_types()
    out = {}
    for qt in sorted({T(q) for q in qts}, key=lambda q: q.name):
        out[qt.name] = {"decode": decode_path(qt), "prefill": prefill_path(qt)}
    return out
