"""`make bench-arm64`: our engine and llama.cpp under the same qemu counting plugin, per Graviton
target, with estimated cycles from the Neoverse optimization guides (bench/arm64/cost.py).

    python -m bench.arm64.run [--targets neoverse-n1,neoverse-v1] [--preset 0.8b-4l] [-p1 128 -p2 512 -n 16]

Per target: builds what is missing (bench/arm64/build.py: the plugin, llama.cpp's static aarch64
driver), warms our numba cache for the target once without the plugin (compiling under qemu is
slow; `.cache/arm64/numba/<target>`, the cache `make test-arm64` uses), then runs both sides at
once under `qemu-aarch64 -plugin insn_classes.so`, one thread each: ours in the arm64 userland of
scripts/arm64_userland.py (`python -m bench.arm64.ours`), llama.cpp's `llama_driver` (static).
The phases (prefill p1, prefill p2, n decode steps) are the spans between the programs' markers.
Writes bench/results/arm64-<UTC stamp>.json and prints a table. A benchmark, never a test.

The model is the factory's (`python -m engine make-model`, the weights `make bench` uses):
`0.8b-4l` by default, Qwen3.5-0.8B's shapes with 4 of its 24 layers (3 DeltaNet + 1
attention), so the emulated 512-token prefill fits in minutes; `--preset 0.8b` runs all 24.
The head (tied, Q6_K, 248,320 × 1024) is the same in both, so on 0.8b-4l it is a larger share
of a decode step than on the real model.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import cpu_name
from bench.arm64 import build, cost, mca
from function.numba_cache import ARM64_V1_FEATURES

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import arm64_userland as userland  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# The emulated CPU per target. N1: qemu's own neoverse-n1 model, exactly N1's features (no
# i8mm, no SVE), so no library picks a path by HWCAP that Graviton2 lacks. V1: qemu 7.2 has no
# neoverse-v1 model; `max` with Graviton3's 256-bit SVE (as make test-arm64 runs V1).
QEMU_CPU = {"neoverse-n1": "neoverse-n1", "neoverse-v1": "max,sve256=on", "neoverse-v1-nosve": "max,sve256=on"}
# A target that is an image level with features of its own (function/numba_cache.py
# ARM64_LEVELS: Graviton3/4's kernels, neoverse-v1 with SVE off): ours compiles for that name and
# those features; llama.cpp's side is that CPU's build.
LEVELS = {"neoverse-v1-nosve": ("neoverse-v1", ARM64_V1_FEATURES)}


def cpu_of(target: str) -> str:
    """The Neoverse core a target is (its llama.cpp build and class-model core)."""
    return LEVELS.get(target, (target, ""))[0]

PHASES = ("prefill_p1", "prefill_p2", "decode")
# The cores each target's binaries are priced on per block (mca.py). Lambda compiles for N1 on
# every Graviton (the image's numba target), so the N1 build is priced on V1 and V2 as well.
PRICE_ON = {"neoverse-n1": ("neoverse-n1", "neoverse-v1", "neoverse-v2"), "neoverse-v1": ("neoverse-v1", "neoverse-v2"),
            "neoverse-v1-nosve": ("neoverse-v1", "neoverse-v2")}


def _model(preset: str, weights: str) -> Path:
    path = ROOT / "models" / f"{preset}-{weights}.gguf"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "engine", "make-model", "--preset", preset, "--weights", weights,
                        "--out", str(path)], check=True, cwd=ROOT)
    return path


def _our_env(target: str) -> dict:
    cache = userland.DEFAULT_CACHE
    name, features = LEVELS.get(target, (target, ""))
    env = userland.python_env(cache, NUMBA_CPU_NAME=name, NUMBA_CPU_FEATURES=features,
                              NUMBA_CACHE_DIR=str(cache / "numba" / target), NUMBA_NUM_THREADS="1",
                              OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    env["QEMU_CPU"] = QEMU_CPU[target]
    return env


def _our_cmd(qemu: list[str], model: Path, sizes: list[int]) -> list[str]:
    root = userland.DEFAULT_CACHE / "root"
    return [*qemu, "-L", str(root), str(root / "usr/bin" / f"python{userland.PYTHON}"), "-m", "bench.arm64.ours",
            str(model), *map(str, sizes)]


def warm(target: str, model: Path) -> float:
    """Compile our kernels for `target` into its numba cache once (no plugin: qemu-aarch64-static)."""
    stamp = userland.DEFAULT_CACHE / "numba" / target / f".bench-arm64-warm-{model.name}"
    if stamp.exists():
        return 0.0
    t0 = time.perf_counter()
    subprocess.run(["nice", "-n", "10", *_our_cmd([userland.QEMU], model, [128, 130, 2])], check=True, cwd=ROOT,
                   env=_our_env(target), stdout=subprocess.DEVNULL)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text("")
    return time.perf_counter() - t0


def last_json(stdout: str) -> dict:
    """A driver's result: the JSON object on its last line of output (bench.arm64.ours, llama_driver.c)."""
    return json.loads(stdout.strip().splitlines()[-1])


