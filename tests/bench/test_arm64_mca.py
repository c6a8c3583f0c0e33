"""bench/arm64/mca.py, the per-block pricing: the plugin's block file read into per-phase
executions, the hottest blocks chosen, and (where Debian's llvm-19 is installed) llvm-mca's
prices of known code; the plugin itself on a small static program where qemu-user, the aarch64
cross compiler and the plugin header of `python -m bench.arm64.build` are there."""
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.arm64 import mca

ROOT = Path(__file__).resolve().parents[2]
HAVE_LLVM = all(shutil.which(f"{t}-{mca.LLVM_VERSION}") for t in ("llvm-mca", "llvm-mc", "llvm-objdump"))
needs_llvm = pytest.mark.skipif(not HAVE_LLVM, reason=f"llvm-{mca.LLVM_VERSION} is not installed "
                                                      "(python -m bench.arm64.build installs it)")

LOOP = (0x1e210908, 0x1e202908, 0x71000400, 0x54ffffa1)  # fmul s8,s8,s1; fadd s8,s8,s0; subs; b.ne


def _block_file(path: Path, phases: list[int], blocks: list[tuple[int, tuple, list[int]]], arch="aarch64") -> Path:
    lines = [f"warmllm-blocks 1 {arch}", f"marks {len(phases)} " + " ".join(map(str, phases))]
    for vaddr, words, counts in blocks:
        code = "".join(f"{w:08x}" for w in words) if arch == "aarch64" else ".".join(w.hex() for w in words)
        lines.append(f"{vaddr:x} {len(words)} {code} " + " ".join(map(str, counts)))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_phase_executions_are_mark_differences_with_each_codes_translations_merged(tmp_path):
    a, b = (1, 2, 3), (4, 5)
    f = _block_file(tmp_path / "b.txt", [0, 1, 2], [
        (0x1000, a, [10, 30, 31, 40]),   # counts at marks 0, 1, 2, then the total at exit
        (0x2000, b, [0, 5, 105, 105]),
        (0x3000, a, [0, 0, 7, 7]),       # the same code translated again (another address)
    ])
    ex = mca.phase_executions(mca.read_blocks(f), ["p", "q"])
    assert ex == {"p": {a: 20, b: 5}, "q": {a: 1 + 7, b: 100}}


def test_phases_are_taken_in_phase_order_and_must_all_be_there(tmp_path):
    a = (1,)
    f = _block_file(tmp_path / "b.txt", [1, 0, 2], [(0x1000, a, [30, 10, 35, 35])])  # mark 1 was taken first
    assert mca.phase_executions(mca.read_blocks(f), ["p", "q"]) == {"p": {a: 20}, "q": {a: 5}}
    short = _block_file(tmp_path / "s.txt", [0, 1], [(0x1000, a, [1, 2, 2])])
    with pytest.raises(ValueError, match="expected phases 0..2"):
        mca.phase_executions(mca.read_blocks(short), ["p", "q"])


def test_read_blocks_refuses_what_the_plugin_did_not_write(tmp_path):
    (tmp_path / "x.json").write_text('{"classes": []}\n')
    with pytest.raises(ValueError, match="not a blocks file"):
        mca.read_blocks(tmp_path / "x.json")
    bad = tmp_path / "bad.txt"
    bad.write_text("warmllm-blocks 1 aarch64\nmarks 1 0\n1000 2 0000000a 1 1\n")  # 2 instructions, 1 word
    with pytest.raises(ValueError, match="bad block line"):
        mca.read_blocks(bad)


def test_x86_blocks_hold_each_instructions_bytes(tmp_path):
    code = (bytes.fromhex("f30f59d1"), bytes.fromhex("83e801"), bytes.fromhex("75eb"))
    f = _block_file(tmp_path / "x.txt", [0, 1], [(0x401649, code, [0, 999, 999])], arch="x86_64")
    bf = mca.read_blocks(f)
    assert bf.arch == "x86_64" and bf.blocks[0].words == code
    assert mca.phase_executions(bf, ["p"]) == {"p": {code: 999}}


