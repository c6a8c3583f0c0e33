"""Per-block pricing for `make bench-arm64`: the translation blocks a phase executed, priced by
`llvm-mca` on a Neoverse core's scheduling model.

The class model (bench/arm64/cost.py) prices instruction counts by class with no overlap
(serial) or by the busiest pipe group (bound). This one prices the code itself: the counting
plugin's `blocks=FILE` output (bench/arm64/insn_classes.c) gives each translation block's
instruction words and its execution count per phase; the hottest blocks, covering at least
`COVERAGE` of the phase's executed instructions, are disassembled (`llvm-mc` assembles the
words as `.inst`, `llvm-objdump` prints them back) and go through one `llvm-mca -mcpu=<core>`
run as one code region each. A block's price is llvm-mca's cycles per iteration of it (`Total
Cycles / Iterations`), which sees what the class model cannot: the pipes each instruction may
issue to (V0-only, V1-only), multi-micro-op loads and stores (LD1 of 2-4 registers, Q-form
stores), the dispatch width, and the dependency chains a block carries into its next
execution (an accumulator's latency in a hot loop). The phase's cycles are Σ executions ×
cycles per iteration over the priced blocks, scaled up by the instructions left out (priced at
the covered blocks' mean cycles per instruction); the receipt says how much was left out.

What llvm-mca leaves out: caches and memory (every load hits L1), branch prediction (a block
is a straight line that repeats), and the front end beyond the dispatch width. Needs LLVM 19
(Debian's `llvm-19`: it knows neoverse-n1, -v1 and -v2; the default LLVM 14 lacks V2).
"""
from __future__ import annotations

import bisect
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

COVERAGE = 0.95
ITERATIONS = 100
LLVM_VERSION = 19
CORES = ("neoverse-n1", "neoverse-v1", "neoverse-v2")
# every feature a Graviton's code may use, so that llvm-objdump decodes every word it is given;
# llvm-mca then parses each line for the core it prices (an instruction that core lacks is
# skipped and counted)
DISASSEMBLE_ATTRS = "+v9a,+sve2,+i8mm,+bf16,+dotprod,+fullfp16,+fp16fml,+lse,+rcpc,+crypto,+sha3,+sm4"
_BRANCH_TARGET = re.compile(r"0x[0-9a-f]+ <[^>]*>")
_LINE = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
TRIPLES = {"aarch64": "aarch64", "x86_64": "x86_64"}


def tool(name: str) -> str:
    """`llvm-mca-19` etc.; the error says how to get it."""
    exe = shutil.which(f"{name}-{LLVM_VERSION}")
    if exe is None:
        raise FileNotFoundError(f"{name}-{LLVM_VERSION} not found: apt-get install llvm-{LLVM_VERSION} "
                                "(python -m bench.arm64.build installs it)")
    return exe


# A block's code: A64 words as numbers, or (x86_64) each instruction's bytes
Code = tuple[int, ...] | tuple[bytes, ...]


@dataclass(frozen=True)
class Block:
    vaddr: int
    words: Code
    counts: tuple[int, ...]  # executions up to each mark, then the total at exit


@dataclass(frozen=True)
class BlockFile:
    arch: str                # the emulated target: "aarch64" or "x86_64"
    phases: tuple[int, ...]  # the marks' phase ids, in the order they were taken
    blocks: tuple[Block, ...]


