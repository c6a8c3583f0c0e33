"""The instruction-set level numba compiles for on this CPU, decided once per process and said.

The instruction set is the one numba compiles for, not the host's by itself: numba's JIT
takes the CPU name from NUMBA_CPU_NAME (else the host) and the ISA features from
NUMBA_CPU_FEATURES (else the host's, whatever the name says — NUMBA_CPU_NAME=haswell alone
still compiles AVX-512 on an AVX-512 host). `target()` reads both the way numba does.

Levels (one folder of kernel files per ISA under engine/quant/: x86/, arm/):

| level | where | int8 products | file |
|---|---|---|---|
| `avx512vnni` | Ice Lake+ Xeons, Zen 4/5 | `vpdpbusd` (+ `vpackssdw`, `vpdpwssd` for the K scales), 512-bit | `x86/avx512.py` |
| `avx512bw` | Skylake-X / Cascade Lake without VNNI use | `vpmaddubsw` + `vpmaddwd`, 512-bit | `x86/avx512.py` |
| `avxvnni` | Alder Lake+, Sierra Forest (AVX2 + VEX VNNI) | `vpdpbusd` + `vpackssdw` + `vpdpwssd`, 256-bit | `x86/avx2.py` |
| `avx2` | Haswell+, Zen 1-3: the floor Lambda promises on x86 | `vpmaddubsw` + `vpmaddwd`, 256-bit | `x86/avx2.py` |
| `neon-i8mm` | Graviton3/4 (Neoverse V1/V2): dotprod + i8mm | `sdot` rows, `smmla` tiles (low-bit: `sdot`) | `arm/neon.py`, `arm/x4.py`, `arm/tiles.py`, `arm/lowbit.py` |
| `neon-dotprod` | Graviton2 (Neoverse N1): Armv8.2 + dotprod | `sdot` rows and tiles | `arm/neon.py`, `arm/x4.py`, `arm/tiles.py`, `arm/lowbit.py` |
| `portable` | arm64 without dot products, older x86 | float kernels, dequantize + BLAS | `float_kernels.py`, `lowbit_kernels.py` |

Which format runs which kernel on each level is its traits row (engine/quant/traits.py, with the
table of files per format).

engine/quant/choice.py's `kernel_paths()` is what the init log line and the bench receipt print:
`{"Q4_K": {"decode": "avx2-int8", "prefill": "avx512vnni-int8"}, ...}`. This module imports no
kernel file: the ISA files, traits.py and the dispatchers read it.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

import numpy as np

X86 = {"x86_64", "AMD64"}
ARM = {"aarch64", "arm64"}


class Level(StrEnum):
    """An instruction-set level (the table above), chosen once per process by `Target.level`.
    A str: logs, receipts and the cache's cpu.json carry its name."""

    AVX512VNNI = "avx512vnni"
    AVX512BW = "avx512bw"
    AVXVNNI = "avxvnni"
    AVX2 = "avx2"
    NEON_I8MM = "neon-i8mm"
    NEON_DOTPROD = "neon-dotprod"
    PORTABLE = "portable"

    @property
    def is_arm(self) -> bool:
        """arm64 with dot products: arm/neon.py's and arm/lowbit.py's kernels."""
        return self in (Level.NEON_I8MM, Level.NEON_DOTPROD)

    @property
    def is_x86_int8(self) -> bool:
        """An x86 level with integer kernels (x86/avx2.py / x86/avx512.py, x86/lowbit.py)."""
        return self in (Level.AVX512VNNI, Level.AVX512BW, Level.AVXVNNI, Level.AVX2)

    @property
    def is_avx512(self) -> bool:
        return self in (Level.AVX512VNNI, Level.AVX512BW)

    @property
    def vnni(self) -> bool:
        """`vpdpbusd` (VEX or EVEX) instead of `vpmaddubsw` + `vpmaddwd`."""
        return self in (Level.AVX512VNNI, Level.AVXVNNI)

    @property
    def vector_bytes(self) -> int:
        """The integer tiles' vector width: 64 on the AVX-512 levels, else 32."""
        return 64 if self.is_avx512 else 32

    @property
    def q8_0_dtype(self) -> type:
        """Q8_0's integer rows' activation dtype: int8 for arm64's `sdot`, int16 elsewhere
        (int8_dot's x86 rows multiply them in `vpmaddwd` pairs)."""
        return np.int8 if self.is_arm else np.int16


