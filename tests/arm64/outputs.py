"""What each CPU target computes, recorded the same way under emulation and on the host, so the
targets can be compared with each other (and with x86) under stated tolerances."""
from __future__ import annotations

import numpy as np

WEIGHTS = ("F32", "Q8_0", "Q4_K_M")
N_LOGIT_PROMPTS = 4
N_GREEDY_PROMPTS = 3


def matvec_cases():
    """(name, qtype, raw, W (dequantized reference), x) for every format the kernels serve."""
    from gguf import GGMLQuantizationType as T

    from engine.quant import formats as F

    rng = np.random.default_rng(7)
    x = rng.standard_normal(768, dtype=np.float32)
    for qt in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K):
        W = rng.standard_normal((33, 768), dtype=np.float32)
        raw = F.quantize(W, qt)
        yield qt.name, qt, raw, F.dequantize(raw, qt, W.shape), x


def factory_sha256(weights: str) -> str:
    """sha256 of the tiny model this machine's factory writes (not the host-built copy)."""
    import hashlib
    import tempfile
    from pathlib import Path

    from engine.synthetic import factory

    make = getattr(factory.make_model, "_original", factory.make_model)
    with tempfile.TemporaryDirectory() as d:
        return hashlib.sha256(make(Path(d) / "m.gguf", "tiny", weights, 0, None).read_bytes()).hexdigest()


def record(load_engine) -> dict[str, np.ndarray]:
    """load_engine(weights) -> Engine for the tiny factory model with those weights."""
    from engine.quant import kernels as K
    from engine.synthetic.parity_cases import GREEDY_TOKENS, greedy_prompts, logit_prompts
    from tests.parity import our_greedy, our_last_logits

    out: dict[str, np.ndarray] = {}
    for name, qt, raw, _W, x in matvec_cases():
        y = np.empty(raw.shape[0], np.float32)
        K.matvec(qt, raw, x, y)
        out[f"mv_{name}"] = y
    for w in WEIGHTS:
        out[f"factory_sha256_{w}"] = np.array(factory_sha256(w))
        eng = load_engine(w)
        out[f"logits_{w}"] = np.stack([our_last_logits(eng, p) for p in logit_prompts()[:N_LOGIT_PROMPTS]])
        if w == "F32":
            out["greedy_F32"] = np.array([our_greedy(eng, p, GREEDY_TOKENS)
                                          for p in greedy_prompts()[:N_GREEDY_PROMPTS]])
    return out