def test_hottest_takes_blocks_by_executed_instructions_until_the_coverage():
    execs = {(1,) * 10: 50, (2,): 300, (3,) * 4: 10, (4,): 5}  # 500, 300, 40, 5 of 845 instructions
    assert mca.hottest(execs, 0.5) == [(1,) * 10]
    assert mca.hottest(execs, 0.95) == [(1,) * 10, (2,), (3,) * 4]  # 840 / 845
    assert mca.hottest(execs, 1.0) == [(1,) * 10, (2,), (3,) * 4, (4,)]


def test_parse_summary_reads_each_regions_cycles_per_iteration():
    text = """
[0] Code Region - b3

Iterations:        100
Instructions:      700
Total Cycles:      404
Total uOps:        800

[1] Code Region - b7

Iterations:        100
Instructions:      200
Total Cycles:      103
"""
    got = mca.parse_summary(text)
    assert got == {"b3": mca.Region(4.04, 7), "b7": mca.Region(1.03, 2)}


def test_price_scales_the_priced_blocks_up_to_the_whole_phase(monkeypatch):
    hot, cold = (1, 2, 3, 4), (9,)
    monkeypatch.setattr(mca, "run_mca", lambda asm, core, iterations=mca.ITERATIONS, arch="aarch64": [mca.Region(2.0, 4)])
    p = mca.price({hot: 90, cold: 40}, "neoverse-n1", 0.5, asm={hot: ["x"] * 4})
    assert (p.instructions, p.blocks, p.skipped) == (400, 1, 0)
    assert p.covered == pytest.approx(360 / 400)
    assert p.priced_cycles == pytest.approx(180.0)
    assert p.cycles == pytest.approx(180.0 * 400 / 360)  # the cold 40 at the covered cycles per instruction


@needs_llvm
def test_disassembly_keeps_one_line_per_word_and_drops_branch_targets():
    asm = mca.disassemble([LOOP, (0x4e829420, 0xffffffff)])
    assert asm[0] == ["fmul\ts8, s8, s1", "fadd\ts8, s8, s0", "subs\tw0, w0, #0x1", "b.ne\t."]
    assert asm[1] == ["sdot\tv0.4s, v1.16b, v2.16b", "<unknown>"]


@needs_llvm
def test_x86_disassembly_and_pricing_on_this_hosts_kind_of_core():
    code = (bytes.fromhex("f30f59d1"), bytes.fromhex("f30f58d0"), bytes.fromhex("83e801"), bytes.fromhex("75eb"))
    asm = mca.disassemble([code], "x86_64")[0]
    assert asm == ["mulss\t%xmm1, %xmm2", "addss\t%xmm0, %xmm2", "subl\t$0x1, %eax", "jne\t."]
    # qemu 7.2's plugin data can end a VEX instruction short (seen: c4a17c10, c5f5): unknown, and the
    # next instruction still decodes from its own bytes
    cut = mca.disassemble([(bytes.fromhex("c4a17c10"), code[0], bytes.fromhex("c5f5"), code[1])], "x86_64")[0]
    assert cut == ["<unknown>", asm[0], "<unknown>", asm[1]]
    r = mca.run_mca([asm], "znver4", arch="x86_64")[0]
    assert r is not None and r.instructions == 4 and r.cycles_per_iteration >= 5.5  # mulss 3 + addss 3, chained


@needs_llvm
def test_a_loop_carried_chain_costs_its_latency_not_its_throughput():
    chained = ["fmul s8, s8, s1", "fadd s8, s8, s0"]       # each depends on the last: 3 + 2 cycles on N1
    apart = ["fmul s8, s9, s1", "fadd s10, s11, s0"]
    got = mca.run_mca([chained, apart], "neoverse-n1")
    assert got[0] is not None and got[1] is not None
    assert got[0].cycles_per_iteration >= 4.5
    assert got[1].cycles_per_iteration <= 1.5


@needs_llvm
def test_v1_and_v2_issue_twice_the_dot_products_of_n1():
    dots = [f"sdot v{i}.4s, v20.16b, v21.16b" for i in range(16)]  # 16 accumulators: throughput-bound
    n1, v1, v2 = (mca.run_mca([dots], core)[0] for core in ("neoverse-n1", "neoverse-v1", "neoverse-v2"))
    assert n1 is not None and v1 is not None and v2 is not None
    assert n1.cycles_per_iteration >= 1.8 * v1.cycles_per_iteration
    assert n1.cycles_per_iteration >= 1.8 * v2.cycles_per_iteration


