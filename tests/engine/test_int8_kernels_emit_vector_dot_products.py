"""The x86_64 integer decode kernels, shown in their assembly: the instructions their speed rests on.

int8_dot.py writes generic LLVM IR that the x86 backend must match to `pmaddubsw`/`pmaddwd`
(a folded clamp or a freeze made it fall back to widening shuffles at 3-4 GB/s instead of
15-23), and asks for the weights PREFETCH bytes ahead (decode streams them from DRAM). Nothing
functional fails when a match is lost, so this test does: every row kernel, one token and a
tile of tokens, for each format.
"""
from __future__ import annotations

import platform

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from engine.quant import kernels as K
from engine.quant import paths, traits
from tests.asm import asm_of

llvm = pytest.importorskip("llvmlite.binding")
pytestmark = pytest.mark.skipif(
    platform.machine() not in traits.INT8_MACHINES or "+avx2" not in llvm.get_host_cpu_features().flatten(),
    reason="the integer kernels' x86 instructions: an x86_64 host with AVX2")

# the instructions each format's row kernels must contain
EXPECTED = {
    T.Q4_K: ("vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.Q6_K: ("vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.Q8_0: ("vpmaddwd", "prefetcht0"),
}
# the low-bit formats' decode rows and tiles (engine/quant/x86/lowbit.py, AVX2 on every level)
LOWBIT_EXPECTED = {
    T.Q2_K: ("vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.Q3_K: ("vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.Q5_K: ("vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.IQ4_XS: ("vpshufb", "vpsignb", "vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.IQ4_NL: ("vpshufb", "vpsignb", "vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.IQ3_S: ("vpshufb", "vpmaddubsw", "vpmaddwd", "prefetcht0"),
    # the legacy 32-value formats: signed Q4_0 / Q5_0 as IQ4_NL, unsigned Q4_1 / Q5_1 straight in
    T.Q4_0: ("vpsignb", "vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.Q5_0: ("vpshufb", "vpsignb", "vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.Q4_1: ("vpmaddubsw", "vpmaddwd", "prefetcht0"),
    T.Q5_1: ("vpshufb", "vpmaddubsw", "vpmaddwd", "prefetcht0"),
}
# the K-format tiles per level (engine/quant/x86/avx512.py, x86/avx2.py)
TILE_EXPECTED = {
    "avx512vnni": ("vpdpbusd", "vpackssdw", "prefetcht0"),
    "avx512bw": ("vpmaddubsw", "vpmaddwd", "prefetcht0"),
    "avxvnni": ("vpdpbusd", "vpackssdw", "prefetcht0"),
    "avx2": ("vpmaddubsw", "vpmaddwd", "prefetcht0"),
}


def _compiled(qtype, tokens: int):
    """The kernel decode (one token) or a short prefill (a tile) runs for `qtype`, compiled by
    running it: rows x cols big enough for the parallel kernel, not its serial twin."""
    fmt = K.get_format(qtype)
    rows, cols = 256, 256
    plan = K.MatvecPlan(qtype, np.zeros((rows, cols // fmt.block_size * fmt.type_size), np.uint8), rows, cols)
    x = np.random.default_rng(0).standard_normal((tokens, cols)).astype(np.float32)
    if tokens == 1:
        plan(x[0], np.empty(rows, np.float32))
        return plan.kernel
    plan.tokens(x)
    return plan.k.tile


@pytest.mark.parametrize("tokens", [1, 5], ids=["decode", "tile"])
@pytest.mark.parametrize("qtype", list(EXPECTED), ids=lambda t: t.name)
def test_integer_row_kernels_use_the_x86_dot_instructions(qtype, tokens):
    asm = "\n".join(asm_of(_compiled(qtype, tokens)))
    want = EXPECTED[qtype] if tokens == 1 or qtype == T.Q8_0 else TILE_EXPECTED[paths.target().level]
    if tokens > 1 and traits.int8_row(qtype).tile_call == "panel":  # Intel's AVX-512 VNNI: the panel tiles
        want = PANEL_K_EXPECTED[qtype]
        extra = [op for op in VNNI512_TILE_ABSENT if op in asm]
        assert not extra, f"{qtype.name} x{tokens}: {extra} in the panel kernel's assembly"
    missing = [op for op in want if op not in asm]
    assert not missing, f"{qtype.name} x{tokens}: no {missing} in the kernel's assembly"


@pytest.mark.parametrize("tokens", [1, 5], ids=["decode", "tile"])
@pytest.mark.parametrize("qtype", list(LOWBIT_EXPECTED), ids=lambda t: t.name)
def test_low_bit_kernels_use_the_x86_dot_instructions(qtype, tokens):
    asm = "\n".join(asm_of(_compiled(qtype, tokens)))
    want = LOWBIT_EXPECTED[qtype]
    absent: tuple = ()
    if tokens > 1 and traits.int8_row(qtype).level == "avx512vnni":
        want, absent = VNNI512_TILE_EXPECTED[qtype], VNNI512_TILE_ABSENT
    missing = [op for op in want if op not in asm]
    assert not missing, f"{qtype.name} x{tokens}: no {missing} in the kernel's assembly"
    extra = [op for op in absent if op in asm]
    assert not extra, f"{qtype.name} x{tokens}: {extra} in the panel kernel's assembly"


@pytest.mark.parametrize("tokens", [1, 5], ids=["decode", "tile"])
@pytest.mark.parametrize("qtype", list(EXPECTED) + list(LOWBIT_EXPECTED), ids=lambda t: t.name)
def test_block_scales_are_read_without_a_merge_into_a_live_register(qtype, tokens):
    # int8_dot.half_at: a block's f16 scale narrowed to `vpinsrw $0, mem, %xmmN` merges into
    # whatever register LLVM picked, the float accumulator in the Q4_0 / Q5_0 / Q4_1 / Q5_1 /
    # IQ4_NL rows, so each block waited on the previous block's FMA (Q5_1 rows 4.4 GB/s instead
    # of 9.8 on one Zen 3 core)
    asm = "\n".join(asm_of(_compiled(qtype, tokens)))
    assert "vpinsrw" not in asm, f"{qtype.name} x{tokens}: a scale loaded with vpinsrw"


# the panel tiles on AVX-512 VNNI (x86/lowbit.py): weights unpacked into the P16 order
# (IQ4_XS's biased levels looked up with vpshufb, Q3_K's and Q5_K's high bits rotated into place
# with vprolvd), then 4-value sums by vpdpbusd, with no per-token scale multiply on the integer
# port (no vpmulld, no vpackssdw + vpdpwssd: the earlier tiles' scheme)
VNNI512_TILE_EXPECTED = {
    T.IQ4_XS: ("vpshufb", "vpdpbusd", "prefetcht0"),
    T.Q3_K: ("vprolvd", "vpdpbusd", "prefetcht0"),
    T.Q5_K: ("vprolvd", "vpdpbusd", "prefetcht0"),
}
VNNI512_TILE_ABSENT = ("vpmulld", "vpackssdw", "vpdpwssd")
# Q4_K's and Q6_K's panel tiles (Intel's AVX-512 VNNI): Q6_K's two high bits rotated into place
PANEL_K_EXPECTED = {T.Q4_K: ("vpermi2d", "vpdpbusd", "prefetcht0"), T.Q6_K: ("vprolvd", "vpdpbusd", "prefetcht0")}


@pytest.mark.skipif(paths.target().level != "avx512vnni", reason="numba compiling for AVX-512 VNNI")
@pytest.mark.parametrize("qtype", (T.IQ4_XS, T.Q3_K, T.Q5_K), ids=lambda t: t.name)
def test_low_bit_vnni_tiles_use_512_bit_registers(qtype):
    asm = "\n".join(asm_of(_compiled(qtype, 5)))
    wide = [line for line in asm.splitlines() if "vpdpbusd" in line and "zmm" in line]
    assert wide, f"{qtype.name}: no vpdpbusd on zmm registers in the tile kernel"


@pytest.mark.skipif(paths.target().vector_bytes != 64, reason="numba compiling for AVX-512BW")
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_prefill_tiles_use_512_bit_registers(qtype):
    # the K-format tiles are written as <64 x i8> so that one instruction covers two runs of 32
    # weights; where that is lost (a concatenated operand, a target that prefers 256 bits) the
    # prefill GEMM falls back to 256-bit code at ~0.6x the speed and nothing functional fails
    asm = "\n".join(asm_of(_compiled(qtype, 5)))
    op = "vpdpbusd" if paths.target().level == "avx512vnni" else "vpmaddubsw"
    wide = [line for line in asm.splitlines() if op in line and "zmm" in line]
    assert wide, f"{qtype.name}: no {op} on zmm registers in the tile kernel"