# NUMBA_CPU_FEATURES="" (how tests/arm64 and function/numba_cache.py pin a Graviton target) means
# "the named CPU's own features" to LLVM, so the features are read from the name: LLVM's
# AArch64 processor table (AArch64Processors.td) for the CPUs Lambda runs on and their siblings.
ARM_CPU_FEATURES = {
    "neoverse-n1": ("neon", "dotprod"), "cortex-a76": ("neon", "dotprod"), "ares": ("neon", "dotprod"),
    "neoverse-v1": ("neon", "dotprod", "i8mm", "sve", "bf16"),
    "neoverse-v2": ("neon", "dotprod", "i8mm", "sve", "sve2", "bf16"),
    "neoverse-n2": ("neon", "dotprod", "i8mm", "sve", "sve2", "bf16"),
    "neoverse-v3": ("neon", "dotprod", "i8mm", "sve", "sve2", "bf16"),
}

# x86-64-v3 (what "held to AVX2" means, and the x86 floor Lambda promises): for
# NUMBA_CPU_FEATURES in the benchmark and the AVX2 tests; every other host feature is turned off.
X86_64_V3 = ("64bit", "cmov", "cx8", "cx16", "fxsr", "mmx", "sahf", "sse", "sse2", "sse3", "ssse3", "sse4.1",
             "sse4.2", "crc32", "popcnt", "avx", "avx2", "bmi", "bmi2", "fma", "f16c", "lzcnt", "movbe", "xsave")

# the x86_64 image's AVX-512 level (function/numba_cache.py X86_LEVELS): LLVM's cascadelake,
# whose features Cascade Lake, Ice Lake, Sapphire/Emerald Rapids and Zen 4/5 all have
X86_CASCADELAKE = X86_64_V3 + ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512vnni")

# NUMBA_CPU_FEATURES="" on x86_64: the image levels' features, as for ARM above
X86_CPU_FEATURES = {"x86-64-v3": X86_64_V3, "cascadelake": X86_CASCADELAKE}

@dataclass(frozen=True)
class Target:
    machine: str
    cpu_name: str
    features: frozenset[str]

    def has(self, *names: str) -> bool:
        return all(n in self.features for n in names)

    @property
    def level(self) -> Level:
        """The one place the level is chosen, from the features numba compiles for."""
        if self.machine in ARM:
            if self.has("dotprod", "i8mm"):
                return Level.NEON_I8MM
            return Level.NEON_DOTPROD if self.has("dotprod") else Level.PORTABLE
        if self.machine not in X86 or not self.has("avx2", "fma", "f16c"):
            return Level.PORTABLE
        if self.has("avx512bw", "avx512vl", "avx512vnni"):
            return Level.AVX512VNNI
        if self.has("avx512bw", "avx512vl"):
            return Level.AVX512BW
        if self.has("avxvnni"):
            return Level.AVXVNNI
        return Level.AVX2

    @property
    def vector_bytes(self) -> int:
        """The integer tiles' vector width: 64 on the AVX-512 levels, else 32."""
        return self.level.vector_bytes


def features_flag_string(enabled: tuple[str, ...]) -> str:
    """A NUMBA_CPU_FEATURES value that turns on `enabled` and off every other host feature."""
    import llvmlite.binding as llvm

    host = llvm.get_host_cpu_features()
    names = sorted(set(host) | set(enabled))
    return ",".join(("+" if n in enabled else "-") + n for n in names)


@cache
def target() -> Target:
    """The CPU numba compiles for in this process (fixed once numba has read its config)."""
    from numba.core import config

    import llvmlite.binding as llvm

    name = config.CPU_NAME or llvm.get_host_cpu_name()
    flat = config.CPU_FEATURES
    if flat is None:
        flat = llvm.get_host_cpu_features().flatten()
    feats = frozenset(f[1:] for f in flat.split(",") if f.startswith("+"))
    machine = platform.machine()
    if machine in ARM and not flat.strip():
        feats = frozenset(ARM_CPU_FEATURES.get(name, ()))
    if machine in X86 and not flat.strip():
        # the x86_64 image's cache target (Dockerfile cpu.json: x86-64-v3, features ""): LLVM
        # compiles for the name's own features, AVX2 + FMA + F16C; read as no features at all, it
        # put the image on the portable float kernels (a 9B IQ4_XS warm-up dequantized every
        # matrix: 36 s of ready time)
        feats = frozenset(X86_CPU_FEATURES.get(name, ()))
    return Target(machine, name, feats)


def summary() -> dict:
    t = target()
    return {"machine": t.machine, "cpu_name": t.cpu_name, "level": str(t.level)}