def test_an_instruction_the_core_lacks_is_skipped_and_counted(monkeypatch):
    if not HAVE_LLVM:
        pytest.skip(f"llvm-{mca.LLVM_VERSION} is not installed")
    sve = "add z0.s, z0.s, z0.s"  # SVE: N1 has none
    r = mca.run_mca([["add x0, x0, #1", sve]], "neoverse-n1")[0]
    assert r is not None and r.instructions == 1
    r = mca.run_mca([["add x0, x0, #1", sve]], "neoverse-v1")[0]
    assert r is not None and r.instructions == 2


LOOP_C = r"""
#include <unistd.h>
#define MARK(p) lseek(-1, 0x5741524d, (p))
int main(void) {
    volatile float out;
    float a = 1.0f;
    MARK(0);
    for (int i = 0; i < 1000; i++) a = a * 1.0001f + 0.5f;
    MARK(1);
    for (int i = 0; i < 3000; i++) a = a * 0.9999f + 0.25f;
    MARK(2);
    out = a;
    return out > 0 ? 0 : 1;
}
"""


@needs_llvm
@pytest.mark.parametrize("arch, core", [("aarch64", "neoverse-n1"), ("x86_64", "znver4")])
def test_the_plugin_counts_each_blocks_executions_per_phase(tmp_path, arch, core):
    header = ROOT / ".bench" / "arm64" / "qemu-include" / "qemu-plugin.h"
    qemu = shutil.which(f"qemu-{arch}")
    cc = shutil.which("aarch64-linux-gnu-gcc" if arch == "aarch64" else "gcc")
    if not (header.exists() and qemu and cc):
        pytest.skip("qemu-user, the compiler and the plugin header (python -m bench.arm64.build) are not all here")
    so = tmp_path / "ic.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{header.parent}",
                    str(ROOT / "bench" / "arm64" / "insn_classes.c"), "-o", str(so)], check=True)
    (tmp_path / "loop.c").write_text(LOOP_C)
    subprocess.run([cc, "-O1", "-static", str(tmp_path / "loop.c"), "-o", str(tmp_path / "loop")], check=True)
    blocks = tmp_path / "b.txt"
    subprocess.run([qemu, "-plugin", f"{so},out={tmp_path / 'c.json'},blocks={blocks}", str(tmp_path / "loop")],
                   check=True)
    ex = mca.phase_executions(mca.read_blocks(blocks), ["first", "second"])
    # each loop is one block (A64: fmul, fadd, subs, b.ne) run once per iteration but the
    # first, which the block before it holds
    loops = {ph: [n for w, n in e.items() if n >= 999] for ph, e in ex.items()}
    assert loops == {"first": [999], "second": [2999]}
    first = mca.price(ex["first"], core, arch=arch)
    assert first.covered >= mca.COVERAGE
    assert first.cycles >= 999 * 4.5  # the multiply -> add chain: ~5 cycles an iteration (N1), 6+ (Zen 4)


