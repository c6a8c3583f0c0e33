"""The per-block pricing checked where hardware exists: the x86 host this runs on.

    python -m bench.arm64.calibrate [--preset 0.8b-4l] [-p1 128 -p2 512 -n 16] [--rounds 3]

`make bench-arm64` predicts ours ÷ llama.cpp on Graviton from counts under qemu priced by
llvm-mca (bench/arm64/mca.py); there is no Graviton here to check it against. This runs the same
pipeline on x86_64, where the answer can be measured: both programs of bench-arm64 (ours,
`python -m bench.arm64.ours`, and llama.cpp's `llama_driver` built from the same sdist for
x86_64), held to AVX2 (x86-64-v3, what `make bench`'s avx2 mode holds both to, and what qemu
7.2's TCG runs), one thread:

1. under `qemu-x86_64 -cpu max` with the counting plugin's `blocks=` (the same build, the same
   numba cache, filled natively first) → each phase's blocks priced by `llvm-mca -mcpu=<this
   host>` → the predicted ratio (`--runs DIR` keeps the block files and reuses them);
2. natively, `--rounds` times each, the sides alternating: the phases' wall times (the drivers
   print them), best of the rounds → the measured ratio per phase. Run it on a quiet host.

The error (predicted ÷ measured − 1) is the method's error bar: the receipt
(bench/results/calibrate-x86-<stamp>.json) and docs/arm64.md quote it beside the Graviton
figures. What differs between the two hosts is left out (x86 vs Neoverse scheduling models are
LLVM's own, not checked here), so it is an error bar on the method, not on any one core's table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench import cpu_name
from bench.arm64 import build, mca
from bench.arm64.run import PHASES, RESULTS, ROOT, _model, last_json

QEMU_X86 = "qemu-x86_64"
NUMBA_CACHE = ROOT / ".numba_cache_x86-64-v3"  # make test-avx2's: the same target, kernels shared


def host_llvm_cpu() -> str:
    """The CPU llvm-mca models for this host (`Host CPU:` of its --version)."""
    out = subprocess.run([mca.tool("llvm-mca"), "--version"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if "Host CPU:" in line:
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"llvm-mca --version names no host CPU:\n{out}")


def our_env() -> dict:
    from engine.quant import paths

    env = dict(os.environ, NUMBA_CPU_NAME="x86-64-v3", NUMBA_CPU_FEATURES=paths.features_flag_string(paths.X86_64_V3),
               OPENBLAS_CORETYPE="Haswell", NUMBA_CACHE_DIR=str(NUMBA_CACHE), NUMBA_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0", PYTHONPATH=str(ROOT))
    return env


def commands(model: Path, sizes: Sequence[int]) -> dict[str, tuple[list[str], dict]]:
    args = [str(model), *map(str, sizes)]
    return {"ours": ([sys.executable, "-m", "bench.arm64.ours", *args], our_env()),
            "llama": ([str(build.driver_path(build.X86_LEVEL)), *args], {"PATH": os.environ.get("PATH", "")})}


def native(model: Path, sizes: Sequence[int], rounds: int) -> dict[str, list[list[float]]]:
    """Each side's phase wall times (ms), once per round; the sides alternate."""
    out: dict[str, list[list[float]]] = {"ours": [], "llama": []}
    cmds = commands(model, sizes)
    for _ in range(rounds):
        for side, (cmd, env) in cmds.items():
            res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"{side} failed natively ({res.returncode}):\n{res.stderr[-3000:]}")
            out[side].append(last_json(res.stdout)["phase_ms"])
    return out


def emulated(model: Path, sizes: Sequence[int], work: Path) -> dict[str, Path]:
    """Both sides under qemu-x86_64 with the plugin's blocks= (at once, one thread each)."""
    plugin = build.build_plugin()
    procs = {}
    for side, (cmd, env) in commands(model, sizes).items():
        blocks = work / f"x86-{side}.blocks"
        if blocks.exists():
            continue
        full = ["nice", "-n", "10", QEMU_X86, "-cpu", "max", "-plugin", f"{plugin},blocks={blocks}", *cmd]
        print("+", " ".join(full), flush=True)
        with open(work / f"x86-{side}.out", "w") as fo, open(work / f"x86-{side}.err", "w") as fe:
            procs[side] = subprocess.Popen(full, cwd=ROOT, env=env, stdout=fo, stderr=fe)
    for side, p in procs.items():
        if p.wait() != 0:
            raise RuntimeError(f"{side} failed under qemu ({p.returncode}):\n"
                               f"{(work / f'x86-{side}.err').read_text()[-3000:]}")
    return {side: work / f"x86-{side}.blocks" for side in ("ours", "llama")}


