"""The elementwise kernels (engine/jit.py `kernel`) in their assembly: packed 256-bit arithmetic
(512-bit on an AVX-512 host).

Decode runs them on one token's activations ~100 times a step, and a scalar loop cost 5x: with
numba's default error model every float division carries a zero test that keeps LLVM from
vectorising (SiLU · up over 3584 values 11.9 vs 2.2 us). Nothing functional fails when that
comes back, so this test does.
"""
from __future__ import annotations

import platform
import re

import numpy as np
import pytest

from engine import deltanet, ops
from tests.asm import asm_of

llvm = pytest.importorskip("llvmlite.binding")
pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or "+avx2" not in llvm.get_host_cpu_features().flatten(),
    reason="packed AVX2 instructions: an x86_64 host with AVX2")

PACKED_FMA = re.compile(r"\tvfn?madd\d+ps\t.*%[yz]mm")  # 256-bit, or 512 on an AVX-512 host


def _compiled():
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    ops.silu_mul(x, x)
    ops.silu(x)
    ops.sigmoid(x)
    deltanet.causal_conv1d_silu(x.reshape(1, 64), np.zeros((3, 64), np.float32),
                                np.ones((64, 4), np.float32, order="F"))
    return {"silu_mul": ops._silu_mul_flat.serial, "silu": ops._silu_flat.serial,
            "sigmoid": ops._sigmoid_flat.serial, "conv_silu": deltanet._conv_silu_rows.serial}


@pytest.mark.parametrize("name", ["silu_mul", "silu", "sigmoid", "conv_silu"])
def test_elementwise_kernels_run_packed_fmas(name):
    asm = "\n".join(asm_of(_compiled()[name]))
    assert PACKED_FMA.search(asm), f"{name}: no packed ymm FMA (a scalar loop)"
