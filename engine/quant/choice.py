"""Which kernel runs each weight format on this CPU, as the init log line and the bench receipt
say it: ``{"Q4_K": {"decode": "avx2-int8", "prefill": "avx512vnni-int8"}, ...}``.

Above both the level tables (paths.py) and the dispatcher (kernels.py): it reads them, nothing
below imports it.
"""
from __future__ import annotations

from gguf import GGMLQuantizationType as T

from . import kernels
from .formats import supported_types
from .paths import X86_LOWBIT_INT8, has_int8, target, tile_level, x4_layout

__all__ = ["decode_path", "kernel_paths", "prefill_path"]


def decode_path(qtype) -> str:
    if not has_int8(qtype):
        return "float"
    # arm64's decode rows are `sdot` on every level that has them (smmla needs two tokens)
    if target().level.is_arm:
        return "neon-dotprod-int8" + ("x4" if x4_layout(qtype) else "")
    # x86/lowbit.py's rows are AVX2 instructions on every x86 level (256-bit: decode is bound by
    # the weight stream, not the multiplies)
    return "avx2-int8" if T(qtype) in X86_LOWBIT_INT8 else f"{target().level}-int8"


def prefill_path(qtype, tokens: int = 512) -> str:
    """The kernel a prefill of `tokens` tokens runs for `qtype` (weights.Linear asks the same)."""
    if T(qtype) == T.F32:
        return "blas"
    if kernels.int8_prefill_wins(qtype, tokens):
        return f"{tile_level(qtype)}-int8" + ("x4" if x4_layout(qtype) else "")
    return "dequantize+blas"


def kernel_paths(qtypes=None) -> dict[str, dict[str, str]]:
    """Per format: the decode kernel and the 512-token prefill kernel chosen on this CPU."""
    qts = qtypes if qtypes is not None else supported_types()
    out = {}
    for qt in sorted({T(q) for q in qts}, key=lambda q: q.name):
        out[qt.name] = {"decode": decode_path(qt), "prefill": prefill_path(qt)}
    return out