def test_the_report_prices_both_sides_per_block_on_every_core_the_target_runs_on(tmp_path, monkeypatch):
    from bench.arm64 import cost, run

    n = len(cost.CLASSES)
    plugin = {"classes": list(cost.CLASSES), "mode": "tb", "total": [0] * n,
              "marks": [{"phase": p, "counts": [0] * n} for p in range(4)]}
    ours, llama = (1, 2), (3, 4, 5, 6)

    def side(name, words, per_phase):  # cumulative counts at marks 0..3, then the total
        c = [0]
        for k in per_phase:
            c.append(c[-1] + k)
        f = _block_file(tmp_path / f"{name}.txt", [0, 1, 2, 3], [(0x1000, words, [*c, c[-1]])])
        return {"info": {}, "plugin": plugin, "wall_s": 1.0, "blocks": f}

    # every block costs 1 cycle an instruction on N1, half that elsewhere
    monkeypatch.setattr(mca, "disassemble", lambda blocks, arch="aarch64": [["nop"] * len(b) for b in blocks])
    monkeypatch.setattr(mca, "run_mca", lambda asm, core, iterations=mca.ITERATIONS, arch="aarch64": [
        mca.Region(len(a) * (1.0 if core == "neoverse-n1" else 0.5), len(a)) for a in asm])
    rep = run.report("neoverse-n1", {"ours": side("o", ours, [10, 40, 4]), "llama": side("l", llama, [10, 10, 1])})
    pb = rep["per_block"]
    assert set(pb) == set(run.PRICE_ON["neoverse-n1"]) == {"neoverse-n1", "neoverse-v1", "neoverse-v2"}
    # ours 2 instructions x executions against llama's 4 x executions: the cores' rates cancel
    assert [pb["neoverse-n1"][p]["ratio_cycles"] for p in run.PHASES] == [0.5, 2.0, 2.0]
    assert pb["neoverse-v2"]["decode"]["ours"]["cycles"] == 4.0
    assert all("ratio_cycles_ik" not in r for r in pb["neoverse-n1"].values())
    # ik_llama.cpp as a second peer: its own ratio beside llama.cpp's
    ik = side("i", (7,), [10, 40, 8])
    rep = run.report("neoverse-n1", {"ours": side("o", ours, [10, 40, 4]), "llama": side("l", llama, [10, 10, 1]),
                                     "ik": ik})
    assert [rep["per_block"]["neoverse-v1"][p]["ratio_cycles_ik"] for p in run.PHASES] == [2.0, 2.0, 1.0]
    assert [rep["per_block"]["neoverse-v1"][p]["ratio_cycles"] for p in run.PHASES] == [0.5, 2.0, 2.0]


def test_calibration_compares_the_best_native_times_with_the_priced_cycles():
    from bench.arm64 import calibrate

    measured = {"ours": [[12.0, 50.0, 9.0], [10.0, 55.0, 8.0]], "llama": [[20.0, 40.0, 8.0], [21.0, 41.0, 9.0]]}
    priced = {"ours": {"prefill_p1": 100.0, "prefill_p2": 500.0, "decode": 80.0},
              "llama": {"prefill_p1": 250.0, "prefill_p2": 400.0, "decode": 80.0}}
    got = calibrate.compare(measured, priced)
    assert got["prefill_p1"]["measured_ratio"] == 0.5 and got["prefill_p1"]["predicted_ratio"] == 0.4
    assert got["prefill_p1"]["error"] == pytest.approx(-0.2)
    assert got["prefill_p2"]["measured_ratio"] == 1.25 and got["prefill_p2"]["error"] == 0.0
    assert got["decode"]["ours_ms"] == 8.0 and got["decode"]["error"] == 0.0


def test_rep_string_blocks_are_priced_by_the_bytes_they_move(monkeypatch):
    sizes = {"f3aa": 1, "f3ab": 4, "f348ab": 8, "f3a4": 1, "f348a5": 8, "66f3ab": 2, "f366ab": 2, "f3a5": 4,
             "4889d6": 0, "f3c3": 0}  # stosb/stosd/stosq, movsb/movsq, stosw both prefix orders, movsd; not rep
    assert {h: mca.rep_element_bytes((bytes.fromhex(h),)) for h in sizes} == sizes
    assert mca.rep_element_bytes((bytes.fromhex("f3ab"), bytes.fromhex("c3"))) == 0  # not a lone instruction
    assert mca.rep_element_bytes((0xf3ab,)) == 0                                      # A64 words never
    rep, body = (bytes.fromhex("f348ab"),), (bytes.fromhex("4889d6"),)
    monkeypatch.setattr(mca, "run_mca", lambda asm, core, iterations=mca.ITERATIONS, arch="aarch64":
                        [mca.Region(1.0, 1) for _ in asm])
    p = mca.price({rep: 4000, body: 100}, "znver4", 1.0, asm={body: ["mov"]}, arch="x86_64")
    assert (p.instructions, p.rep_bytes) == (100, 32000)   # the 4000 elements are not 4000 instructions
    assert p.cycles == pytest.approx(100 + 32000 / mca.REP_BYTES_PER_CYCLE)