def measure(target: str, model: Path, sizes: list[int], out_dir: Path, reuse: bool = False,
            peers: tuple[str, ...] = ("llama",)) -> dict:
    """Ours and each peer (llama: mainline llama.cpp; ik: ik_llama.cpp) under the plugin at once;
    returns their plugin JSON and stdout. With `reuse`, a side whose `<target>-<side>.json` and
    `.out` are already in `out_dir` is not run again."""
    plugin = build.build_plugin()
    qemu = shutil.which(build.QEMU) or build.QEMU

    def args(side: str) -> str:
        return f"{plugin},out={out_dir / f'{target}-{side}.json'},blocks={out_dir / f'{target}-{side}.blocks'}"

    runs = {
        "ours": (_our_cmd([qemu, "-plugin", args("ours")], model, sizes), _our_env(target)),
        **{peer: ([qemu, "-cpu", QEMU_CPU[target], "-plugin", args(peer),
                   str(build.driver_path(cpu_of(target), peer)), str(model), *map(str, sizes)],
                  {"PATH": os.environ.get("PATH", "")}) for peer in peers},
    }
    procs, t0 = {}, time.perf_counter()
    for side, (cmd, env) in runs.items():
        if reuse and (out_dir / f"{target}-{side}.json").exists() and (out_dir / f"{target}-{side}.out").exists():
            continue
        print("+", " ".join(cmd), flush=True)
        with open(out_dir / f"{target}-{side}.out", "w") as fo, open(out_dir / f"{target}-{side}.err", "w") as fe:
            procs[side] = subprocess.Popen(["nice", "-n", "10", *cmd], cwd=ROOT, env=env, stdout=fo, stderr=fe)
    wall: dict[str, float] = {}
    while len(wall) < len(procs):  # each side's own wall time, whichever ends first
        for side, p in procs.items():
            if side not in wall and p.poll() is not None:
                if p.returncode != 0:
                    err = (out_dir / f"{target}-{side}.err").read_text()
                    raise RuntimeError(f"{target} {side} failed ({p.returncode}):\n{err[-3000:]}")
                wall[side] = round(time.perf_counter() - t0, 1)
        time.sleep(1)
    out = {}
    for side in runs:
        info = last_json((out_dir / f"{target}-{side}.out").read_text())
        counts = json.loads((out_dir / f"{target}-{side}.json").read_text())
        blocks = out_dir / f"{target}-{side}.blocks"
        out[side] = {"info": info, "plugin": counts, "wall_s": wall.get(side),
                     "blocks": blocks if blocks.exists() else None}
    return out


def per_block(target: str, runs: dict, coverage: float = mca.COVERAGE) -> dict:
    """Each phase of every side priced block by block on each core of PRICE_ON[target]; ours ÷
    llama.cpp (`ratio_cycles`) and ÷ ik_llama.cpp (`ratio_cycles_ik`) when it ran."""
    files = {side: mca.read_blocks(runs[side]["blocks"]) for side in runs}
    execs = {side: mca.phase_executions(bf, PHASES) for side, bf in files.items()}
    asm = {}
    for side, phases in execs.items():  # each side's hot blocks disassembled once for every core
        hot = sorted({w for ph in phases.values() for w in mca.hottest(ph, coverage)})
        asm[side] = dict(zip(hot, mca.disassemble(hot, files[side].arch)))
    out: dict = {}
    for core in PRICE_ON[target]:
        out[core] = {}
        for ph in PHASES:
            p = {side: mca.price(execs[side][ph], core, coverage, asm[side]) for side in runs}
            out[core][ph] = {side: {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(p[side]).items()}
                             for side in p}
            for peer, key in (("llama", "ratio_cycles"), ("ik", "ratio_cycles_ik")):
                if peer in p:
                    out[core][ph][key] = round(p["ours"].cycles / p[peer].cycles, 3) if p[peer].cycles else None
    return out


def report(target: str, runs: dict) -> dict:
    core = cost.CORES[cpu_of(target)]
    ours = cost.phase_counts(runs["ours"]["plugin"], PHASES)
    llama = cost.phase_counts(runs["llama"]["plugin"], PHASES)
    return {"target": target, "qemu_cpu": QEMU_CPU[target], "guide": core.guide,
            "decode_width": core.decode_width, "decode_source": core.decode_source,
            "rows": {c: {"recip": r.recip, "group": r.group, "source": r.source} for c, r in core.rows.items()},
            "ours_info": runs["ours"]["info"], "llama_info": runs["llama"]["info"],
            **({"ik_info": runs["ik"]["info"]} if "ik" in runs else {}),
            "wall_s": {s: runs[s]["wall_s"] for s in runs},
            "phases": {ph: cost.compare(ours[ph], llama[ph], core) for ph in PHASES},
            "per_block": (per_block(target, runs) if all(runs[s].get("blocks") for s in runs) else None)}