def read_blocks(path: Path) -> BlockFile:
    """The plugin's `blocks=FILE` output."""
    lines = Path(path).read_text().splitlines()
    first = lines[0].split() if lines else []
    if first[:2] != ["warmllm-blocks", "1"] or len(first) != 3 or first[2] not in TRIPLES:
        raise ValueError(f"{path}: not a blocks file of insn_classes.so (first line {lines[:1]})")
    arch = first[2]
    head = lines[1].split()
    if head[0] != "marks" or len(head) != 2 + int(head[1]):
        raise ValueError(f"{path}: bad marks line {lines[1]!r}")
    phases = tuple(int(p) for p in head[2:])
    blocks = []
    for ln in lines[2:]:
        f = ln.split()
        n, code = int(f[1]), f[2]
        words: Code
        if arch == "aarch64":
            words = tuple(int(code[8 * i:8 * i + 8], 16) for i in range(len(code) // 8))
            ok = len(code) == 8 * n
        else:
            words = tuple(bytes.fromhex(x) for x in code.split("."))
            ok = len(words) == n
        if not ok or len(f) != 4 + len(phases):
            raise ValueError(f"{path}: bad block line {ln[:80]!r}")
        blocks.append(Block(int(f[0], 16), words, tuple(int(c) for c in f[3:])))
    return BlockFile(arch, phases, tuple(blocks))


def phase_executions(bf: BlockFile, names: Sequence[str]) -> dict[str, dict[Code, int]]:
    """Executions per phase of each distinct block (its words: the same code translated twice,
    or at two addresses, is one block to price). `names[i]` is the span from the mark of phase i
    to the mark of phase i + 1, as cost.phase_counts reads the class counters."""
    order = sorted(range(len(bf.phases)), key=lambda i: bf.phases[i])
    if [bf.phases[i] for i in order] != list(range(len(names) + 1)):
        raise ValueError(f"marks {list(bf.phases)}: expected phases 0..{len(names)} (did the program finish?)")
    out: dict[str, dict[Code, int]] = {}
    for k, name in enumerate(names):
        a, b = order[k], order[k + 1]
        execs: dict[Code, int] = {}
        for blk in bf.blocks:
            d = blk.counts[b] - blk.counts[a]
            if d:
                execs[blk.words] = execs.get(blk.words, 0) + d
        out[name] = execs
    return out


def hottest(execs: Mapping[Code, int], coverage: float = COVERAGE) -> list[Code]:
    """The blocks with the most executed instructions, until they hold `coverage` of them."""
    total = sum(len(w) * n for w, n in execs.items())
    picked: list[Code] = []
    acc = 0
    for w in sorted(execs, key=lambda w: (-len(w) * execs[w], repr(w))):
        if total and acc >= coverage * total:
            break
        picked.append(w)
        acc += len(w) * execs[w]
    return picked


def disassemble(blocks: Sequence[Code], arch: str = "aarch64") -> list[list[str]]:
    """Each block's instructions as assembly llvm-mca parses (`<unknown>` for one LLVM does not
    decode to the bytes the plugin recorded); branch targets become `.` (llvm-mca ignores where a
    branch goes). Each instruction sits at its own 16-byte boundary (A64: its own word), so a
    bad one cannot shift the next: x86_64's plugin data can end an instruction short."""
    words = [w for blk in blocks for w in blk]
    if not words:
        return [[] for _ in blocks]
    step = 4 if arch == "aarch64" else 16
    if arch == "aarch64":
        src_text = "".join(f".inst 0x{w:08x}\n" for w in words)
        attrs = [f"-mattr={DISASSEMBLE_ATTRS}"]
    else:
        src_text = "".join(".p2align 4, 0x90\n.byte " + ",".join(f"0x{b:02x}" for b in w) + "\n"  # type: ignore[union-attr]
                           for w in words)
        attrs = []
    with tempfile.TemporaryDirectory() as d:
        src, obj = Path(d) / "b.s", Path(d) / "b.o"
        src.write_text(".text\n" + src_text)
        subprocess.run([tool("llvm-mc"), f"-triple={TRIPLES[arch]}", *attrs, "-filetype=obj",
                        str(src), "-o", str(obj)], check=True)
        text = subprocess.run([tool("llvm-objdump"), "-d", "--disassemble-zeroes", "--no-show-raw-insn",
                               *("-" + x for x in attrs), str(obj)], check=True, capture_output=True,
                              text=True).stdout
    at: dict[int, str] = {}
    for ln in text.split("<.text>:\n", 1)[1].splitlines():
        m = _LINE.match(ln)
        if m:
            at[int(m.group(1), 16)] = _BRANCH_TARGET.sub(".", m.group(2).strip())
    starts = sorted(at)
    insns = []
    for i, w in enumerate(words):
        s0 = i * step
        size = 4 if isinstance(w, int) else len(w)
        k = bisect.bisect_right(starts, s0)  # the next decoded instruction after this one's start
        decoded = (starts[k] if k < len(starts) else s0 + size) - s0
        ok = s0 in at and decoded == size
        insns.append(at[s0] if ok else "<unknown>")
    out, i = [], 0
    for blk in blocks:
        out.append(insns[i:i + len(blk)])
        i += len(blk)
    return out


@dataclass(frozen=True)
class Region:
    cycles_per_iteration: float
    instructions: int  # per iteration, after llvm-mca skipped what the core lacks


def run_mca(asm: Sequence[Sequence[str]], core: str, iterations: int = ITERATIONS,
            arch: str = "aarch64") -> list[Region | None]:
    """One llvm-mca run, one code region per block; None for a block with nothing to price
    (every instruction unknown to LLVM or to the core)."""
    keep = [i for i, a in enumerate(asm) if any(x != "<unknown>" for x in a)]
    out: list[Region | None] = [None] * len(asm)
    if not keep:
        return out
    text = []
    for i in keep:
        text.append(f"# LLVM-MCA-BEGIN b{i}")
        text.extend(x for x in asm[i] if x != "<unknown>")
        text.append(f"# LLVM-MCA-END b{i}")
    res = subprocess.run([tool("llvm-mca"), f"-mtriple={TRIPLES[arch]}", f"-mcpu={core}", f"-iterations={iterations}",
                          "--skip-unsupported-instructions=any", "-all-views=false", "-summary-view"],
                         input="\n".join(text) + "\n", capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"llvm-mca -mcpu={core} failed: {res.stderr[-2000:]}")
    for name, region in parse_summary(res.stdout).items():
        out[int(name[1:])] = region
    return out


_REGION = re.compile(r"^\[\d+\] Code Region - (\S+)$", re.M)


def parse_summary(text: str) -> dict[str, Region]:
    """llvm-mca's summary view, region by region: {name: Region}."""
    heads = list(_REGION.finditer(text))
    out = {}
    for k, m in enumerate(heads):
        part = text[m.end():heads[k + 1].start() if k + 1 < len(heads) else len(text)]
        fields = dict(re.findall(r"^([A-Za-z ]+):\s+([\d.]+)$", part, re.M))
        iters, cycles, insns = int(fields["Iterations"]), float(fields["Total Cycles"]), int(fields["Instructions"])
        out[m.group(1)] = Region(cycles / iters, insns // iters)
    return out


@dataclass(frozen=True)
class PhasePrice:
    instructions: int        # executed in the phase (x86: rep string elements apart)
    covered: float           # share of them in priced blocks
    priced_cycles: float     # Σ executions × cycles per iteration over the priced blocks
    cycles: float            # priced_cycles scaled up to every instruction of the phase, + rep_cycles
    blocks: int              # blocks priced
    skipped: int             # executed instructions of priced blocks llvm-mca could not price
    rep_bytes: int = 0       # x86: bytes moved by rep string instructions
    rep_cycles: float = 0.0  # ... at REP_BYTES_PER_CYCLE


# x86's rep-prefixed string instructions (memset, memcpy): qemu runs one element per execution
# of their one-instruction block, and llvm-mca prices the instruction as a whole (100 cycles),
# so each element would cost 100 cycles. They are priced by the bytes they move instead.
# ASSUMPTION: 32 bytes a cycle (ERMSB fast strings, L1-resident, one 256-bit store a cycle).
REP_BYTES_PER_CYCLE = 32.0
_REP = re.compile(r"^(66)?(?:f2|f3)(66)?(4[0-9a-f])?(a[4-7a-f])$")  # [66] rep [66] [REX] opcode


def rep_element_bytes(code: Code) -> int:
    """Bytes one execution of this block moves when it is a lone rep string instruction, else 0."""
    if len(code) != 1 or isinstance(code[0], int):
        return 0
    m = _REP.match(code[0].hex())
    if not m:
        return 0
    if int(m.group(4), 16) % 2 == 0:            # a4 a6 aa ac ae: byte forms
        return 1
    if m.group(3) and int(m.group(3), 16) & 8:  # REX.W: qword
        return 8
    return 2 if m.group(1) or m.group(2) else 4  # operand-size prefix: word


def price(execs: Mapping[Code, int], core: str, coverage: float = COVERAGE,
          asm: Mapping[Code, list[str]] | None = None, arch: str = "aarch64") -> PhasePrice:
    """A phase's cycles on `core` (llvm-mca's model of it) from its blocks' executions. `asm`:
    blocks already disassembled (the same blocks priced on several cores)."""
    rep = {w: rep_element_bytes(w) for w in execs}
    rep_bytes = sum(n * rep[w] for w, n in execs.items())
    execs = {w: n for w, n in execs.items() if not rep[w]}
    total = sum(len(w) * n for w, n in execs.items())
    hot = hottest(execs, coverage)
    if asm is None:
        asm = dict(zip(hot, disassemble(hot, arch)))
    regions = run_mca([asm[w] for w in hot], core, arch=arch)
    priced = covered = skipped = 0.0
    n_priced = 0
    for w, r in zip(hot, regions):
        if r is None:
            skipped += len(w) * execs[w]
            continue
        priced += execs[w] * r.cycles_per_iteration
        covered += len(w) * execs[w]
        skipped += (len(w) - r.instructions) * execs[w]
        n_priced += 1
    rep_cycles = rep_bytes / REP_BYTES_PER_CYCLE
    cycles = (priced * total / covered if covered else 0.0) + rep_cycles
    return PhasePrice(total, covered / total if total else 0.0, priced, cycles, n_priced, int(skipped),
                      rep_bytes, rep_cycles)
