"""Which kernel multiplies each weight format on this CPU, decided once per process and said.

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

Q2_K, Q3_K, Q5_K, IQ4_XS, IQ4_NL and IQ3_S (`X86_LOWBIT_INT8`) have integer decode rows and
short-prefill tiles on the x86 levels, the same AVX2 instructions on each (`x86/lowbit.py`,
named `avx2-int8`), except IQ4_XS's, Q3_K's and Q5_K's on avx512vnni (`X86_LOWBIT_VNNI512`:
the panel tiles, 512-bit `vpdpbusd`, named `avx512vnni-int8`, for prefills of every length, Intel's
and AMD's); the others' long prefills run the tiles where Q4_K's do (Zen with AVX-512), else
dequantize + BLAS. On arm64 with dot products Q2_K, Q3_K, IQ4_XS, IQ4_NL and IQ3_S
(`ARM_LOWBIT_INT8`) have `sdot` decode rows and tiles (`arm/lowbit.py`, named `neon-dotprod-int8`
for decode and for prefills of every length, V1/V2 included: no `smmla` tile for them yet), as
Q4_K/Q5_K/Q6_K/Q8_0 have in `arm/neon.py`. IQ3_XXS is float rows / dequantize + BLAS everywhere.

engine/quant/choice.py's `kernel_paths()` is what the init log line and the bench receipt print:
`{"Q4_K": {"decode": "avx2-int8", "prefill": "avx512vnni-int8"}, ...}`. This module imports no
kernel file: the ISA files and the dispatchers read it.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

from gguf import GGMLQuantizationType as T

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

INT8_FORMATS = (T.Q4_K, T.Q6_K, T.Q8_0)        # row kernels (decode) and tiles (prefill)
# x86/lowbit.py's rows and short-prefill tiles (every x86 level): long prefills dequantize + BLAS
# (but X86_LOWBIT_VNNI512's on avx512vnni)
X86_LOWBIT_INT8 = (T.Q2_K, T.Q3_K, T.IQ4_XS, T.IQ4_NL, T.IQ3_S, T.Q5_K)
# of those, the formats with panel tiles (512-bit `vpdpbusd`, every prompt length) on avx512vnni
# (x86/lowbit.py, after the AVX2 code; lowbit_kernels.PANEL)
X86_LOWBIT_VNNI512 = (T.IQ4_XS, T.Q3_K, T.Q5_K)
ARM_INT8_FORMATS = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0)  # arm/neon.py's rows and tiles
ARM_LOWBIT_INT8 = (T.Q2_K, T.Q3_K, T.IQ4_XS, T.IQ4_NL, T.IQ3_S)  # arm/lowbit.py's `sdot` rows and tiles
TILE_FORMATS = (T.Q4_K, T.Q6_K)                 # per-ISA tiles; Q8_0's tile is portable IR
SMMLA_FORMATS = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0)  # arm/neon.py's `smmla` tiles on neon-i8mm
X4_FORMATS = (T.Q4_K, T.Q6_K)  # arm/neon.py's rows and tiles over 4 rows interleaved (repack_x4)


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


def has_int8(qtype) -> bool:
    """Whether `qtype`'s products run in integer arithmetic here: decode rows, and the tiles of
    the formats that have them (X86_LOWBIT_INT8: decode rows only)."""
    level = target().level
    formats = ARM_INT8_FORMATS + ARM_LOWBIT_INT8 if level.is_arm else INT8_FORMATS + X86_LOWBIT_INT8
    return T(qtype) in formats and level != Level.PORTABLE


def x4_layout(qtype) -> bool:
    """Whether `qtype`'s integer kernels here take its weights repacked 4 rows interleaved
    (arm.x4.repack_x4, once per matrix when MatvecPlan is built): X4_FORMATS on the arm64 int8
    levels. The kernel names say so with an `x4` suffix."""
    return target().level.is_arm and has_int8(qtype) and T(qtype) in X4_FORMATS


def tile_level(qtype) -> Level:
    """The level whose instructions `qtype`'s multi-token tile runs: arm64's i8mm targets run
    `smmla` tiles for SMMLA_FORMATS, `sdot` ones for any other format."""
    level = target().level
    if level == Level.NEON_I8MM:
        return level if T(qtype) in SMMLA_FORMATS else Level.NEON_DOTPROD
    if level == Level.AVX512VNNI and T(qtype) in X86_LOWBIT_VNNI512:
        return level
    if level.is_x86_int8 and T(qtype) in X86_LOWBIT_INT8:
        return Level.AVX2  # x86/lowbit.py's tiles: AVX2 instructions on every other x86 level
    return level


def summary() -> dict:
    t = target()
    return {"machine": t.machine, "cpu_name": t.cpu_name, "level": str(t.level)}
