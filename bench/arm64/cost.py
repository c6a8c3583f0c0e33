"""The cost model of `make bench-arm64`: instruction counts by class → estimated cycles on Graviton.

Each class of `insn_decode.h` gets a reciprocal throughput (cycles per instruction when the
pipes it issues to are kept busy) and the pipe group it occupies, per Neoverse core. Two
estimates per phase:

* `serial_cycles` = Σ count × reciprocal throughput, the issue's definition: every class as if
  it had the core to itself (no overlap between the vector, load/store, integer and branch
  pipes), an upper estimate of a throughput-bound run;
* `bound_cycles` = the busiest pipe group: max over groups of Σ (count × reciprocal throughput)
  within the group, and the decode width (instructions / decode per cycle), the lower estimate.

Neither models latency chains, cache or memory stalls, or branch mispredictions: a memory-bound
decode step on a real Graviton takes longer than either, on both engines.

Sources. The figures are Arm's Neoverse N1 and V1 Software Optimization Guides ("Arm Neoverse
N1 Software Optimization Guide", "Arm Neoverse V1 Software Optimization Guide", section 3,
"Instruction characteristics", the tables per instruction group) as transcribed into LLVM's
scheduling models, which cite those guides as their references:
`llvm/lib/Target/AArch64/AArch64SchedNeoverseN1.td` and `AArch64SchedNeoverseV1.td`
(llvm-project main, read 2026-12-02). The guides' PDFs themselves were not reachable from this
workplace, so each row names the guide's instruction-group row and the LLVM write type
(`N1Write_<latency>c_<uops><pipe>`: e.g. `N1Write_2c_1V` = one micro-op on either of the two
FP/ASIMD pipes V0/V1 → 2 per cycle → 0.5 cycles). Rows marked ASSUMPTION have no single figure
in either table (a class that mixes several rows, or no row); the note says what was assumed.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The order of insn_decode.h's enum and the plugin's JSON "classes".
CLASSES: tuple[str, ...] = (
    "int_dot", "fp_fma", "sve_int_dot", "sve_fp_fma", "simd_mul_q", "simd_mul", "simd_cvt_q", "simd_cvt",
    "simd_shift", "simd", "sve", "load", "store", "scalar", "branch", "other")
GROUPS: tuple[str, ...] = ("vector", "load_store", "integer", "branch")


@dataclass(frozen=True)
class Row:
    recip: float  # cycles per instruction at full throughput
    group: str    # the pipe group it issues to (GROUPS)
    source: str   # the guide's row / LLVM write type, or ASSUMPTION and why


@dataclass(frozen=True)
class Core:
    name: str
    guide: str
    decode_width: int
    decode_source: str
    rows: Mapping[str, Row] = field(default_factory=dict)


N1 = Core(
    name="neoverse-n1", guide="Arm Neoverse N1 Software Optimization Guide (via LLVM AArch64SchedNeoverseN1.td)",
    decode_width=4,
    decode_source="ASSUMPTION: 4 instructions decoded per cycle (the N1 guide's pipeline overview as quoted by "
                  "wikichip, the LLVM model's second reference; LLVM's IssueWidth 8 is the micro-op dispatch rate)",
    rows={
        # 2 FP/ASIMD pipes (N1UnitV0, N1UnitV1)
        "int_dot": Row(0.5, "vector", "ASSUMPTION: ASIMD dot product SDOT/UDOT on V0/V1, 2 per cycle. LLVM's N1 "
                                      "model has no SDOT row, so this is its basic ASIMD rate (WriteVq = "
                                      "N1Write_2c_1V), the rate docs/arm64.md attributes to the guide's dot product "
                                      "row; not checked against the PDF here. N1 has no i8mm"),
        "fp_fma": Row(0.5, "vector", "ASIMD FP multiply accumulate FML[AS]v and FP multiply accumulate "
                                     "FN?M(ADD|SUB): N1Write_4c_1V"),
        "sve_int_dot": Row(0.5, "vector", "ASSUMPTION: N1 has no SVE (an SVE instruction is SIGILL; qemu runs "
                                          "neoverse-n1 without SVE, so the count is 0)"),
        "sve_fp_fma": Row(0.5, "vector", "ASSUMPTION: N1 has no SVE (count 0)"),
        "simd_mul_q": Row(2.0, "vector", "ASIMD multiply / multiply accumulate, Q-form: N1Write_5c_2V0 (two "
                                         "micro-ops on V0 alone)"),
        "simd_mul": Row(1.0, "vector", "ASIMD multiply (accumulate), D-form; multiply (accumulate) long: "
                                       "N1Write_4c_1V0"),
        "simd_cvt_q": Row(2.0, "vector", "ASIMD FP convert, other, Q-form F32 (and D-form F16): N1Write_4c_2V0; "
                                         "ASSUMPTION: Q-form F64 (N1Write_3c_1V0, 1 cycle) counted at 2"),
        "simd_cvt": Row(1.0, "vector", "ASIMD FP convert, D-form F32 / long / narrow F32<->F64: N1Write_3c_1V0"),
        "simd_shift": Row(1.0, "vector", "ASIMD shift by immed / by register, basic and complex; shift "
                                         "accumulate: N1Write_2c_1V1 / N1Write_4c_1V1 (V1 alone)"),
        "simd": Row(0.5, "vector", "ASIMD arith basic, logical, compare, permute, FP arith/multiply: WriteVq = "
                                   "N1Write_2c_1V, FMUL N1Write_3c_1V. ASSUMPTION: the class's other rows "
                                   "(reductions, TBL with 3-4 registers, INS from a GPR) are taken at this rate"),
        "sve": Row(0.5, "vector", "ASSUMPTION: N1 has no SVE (count 0)"),
        # 2 load/store pipes (N1UnitL), 2 store-data pipes (N1UnitD)
        "load": Row(0.5, "load_store", "Load register / vector register / pair: N1Write_4c_1L .. N1Write_7c_1I_1L, "
                                       "one L micro-op, 2 per cycle; ASIMD LD1 of 2-4 registers counted as one"),
        "store": Row(0.5, "load_store", "Store register: N1Write_1c_1L_1D, 2 per cycle. ASSUMPTION: Q-form vector "
                                        "stores (N1Write_2c_2L_2V, 1 per cycle) taken at this rate"),
        # 3 integer pipes (2 single-cycle S + 1 multi-cycle M)
        "scalar": Row(1 / 3, "integer", "ALU basic, logical, shift, move: N1Write_1c_1I (N1UnitI = 2 S + 1 M). "
                                        "ASSUMPTION: multiply/divide/extend-and-shift (M only) taken at this rate"),
        "branch": Row(1.0, "branch", "Branch immed / register, compare and branch: N1Write_1c_1B (1 branch pipe)"),
        "other": Row(1.0, "integer", "ASSUMPTION: system instructions, hints, barriers, SVC: 1 cycle each (no "
                                     "throughput row); the phases execute few"),
    })

V1 = Core(
    name="neoverse-v1", guide="Arm Neoverse V1 Software Optimization Guide (via LLVM AArch64SchedNeoverseV1.td)",
    decode_width=5,
    decode_source="ASSUMPTION: 5 instructions decoded per cycle (wikichip's V1 page, a reference of the LLVM "
                  "model; the macro-op cache delivers up to 8)",
    rows={
        # 4 FP/ASIMD pipes V0-V3 (128-bit); SVE's 256-bit operations use V0/V1 (V1UnitV01)
        "int_dot": Row(0.25, "vector", "ASIMD dot product ([SU]|SU|US)DOT: V1Wr_VDOT on V1UnitV (V0-V3), and "
                                       "ASIMD matrix multiply-accumulate SMMLA/UMMLA/USMMLA: V1Wr_VMMA on V1UnitV"),
        "fp_fma": Row(0.25, "vector", "ASIMD FP multiply accumulate FML[AS]v: V1Wr_FPMA on V1UnitV; FP multiply "
                                      "accumulate (scalar): V1Wr_FMA on V1UnitV"),
        "sve_int_dot": Row(0.5, "vector", "SVE dot product, 8 bit: V1Wr_ZDOTB on V1UnitV01; SVE matrix "
                                          "multiply-accumulate: V1Wr_ZMMA on V1UnitV01. ASSUMPTION: USDOT/SUDOT "
                                          "(V1Wr_ZUDOTB, 4 pipes) and 16-bit dot (V0 only) taken at this rate"),
        "sve_fp_fma": Row(0.5, "vector", "SVE floating point multiply accumulate: V1Wr_ZFMA on V1UnitV01"),
        "simd_mul_q": Row(0.5, "vector", "ASIMD multiply: V1Write_4c_1V02; multiply accumulate: V1Wr_VMA on V1UnitV02"),
        "simd_mul": Row(0.5, "vector", "ASIMD multiply long: V1Write_3c_1V02; multiply accumulate long: V1Wr_VMAL "
                                       "on V1UnitV02"),
        "simd_cvt_q": Row(1.0, "vector", "ASIMD FP convert, other, D-form F16 and Q-form F32: V1Write_4c_2V02 (two "
                                         "micro-ops on V0/V2)"),
        "simd_cvt": Row(0.5, "vector", "ASIMD FP convert, other, D-form F32 and Q-form F64 / long / narrow: "
                                       "V1Write_3c_1V02"),
        "simd_shift": Row(0.5, "vector", "ASIMD shift by immed / register, basic and complex: V1Write_2c_1V13 / "
                                         "V1Write_4c_1V13; shift accumulate V1Wr_VSA on V1UnitV13"),
        "simd": Row(0.25, "vector", "ASIMD arith basic, logical, compare, permute: WriteVq = V1Write_2c_1V (4 "
                                    "pipes). ASSUMPTION: the class's 2-pipe rows (reductions V13, TBL V01) taken at "
                                    "this rate"),
        "sve": Row(0.5, "vector", "SVE integer arithmetic basic, logical, permutes, FP arithmetic: V1Write_2c_1V01. "
                                  "ASSUMPTION: SVE shifts (V1 alone), converts and reductions taken at this rate"),
        # 3 load pipes (2 load/store L01 + 1 load-only L2), 2 store-data pipes
        "load": Row(1 / 3, "load_store", "Load register / ASIMD load, 1 register: V1Write_4c_1L / V1Write_6c_1L on "
                                         "V1UnitL (L01 + L2). ASSUMPTION: SVE loads (V1Write_6c_1L01, 2 pipes) taken "
                                         "at this rate"),
        "store": Row(0.5, "load_store", "Store register: V1Write_1c_1L01_1D; store vector register: "
                                        "V1Write_2c_1L01_1V01 (L01: 2 per cycle)"),
        # 4 integer pipes (2 S + M0 + M1)
        "scalar": Row(0.25, "integer", "ALU basic, logical, shift, move: V1Write_1c_1I (V1UnitI = 2 S + M0 + M1). "
                                       "ASSUMPTION: M-only operations taken at this rate"),
        "branch": Row(0.5, "branch", "Branch immed / register: V1Write_1c_1B (2 branch pipes)"),
        "other": Row(1.0, "integer", "ASSUMPTION: system instructions, hints, barriers, SVC: 1 cycle each"),
    })

CORES: dict[str, Core] = {c.name: c for c in (N1, V1)}


@dataclass(frozen=True)
class Estimate:
    instructions: int
    serial_cycles: float
    bound_cycles: float
    bound_by: str                  # the group (or "decode") that sets bound_cycles
    by_class: dict[str, float]     # serial cycles per class


def estimate(counts: Mapping[str, int], core: Core) -> Estimate:
    """Cycles of one phase from its per-class instruction counts."""
    unknown = set(counts) - set(CLASSES)
    if unknown:
        raise ValueError(f"counts: unknown classes {sorted(unknown)}; the plugin's classes are {CLASSES}")
    by_class = {c: counts.get(c, 0) * core.rows[c].recip for c in CLASSES}
    groups = {g: sum(v for c, v in by_class.items() if core.rows[c].group == g) for g in GROUPS}
    n = sum(counts.values())
    groups["decode"] = n / core.decode_width
    bound_by = max(groups, key=lambda g: groups[g])
    return Estimate(n, sum(by_class.values()), groups[bound_by], bound_by, by_class)


def phase_counts(plugin: Mapping, phases: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per-phase counts from the plugin's JSON: the differences between consecutive marks 0, 1, … .
    `phases[i]` names the span from mark i to mark i + 1."""
    if tuple(plugin["classes"]) != CLASSES:
        raise ValueError(f"plugin classes {plugin['classes']} differ from cost.CLASSES {CLASSES}: rebuild "
                         "insn_classes.so (python -m bench.arm64.build)")
    marks = sorted(plugin["marks"], key=lambda m: m["phase"])
    if [m["phase"] for m in marks] != list(range(len(phases) + 1)):
        raise ValueError(f"marks {[m['phase'] for m in marks]}: expected phases 0..{len(phases)} (did the program "
                         "finish? a run under another plugin or without markers has none)")
    out = {}
    for i, name in enumerate(phases):
        a, b = marks[i]["counts"], marks[i + 1]["counts"]
        out[name] = {c: int(b[k] - a[k]) for k, c in enumerate(CLASSES)}
    return out


def compare(ours: Mapping[str, int], llama: Mapping[str, int], core: Core) -> dict:
    """One phase on one core: both sides' estimates and ours ÷ llama.cpp."""
    a, b = estimate(ours, core), estimate(llama, core)

    def ratio(x: float, y: float) -> float | None:
        return round(x / y, 3) if y else None

    def side(e: Estimate, counts: Mapping[str, int]) -> dict:
        top = sorted(e.by_class.items(), key=lambda kv: -kv[1])[:4]
        return {"instructions": e.instructions, "serial_cycles": round(e.serial_cycles),
                "bound_cycles": round(e.bound_cycles), "bound_by": e.bound_by,
                "counts": dict(counts), "top_classes": [[c, round(v / e.serial_cycles, 3) if e.serial_cycles else 0]
                                                        for c, v in top]}

    return {"ours": side(a, ours), "llama": side(b, llama),
            "ratio_instructions": ratio(a.instructions, b.instructions),
            "ratio_serial_cycles": ratio(a.serial_cycles, b.serial_cycles),
            "ratio_bound_cycles": ratio(a.bound_cycles, b.bound_cycles)}
