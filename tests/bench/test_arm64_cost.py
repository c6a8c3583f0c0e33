"""bench/arm64 without qemu: the plugin's instruction classifier (insn_decode.h) on assembled A64
words, and the cost model's arithmetic (bench/arm64/cost.py)."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.arm64 import cost

HERE = Path(__file__).resolve().parents[2] / "bench" / "arm64"

# (word, class, instruction): the words are aarch64-linux-gnu-as 2.40's encodings
# (-march=armv8.6-a+sve+i8mm+dotprod+fp16+lse+fp16fml+crypto); test_words_are_what_the_assembler_emits
# re-assembles them where that assembler is installed.
WORDS = [
    (0x4e829420, "int_dot", "sdot v0.4s, v1.16b, v2.16b"),
    (0x2e859483, "int_dot", "udot v3.2s, v4.8b, v5.8b"),
    (0x4fa2e820, "int_dot", "sdot v0.4s, v1.16b, v2.4b[3]"),
    (0x6fa2e020, "int_dot", "udot v0.4s, v1.16b, v2.4b[1]"),
    (0x4e829c20, "int_dot", "usdot v0.4s, v1.16b, v2.16b"),
    (0x4f82f820, "int_dot", "usdot v0.4s, v1.16b, v2.4b[2]"),
    (0x4f02f820, "int_dot", "sudot v0.4s, v1.16b, v2.4b[2]"),
    (0x4e82a420, "int_dot", "smmla v0.4s, v1.16b, v2.16b"),
    (0x6e82a420, "int_dot", "ummla v0.4s, v1.16b, v2.16b"),
    (0x4e82ac20, "int_dot", "usmmla v0.4s, v1.16b, v2.16b"),
    (0x44820020, "sve_int_dot", "sdot z0.s, z1.b, z2.b"),
    (0x44c20420, "sve_int_dot", "udot z0.d, z1.h, z2.h"),
    (0x44aa0020, "sve_int_dot", "sdot z0.s, z1.b, z2.b[1]"),
    (0x44827820, "sve_int_dot", "usdot z0.s, z1.b, z2.b"),
    (0x45029820, "sve_int_dot", "smmla z0.s, z1.b, z2.b"),
    (0x45c29820, "sve_int_dot", "ummla z0.s, z1.b, z2.b"),
    (0x45829820, "sve_int_dot", "usmmla z0.s, z1.b, z2.b"),
    (0x4e22cc20, "fp_fma", "fmla v0.4s, v1.4s, v2.4s"),
    (0x4ee2cc20, "fp_fma", "fmls v0.2d, v1.2d, v2.2d"),
    (0x4e420c20, "fp_fma", "fmla v0.8h, v1.8h, v2.8h"),
    (0x0ec20c20, "fp_fma", "fmls v0.4h, v1.4h, v2.4h"),
    (0x4fa21820, "fp_fma", "fmla v0.4s, v1.4s, v2.s[3]"),
    (0x4fc25820, "fp_fma", "fmls v0.2d, v1.2d, v2.d[1]"),
    (0x4f321820, "fp_fma", "fmla v0.8h, v1.8h, v2.h[7]"),
    (0x1f020c20, "fp_fma", "fmadd s0, s1, s2, s3"),
    (0x1f628c20, "fp_fma", "fnmsub d0, d1, d2, d3"),
    (0x65a20020, "sve_fp_fma", "fmla z0.s, p0/m, z1.s, z2.s"),
    (0x65a28020, "sve_fp_fma", "fmad z0.s, p0/m, z1.s, z2.s"),
    (0x65e26420, "sve_fp_fma", "fnmls z0.d, p1/m, z1.d, z2.d"),
    (0x64aa0020, "sve_fp_fma", "fmla z0.s, z1.s, z2.s[1]"),
    (0x6e22dc20, "simd", "fmul v0.4s, v1.4s, v2.4s"),
    (0x4e22d420, "simd", "fadd v0.4s, v1.4s, v2.4s"),
    (0x4ea29420, "simd_mul_q", "mla v0.4s, v1.4s, v2.4s"),
    (0x0e22c020, "simd_mul", "smull v0.8h, v1.8b, v2.8b"),
    (0x4eb1b820, "simd", "addv s0, v1.4s"),
    (0x1e380020, "simd", "fcvtzs w0, s1"),
    (0x1e222820, "simd", "fadd s0, s1, s2"),
    (0x4e21d820, "simd_cvt_q", "scvtf v0.4s, v1.4s"),
    (0x4e020020, "simd", "tbl v0.16b, {v1.16b}, v2.16b"),
    (0x04a20020, "sve", "add z0.s, z1.s, z2.s"),
    (0x65808020, "sve", "fadd z0.s, p0/m, z0.s, z1.s"),
    (0xa540a000, "load", "ld1w {z0.s}, p0/z, [x0]"),
    (0xa4014000, "load", "ld1b {z0.b}, p0/z, [x0, x1]"),
    (0x85804000, "load", "ldr z0, [x0]"),
    (0xe540e000, "store", "st1w {z0.s}, p0, [x0]"),
    (0xe5804000, "store", "str z0, [x0]"),
    (0x4c407000, "load", "ld1 {v0.16b}, [x0]"),
    (0x4cdfa000, "load", "ld1 {v0.16b, v1.16b}, [x0], #32"),
    (0x4c007000, "store", "st1 {v0.16b}, [x0]"),
    (0x3dc00000, "load", "ldr q0, [x0]"),
    (0x3d800400, "store", "str q0, [x0, #16]"),
    (0xfc616800, "load", "ldr d0, [x0, x1]"),
    (0xbc004400, "store", "str s0, [x0], #4"),
    (0xad400400, "load", "ldp q0, q1, [x0]"),
    (0xad010400, "store", "stp q0, q1, [x0, #32]"),
    (0xf9400020, "load", "ldr x0, [x1]"),
    (0x39400420, "load", "ldrb w0, [x1, #1]"),
    (0xb9800020, "load", "ldrsw x0, [x1]"),
    (0x38e26820, "load", "ldrsb w0, [x1, x2]"),
    (0xf9000020, "store", "str x0, [x1]"),
    (0x38001420, "store", "strb w0, [x1], #1"),
    (0xa94007e0, "load", "ldp x0, x1, [sp]"),
    (0xa9bf7bfd, "store", "stp x29, x30, [sp, #-16]!"),
    (0x580003e0, "load", "ldr x0, label"),
    (0xf9800000, "load", "prfm pldl1keep, [x0]"),
    (0xf9808000, "load", "prfm pldl1keep, [x0, #256]"),
    (0xc85f7c20, "load", "ldxr x0, [x1]"),
    (0xc8027c20, "store", "stxr w2, x0, [x1]"),
    (0xc8dffc20, "load", "ldar x0, [x1]"),
    (0xc89ffc20, "store", "stlr x0, [x1]"),
    (0xf8200041, "store", "ldadd x0, x1, [x2]"),
    (0x4d40c800, "load", "ld1r {v0.4s}, [x0]"),
    (0x0d409000, "load", "ld1 {v0.s}[1], [x0]"),
    (0x0d009000, "store", "st1 {v0.s}[1], [x0]"),
    (0x91000420, "scalar", "add x0, x1, #1"),
    (0x8b020020, "scalar", "add x0, x1, x2"),
    (0x9b027c20, "scalar", "mul x0, x1, x2"),
    (0x9b020c20, "scalar", "madd x0, x1, x2, x3"),
    (0xd37df020, "scalar", "lsl x0, x1, #3"),
    (0xd2800020, "scalar", "movz x0, #1"),
    (0x90000000, "scalar", "adrp x0, label"),
    (0x9a820020, "scalar", "csel x0, x1, x2, eq"),
    (0x1400000c, "branch", "b label"),
    (0x9400000b, "branch", "bl label"),
    (0x54000141, "branch", "b.ne label"),
    (0xb4000120, "branch", "cbz x0, label"),
    (0x37180100, "branch", "tbnz w0, #3, label"),
    (0xd61f0000, "branch", "br x0"),
    (0xd63f0000, "branch", "blr x0"),
    (0xd65f03c0, "branch", "ret"),
    (0xd503201f, "other", "nop"),
    (0xd5033bbf, "other", "dmb ish"),
    (0xd4000001, "other", "svc #0"),
    (0xd53bd040, "other", "mrs x0, tpidr_el0"),
    (0x4ea29c20, "simd_mul_q", "mul v0.4s, v1.4s, v2.4s"),
    (0x0ea29c20, "simd_mul", "mul v0.2s, v1.2s, v2.2s"),
    (0x4e629420, "simd_mul_q", "mla v0.8h, v1.8h, v2.8h"),
    (0x2e629420, "simd_mul", "mls v0.4h, v1.4h, v2.4h"),
    (0x6e229c20, "simd", "pmul v0.16b, v1.16b, v2.16b"),
    (0x4fa28020, "simd_mul_q", "mul v0.4s, v1.4s, v2.s[1]"),
    (0x6fa20020, "simd_mul_q", "mla v0.4s, v1.4s, v2.s[1]"),
    (0x2fa24020, "simd_mul", "mls v0.2s, v1.2s, v2.s[1]"),
    (0x0e22c020, "simd_mul", "smull v0.8h, v1.8b, v2.8b"),
    (0x6e628020, "simd_mul", "umlal2 v0.4s, v1.8h, v2.8h"),
    (0x0f52a020, "simd_mul", "smull v0.4s, v1.4h, v2.h[1]"),
    (0x4ea2b420, "simd_mul", "sqdmulh v0.4s, v1.4s, v2.4s"),
    (0x4e21d820, "simd_cvt_q", "scvtf v0.4s, v1.4s"),
    (0x2e21d820, "simd_cvt", "ucvtf v0.2s, v1.2s"),
    (0x4ea1b820, "simd_cvt_q", "fcvtzs v0.4s, v1.4s"),
    (0x4e21a820, "simd_cvt_q", "fcvtns v0.4s, v1.4s"),
    (0x4f3de420, "simd_cvt_q", "scvtf v0.4s, v1.4s, #3"),
    (0x0e217820, "simd_cvt", "fcvtl v0.4s, v1.4h"),
    (0x0e216820, "simd_cvt", "fcvtn v0.4h, v1.4s"),
    (0x6f0c0420, "simd_shift", "ushr v0.16b, v1.16b, #4"),
    (0x4f225420, "simd_shift", "shl v0.4s, v1.4s, #2"),
    (0x0f08a420, "simd_shift", "sshll v0.8h, v1.8b, #0"),
    (0x2f08a420, "simd_shift", "uxtl v0.8h, v1.8b"),
    (0x0f0c8420, "simd_shift", "shrn v0.8b, v1.8h, #4"),
    (0x6f3d1420, "simd_shift", "usra v0.4s, v1.4s, #3"),
    (0x4ea24420, "simd_shift", "sshl v0.4s, v1.4s, v2.4s"),
    (0x6e224420, "simd_shift", "ushl v0.16b, v1.16b, v2.16b"),
    (0x4f00e5e0, "simd", "movi v0.16b, #0x0f"),
    (0x4f000400, "simd", "movi v0.4s, #0"),
    (0x4e221c20, "simd", "and v0.16b, v1.16b, v2.16b"),
    (0x4ea28420, "simd", "add v0.4s, v1.4s, v2.4s"),
    (0x4ea2bc20, "simd", "addp v0.4s, v1.4s, v2.4s"),
    (0x4e023820, "simd", "zip1 v0.16b, v1.16b, v2.16b"),
    (0x4e040420, "simd", "dup v0.4s, v1.s[0]"),
    (0x4e040c20, "simd", "dup v0.4s, w1"),
    (0x4f829020, "simd", "fmul v0.4s, v1.4s, v2.s[0]"),
    (0x4e22d420, "simd", "fadd v0.4s, v1.4s, v2.4s"),
    (0x5fa21020, "simd", "fmla s0, s1, v2.s[1]"),
    (0x1e380020, "simd", "fcvtzs w0, s1"),
    (0x1e220020, "simd", "scvtf s0, w1"),
    (0x1e222820, "simd", "fadd s0, s1, s2"),
    (0x7e30d820, "simd", "faddp s0, v1.2s"),
    (0x4eb1b820, "simd", "addv s0, v1.4s"),
    (0x0e0c3c20, "simd", "mov w0, v1.s[1]"),
    (0x4e0c1c20, "simd", "ins v0.s[1], w1"),
    (0x6e024020, "simd", "ext v0.16b, v1.16b, v2.16b, #8"),
    (0x4e020020, "simd", "tbl v0.16b, {v1.16b}, v2.16b"),
    (0x4e284820, "simd", "aese v0.16b, v1.16b"),
    (0x04a20020, "sve", "add z0.s, z1.s, z2.s"),
    (0x65808020, "sve", "fadd z0.s, p0/m, z0.s, z1.s"),
    (0x65820820, "sve", "fmul z0.s, z1.s, z2.s"),
    (0x659ca020, "sve", "fcvtzs z0.s, p0/m, z1.s"),
    (0x6594a020, "sve", "scvtf z0.s, p0/m, z1.s"),
    (0x2598e3e0, "sve", "ptrue p0.s"),
    (0x25a11c00, "sve", "whilelo p0.s, x0, x1"),
    (0x44aa1820, "sve_int_dot", "usdot z0.s, z1.b, z2.b[1]"),
    (0x44aa1c20, "sve_int_dot", "sudot z0.s, z1.b, z2.b[1]"),
]

HARNESS = r"""
#include <stdio.h>
#include "insn_decode.h"
int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) { for (int i = 0; i < N_CLASSES; i++) puts(class_names[i]); return 0; }
    unsigned w;
    while (scanf("%x", &w) == 1) puts(class_names[insn_class(w)]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def classify(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the classifier harness")
    d = tmp_path_factory.mktemp("insn")
    (d / "h.c").write_text(HARNESS)
    subprocess.run([cc, "-O1", "-Wall", "-Wextra", "-Werror", f"-I{HERE}", str(d / "h.c"), "-o", str(d / "h")],
                   check=True)

    def run(words, names=False):
        args = [str(d / "h")] + (["names"] if names else [])
        r = subprocess.run(args, input="\n".join(f"{w:08x}" for w in words), capture_output=True, text=True,
                           check=True)
        return r.stdout.split()
    return run


def test_classifier_puts_each_known_instruction_in_its_class(classify):
    got = classify([w for w, _, _ in WORDS])
    wrong = [(text, f"{w:08x}", want, g) for (w, want, text), g in zip(WORDS, got) if g != want]
    assert wrong == []
    assert {c for _, c, _ in WORDS} == set(cost.CLASSES)  # every class has a known member


def test_class_order_matches_the_cost_model(classify):
    assert tuple(classify([], names=True)) == cost.CLASSES


def test_words_are_what_the_assembler_emits(tmp_path):
    as_, objdump = shutil.which("aarch64-linux-gnu-as"), shutil.which("aarch64-linux-gnu-objdump")
    if as_ is None or objdump is None:
        pytest.skip("binutils-aarch64-linux-gnu is not installed")
    # the PC-relative words (ADRP, LDR literal, B, BL, B.cond, CBZ, TBNZ) were assembled with
    # `label:` right after the MRS
    texts = [t for _, _, t in WORDS]
    at = texts.index("mrs x0, tpidr_el0") + 1
    src = "\n".join([*texts[:at], "label:", *texts[at:]]) + "\n"
    (tmp_path / "t.s").write_text(src)
    subprocess.run([as_, "-march=armv8.6-a+sve+i8mm+dotprod+fp16+lse+fp16fml+crypto", str(tmp_path / "t.s"),
                    "-o", str(tmp_path / "t.o")], check=True)
    dump = subprocess.run([objdump, "-d", str(tmp_path / "t.o")], capture_output=True, text=True, check=True).stdout
    words = [int(m.group(1), 16) for m in re.finditer(r"^\s+[0-9a-f]+:\s+([0-9a-f]{8})\s", dump, re.M)]
    assert words == [w for w, _, _ in WORDS]


def test_estimate_sums_counts_times_reciprocal_throughput_and_finds_the_busiest_group():
    counts = dict.fromkeys(cost.CLASSES, 0) | {"int_dot": 1000, "load": 400, "scalar": 300, "branch": 100}
    e = cost.estimate(counts, cost.N1)
    # N1: SDOT 0.5, load 0.5, scalar 1/3, branch 1.0
    assert e.instructions == 1800
    assert e.serial_cycles == pytest.approx(500 + 200 + 100 + 100)
    assert (e.bound_by, e.bound_cycles) == ("vector", pytest.approx(500))
    v = cost.estimate(counts, cost.V1)  # V1: SDOT 0.25 on four pipes, load 1/3, scalar 0.25, branch 0.5
    assert v.serial_cycles == pytest.approx(250 + 400 / 3 + 75 + 50)
    assert (v.bound_by, v.bound_cycles) == ("decode", pytest.approx(1800 / 5))  # 5-wide decode binds here


def test_q_form_integer_multiplies_cost_four_times_a_dot_product_on_n1_but_not_on_v1():
    one = dict.fromkeys(cost.CLASSES, 0)
    mul, dot = one | {"simd_mul_q": 1}, one | {"int_dot": 1}
    assert cost.estimate(mul, cost.N1).serial_cycles == 4 * cost.estimate(dot, cost.N1).serial_cycles
    assert cost.estimate(mul, cost.V1).serial_cycles == 2 * cost.estimate(dot, cost.V1).serial_cycles


def test_estimate_rejects_a_class_the_model_does_not_know():
    with pytest.raises(ValueError, match="unknown classes"):
        cost.estimate({"int_dot": 1, "fmla": 2}, cost.N1)


def _plugin(marks):
    return {"classes": list(cost.CLASSES), "mode": "tb",
            "marks": [{"phase": i, "counts": c} for i, c in enumerate(marks)], "total": marks[-1]}


def test_phase_counts_are_the_differences_between_consecutive_marks():
    n = len(cost.CLASSES)
    base = [10] * n
    m1 = [10 + (i == 0) * 500 for i in range(n)]
    m2 = [m1[i] + (i == 11) * 70 for i in range(n)]
    got = cost.phase_counts(_plugin([base, m1, m2]), ("a", "b"))
    assert got["a"]["int_dot"] == 500 and sum(got["a"].values()) == 500
    assert got["b"]["load"] == 70 and sum(got["b"].values()) == 70


def test_phase_counts_name_what_is_wrong_with_the_plugin_output():
    n = len(cost.CLASSES)
    with pytest.raises(ValueError, match="did the program finish"):
        cost.phase_counts(_plugin([[0] * n, [1] * n]), ("a", "b"))
    bad = _plugin([[0] * n, [1] * n]) | {"classes": ["x"] * n}
    with pytest.raises(ValueError, match="rebuild"):
        cost.phase_counts(bad, ("a",))


def test_compare_divides_ours_by_llama():
    zero = dict.fromkeys(cost.CLASSES, 0)
    r = cost.compare(zero | {"int_dot": 300}, zero | {"int_dot": 400}, cost.N1)
    assert r["ratio_instructions"] == 0.75 and r["ratio_serial_cycles"] == 0.75 and r["ratio_bound_cycles"] == 0.75
    assert r["ours"]["top_classes"][0] == ["int_dot", 1.0]


def test_every_core_prices_every_class_and_names_its_source():
    for core in cost.CORES.values():
        assert set(core.rows) == set(cost.CLASSES)
        assert all(r.recip > 0 and r.group in cost.GROUPS and r.source for r in core.rows.values())


def test_run_report_prices_each_phase_of_both_sides_for_the_target():
    from bench.arm64 import run

    n = len(cost.CLASSES)
    dot = cost.CLASSES.index("int_dot")

    def side(per_phase):  # marks 0..3: cumulative int_dot counts, the phases adding per_phase[i]
        marks, total = [], [5] * n
        for i in range(4):
            marks.append(list(total))
            if i < 3:
                total[dot] += per_phase[i]
        return {"info": {}, "plugin": _plugin(marks), "wall_s": 1.0}

    rep = run.report("neoverse-v1", {"ours": side([100, 400, 30]), "llama": side([200, 400, 60])})
    assert [rep["phases"][p]["ratio_serial_cycles"] for p in run.PHASES] == [0.5, 1.0, 0.5]
    assert rep["phases"]["prefill_p2"]["ours"]["serial_cycles"] == 100  # 400 ASIMD dots at 0.25 on V1
    assert rep["qemu_cpu"] == "max,sve256=on" and rep["rows"]["int_dot"]["recip"] == 0.25