def _print(rep: dict, sizes: list[int]) -> None:
    names = {"prefill_p1": f"prefill {sizes[0]}", "prefill_p2": f"prefill {sizes[1]}", "decode": f"decode x{sizes[2]}"}
    print(f"\n{rep['target']} (qemu -cpu {rep['qemu_cpu']})")
    print(f"{'phase':<14}{'ours Minsn':>11}{'llama Minsn':>12}{'ours Mcyc':>11}{'llama Mcyc':>11}"
          f"{'serial':>8}{'bound':>7}  dominant (ours | llama)")
    for ph, r in rep["phases"].items():
        o, m = r["ours"], r["llama"]
        print(f"{names[ph]:<14}{o['instructions'] / 1e6:>11.0f}{m['instructions'] / 1e6:>12.0f}{o['serial_cycles'] / 1e6:>11.0f}"
              f"{m['serial_cycles'] / 1e6:>11.0f}{r['ratio_serial_cycles']:>8.2f}{r['ratio_bound_cycles']:>7.2f}  "
              f"{' '.join(c for c, _ in o['top_classes'][:3])} | {' '.join(c for c, _ in m['top_classes'][:3])}")
    for core, phases in (rep.get("per_block") or {}).items():
        print(f"  per block on {core} (llvm-mca), ours / llama.cpp cycles: "
              + ", ".join(f"{names[ph]} {r['ratio_cycles']} (covered {r['ours']['covered']:.2f} / "
                          f"{r['llama']['covered']:.2f})" for ph, r in phases.items()))
        if any("ratio_cycles_ik" in r for r in phases.values()):
            print(f"  per block on {core}, ours / ik_llama.cpp cycles: "
                  + ", ".join(f"{names[ph]} {r.get('ratio_cycles_ik')}" for ph, r in phases.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(QEMU_CPU))
    ap.add_argument("--preset", default="0.8b-4l")
    ap.add_argument("--weights", default="Q4_K_M")
    ap.add_argument("-p1", type=int, default=128)
    ap.add_argument("-p2", type=int, default=512)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--out", default=None, help="receipt path (default bench/results/arm64-<stamp>.json)")
    ap.add_argument("--peers", default="llama",
                    help="comma-separated: llama (mainline, from llama-cpp-python's sdist), ik (ik_llama.cpp, from "
                         "ik-llama-cpp-python's sdist: priced per block beside ours, ratio_cycles_ik)")
    ap.add_argument("--runs", default=None,
                    help="folder for the plugin outputs (default .bench/arm64/runs/<stamp>); outputs already there "
                         "are reused, not run again (re-price a run after changing cost.py)")
    a = ap.parse_args(argv)
    targets = [t for t in a.targets.split(",") if t]
    bad = [t for t in targets if t not in QEMU_CPU]
    if bad:
        ap.error(f"--targets: {bad} unknown; choose from {', '.join(QEMU_CPU)}")
    sizes = [a.p1, a.p2, a.n]
    userland.setup()
    model = _model(a.preset, a.weights)
    peers = tuple(p for p in a.peers.split(",") if p)
    if "llama" not in peers or set(peers) - {"llama", "ik"}:
        ap.error(f"--peers {a.peers}: llama, optionally with ik")
    build.main(["--targets", ",".join(sorted({cpu_of(t) for t in targets}))])
    if "ik" in peers:
        for core in sorted({cpu_of(t) for t in targets}):
            build.build_llama(core, "ik")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    work = Path(a.runs) if a.runs else ROOT / ".bench" / "arm64" / "runs" / stamp
    work.mkdir(parents=True, exist_ok=True)
    receipt = {"bench": "arm64-cost-model", "stamp": stamp, "model": model.name, "preset": a.preset,
               "weights": a.weights, "p1": a.p1, "p2": a.p2, "n": a.n, "threads": 1,
               "qemu": subprocess.run([build.QEMU, "--version"], capture_output=True, text=True).stdout.split("\n")[0],
               "llama_cpp": build.LLAMA_CPP_PYTHON, "peers": list(peers), "ik_llama_cpp": build.SOURCES["ik"][1], "llama_march": {t: build.ARCH[cpu_of(t)] for t in targets},
               "host_cpu": cpu_name(), "targets": {}}
    for t in targets:
        warm_s = warm(t, model)
        rep = report(t, measure(t, model, sizes, work, reuse=a.runs is not None, peers=peers))
        rep["warm_s"] = round(warm_s, 1)
        receipt["targets"][t] = rep
        _print(rep, sizes)
    out = Path(a.out) if a.out else RESULTS / f"arm64-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(receipt, indent=1) + "\n")
    print(f"\nreceipt: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