def compare(measured: Mapping[str, Sequence[Sequence[float]]], priced: Mapping[str, Mapping[str, float]]) -> dict:
    """Per phase: the best native time of each side, the measured and predicted ours ÷ llama.cpp,
    and the error of the prediction (predicted ÷ measured − 1)."""
    out = {}
    for k, ph in enumerate(PHASES):
        best = {side: min(r[k] for r in runs) for side, runs in measured.items()}
        m = best["ours"] / best["llama"]
        p = priced["ours"][ph] / priced["llama"][ph]
        out[ph] = {"ours_ms": round(best["ours"], 2), "llama_ms": round(best["llama"], 2),
                   "ours_cycles": round(priced["ours"][ph]), "llama_cycles": round(priced["llama"][ph]),
                   "measured_ratio": round(m, 3), "predicted_ratio": round(p, 3), "error": round(p / m - 1, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="0.8b-4l")
    ap.add_argument("--weights", default="Q4_K_M")
    ap.add_argument("-p1", type=int, default=128)
    ap.add_argument("-p2", type=int, default=512)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", default=None, help="folder for the emulated runs' block files (reused when there)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if os.uname().machine != "x86_64":
        ap.error("the calibration runs on an x86_64 host")
    sizes = [a.p1, a.p2, a.n]
    model = _model(a.preset, a.weights)
    build.ensure_tools()
    build.build_llama(build.X86_LEVEL)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    work = Path(a.runs) if a.runs else ROOT / ".bench" / "arm64" / "runs" / f"x86-{stamp}"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not all((work / f"x86-{side}.blocks").exists() for side in ("ours", "llama")):
        native(model, sizes, 1)  # fills the numba cache the emulated run loads (compiling under qemu: hours)
    blocks = emulated(model, sizes, work)
    emulated_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    measured = native(model, sizes, a.rounds)  # last: `--runs` again re-measures on a quiet host
    native_s = time.perf_counter() - t0
    core = host_llvm_cpu()
    priced: dict[str, dict[str, float]] = {}
    prices: dict[str, dict] = {}
    for side, path in blocks.items():
        bf = mca.read_blocks(path)
        execs = mca.phase_executions(bf, PHASES)
        prices[side] = {}
        priced[side] = {}
        for ph in PHASES:
            p = mca.price(execs[ph], core, arch=bf.arch)
            prices[side][ph] = {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(p).items()}
            priced[side][ph] = p.cycles
    phases = compare(measured, priced)
    receipt = {"bench": "arm64-method-calibration", "stamp": stamp, "host_cpu": cpu_name(), "llvm_mca_cpu": core,
               "level": build.X86_LEVEL, "model": model.name, "p1": a.p1, "p2": a.p2, "n": a.n, "threads": 1,
               "rounds": a.rounds, "native_ms": measured, "per_block": prices, "phases": phases,
               "wall_s": {"native": round(native_s, 1), "emulated": round(emulated_s, 1)},
               "command": "python -m bench.arm64.calibrate " + " ".join(argv if argv is not None else sys.argv[1:])}
    out = Path(a.out) if a.out else RESULTS / f"calibrate-x86-{stamp}.json"
    out.write_text(json.dumps(receipt, indent=1) + "\n")
    print(f"{'phase':<12}{'ours ms':>9}{'llama ms':>10}{'measured':>10}{'predicted':>11}{'error':>8}")
    for ph, r in phases.items():
        print(f"{ph:<12}{r['ours_ms']:>9.1f}{r['llama_ms']:>10.1f}{r['measured_ratio']:>10.3f}"
              f"{r['predicted_ratio']:>11.3f}{r['error']:>+8.1%}")
    print(f"receipt: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
