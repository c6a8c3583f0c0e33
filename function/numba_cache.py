"""Make numba find the kernels the image build compiled, before numba is imported.

numba only uses a cache directory it can write to (its locators create the directory and write a
temporary file in it first), and Lambda's code directory is read-only. So the image build
compiles the kernels into ``WARMLLM_NUMBA_CACHE_SRC`` (``/opt/numba-cache``) and, at cold
start, this copies that tree into ``NUMBA_CACHE_DIR`` (``/tmp/numba-cache``) once — a few MB,
milliseconds. Cache entries are keyed by the source file's absolute path and content hash and by
(target triple, ``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``), so the image sets the same CPU
name and features at build and run time, each fixed by the level (empty: the named CPU's own
set; never the build host's), so a build under emulation produces the key a real Graviton looks up.

On arm64 the image holds a cache per Graviton level (``ARM64_LEVELS``): neoverse-v1 with SVE off
(dotprod + i8mm: the `smmla` tiles) for Graviton3/4, neoverse-n1 (dotprod) for Graviton2 and
as the floor; a cold start takes the first whose flags the CPU has (``Features`` and the HWCAP
bits). Without an image cache (the zip deployment with the layer) an arm64 process compiles for
``neoverse-n1``, the target ``make test-arm64`` proves, not for the Graviton it lands on:
numba's LLVM 22.1 miscompiles an SVE dot-product loop at Graviton3's 256-bit vector length
(llvm/llvm-project#204939, docs/arm64.md), and N1 code runs on every Graviton generation.

On x86_64 the image holds a cache per level (``X86_LEVELS``, built by ``python -m
function.numba_cache build``): Lambda hands out x86 CPUs with and without AVX-512, and the
AVX-512 VNNI panel tiles (docs/formats.md: every prompt length of IQ4_XS, Q3_K, Q5_K, on
Intel Q4_K and Q6_K too) exist only at that level. ``cpu.json`` lists the levels built, best first; a cold start takes the first
whose CPU flags ``/proc/cpuinfo`` shows. numba keys each cache entry by CPU name, so the levels
share one directory.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import time

MARKER = ".warmllm-copied"
CPU_FILE = "cpu.json"
ARM64_CPU = "neoverse-n1"
# The x86_64 image's levels, best first: a numba CPU name (with NUMBA_CPU_FEATURES empty, the
# name's own features: engine/quant/paths.py X86_CPU_FEATURES) and the /proc/cpuinfo flags a CPU
# needs to run its code. cascadelake is AVX-512 F/CD/BW/DQ/VL + VNNI, which Cascade Lake, Ice
# Lake, Sapphire/Emerald Rapids and Zen 4/5 all have; x86-64-v3 (AVX2) is the floor Lambda promises.
# The arm64 image's levels, best first: a numba CPU name, its NUMBA_CPU_FEATURES, and the HWCAP
# names (/proc/cpuinfo `Features`) a CPU needs. Graviton3/4 (Neoverse V1/V2: dotprod + i8mm) run
# the `smmla` tiles compiled for neoverse-v1 with SVE off: numba's LLVM miscompiles an SVE
# dot-product loop at Graviton3's 256-bit vector length (llvm/llvm-project#204939,
# docs/arm64.md), and NEON code runs on V1 and V2 alike. Graviton2 (N1: dotprod; what AWS
# documents for Lambda's arm64) is the floor, with its own features (empty: the name's).
ARM64_V1_FEATURES = "+neon,+dotprod,+i8mm,+bf16,-sve,-sve2"
ARM64_LEVELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("neoverse-v1", ARM64_V1_FEATURES, ("asimddp", "i8mm")),
    (ARM64_CPU, "", ("asimddp",)),
)
X86_LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cascadelake", ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512cd", "avx512bw", "avx512dq",
                     "avx512vl", "avx512_vnni")),
    ("x86-64-v3", ("avx2", "fma", "f16c", "bmi2")),
)


def cpu_flags(path: str = "/proc/cpuinfo", machine: str | None = None) -> frozenset[str]:
    """The first CPU's flags (x86 `flags`, arm64 `Features`), on arm64 with the kernel's HWCAP
    bits added (what a build under qemu-user sees: its /proc/cpuinfo is the host's); empty where
    neither is readable."""
    found: frozenset[str] = frozenset()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    found = frozenset(value.split())
                    break
    except OSError:
        pass
    if (machine or platform.machine()) in ("aarch64", "arm64"):
        found |= hwcap_flags()
    return found


# arch/arm64/include/uapi/asm/hwcap.h: (AT_HWCAP or AT_HWCAP2, bit) per /proc/cpuinfo name
_AT_HWCAP, _AT_HWCAP2 = 16, 26
HWCAPS = {"asimddp": (_AT_HWCAP, 20), "sve": (_AT_HWCAP, 22), "sve2": (_AT_HWCAP2, 1), "i8mm": (_AT_HWCAP2, 13),
          "bf16": (_AT_HWCAP2, 14)}


def hwcap_flags(getauxval=None) -> frozenset[str]:
    """The HWCAPS names whose bit the kernel (or qemu-user) sets in this process's auxv."""
    if getauxval is None:
        try:
            import ctypes

            fn = ctypes.CDLL(None).getauxval
            fn.restype, fn.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
            getauxval = fn
        except (OSError, AttributeError):
            return frozenset()
    words = {at: getauxval(at) for at in (_AT_HWCAP, _AT_HWCAP2)}
    return frozenset(name for name, (at, bit) in HWCAPS.items() if words[at] >> bit & 1)


def level_spec(name: str, requires: tuple[str, ...] | list[str] = (), features: str = "") -> dict:
    """One cpu.json level: the CPU name, its NUMBA_CPU_FEATURES (empty: the name's own) and the
    flags it needs."""
    return {"NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": features, "requires": list(requires)}


def choose_level(levels: list[dict], flags: frozenset[str]) -> dict | None:
    """The first level (best first) whose `requires` flags this CPU has, else None."""
    for level in levels:
        if all(f in flags for f in level.get("requires", ())):
            return level
    return None


def best_arm64_level(flags: frozenset[str]) -> dict | None:
    """The arm64 image level a CPU with these flags runs (what a cold start would pick), else None."""
    return choose_level([level_spec(name, requires, feats) for name, feats, requires in ARM64_LEVELS], flags)


def best_x86_level(flags: frozenset[str]) -> dict | None:
    """The x86_64 image level a CPU with these flags runs (what a cold start would pick), else None."""
    return choose_level([level_spec(name, requires) for name, requires in X86_LEVELS], flags)


def prepare(environ=os.environ, machine: str | None = None, flags: frozenset[str] | None = None) -> dict:
    info: dict = {"numba_cache_dir": None, "numba_cache_copied": False, "numba_cache_files": 0}
    dst = environ.get("NUMBA_CACHE_DIR")
    if not dst and environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        dst = "/tmp/numba-cache"               # the only writable place on Lambda
        environ["NUMBA_CACHE_DIR"] = dst
    info["numba_cache_dir"] = dst
    src = environ.get("WARMLLM_NUMBA_CACHE_SRC")
    # the CPU target the image compiled for (cpu.json, written by build()): the run must use the
    # same name and features or every cache lookup misses
    target = os.path.join(src, CPU_FILE) if src else None
    if target and os.path.isfile(target):
        try:
            with open(target) as f:
                levels = json.load(f).get("levels", [])
        except (OSError, ValueError, AttributeError):
            levels = []
        info["numba_cpu_levels"] = [lv.get("NUMBA_CPU_NAME") for lv in levels]
        level = choose_level(levels, cpu_flags(machine=machine) if flags is None else flags) or {}
        for k, v in level.items():
            if k in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
                environ.setdefault(k, str(v))
    if "NUMBA_CPU_NAME" not in environ and (machine or platform.machine()) in ("aarch64", "arm64"):
        environ["NUMBA_CPU_NAME"] = ARM64_CPU
        environ.setdefault("NUMBA_CPU_FEATURES", "")
    info["numba_cpu_name"] = environ.get("NUMBA_CPU_NAME")
    if not (src and dst and os.path.isdir(src)) or os.path.abspath(src) == os.path.abspath(dst):
        return info
    if os.path.exists(os.path.join(dst, MARKER)):
        return info
    t0 = time.perf_counter()
    n = 0
    for root, _dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        out = os.path.join(dst, rel)
        os.makedirs(out, exist_ok=True)
        for name in files:
            target = os.path.join(out, name)
            if not os.path.exists(target):
                shutil.copy2(os.path.join(root, name), target)
                n += 1

    with open(os.path.join(dst, MARKER), "w") as f:
        f.write(src)
    info.update(numba_cache_copied=True, numba_cache_files=n,
                numba_cache_copy_ms=round((time.perf_counter() - t0) * 1000.0, 1))
    return info


def gguf_files(paths: list[str] | tuple[str, ...]) -> list[str]:
    """The .gguf files among `paths` (a directory stands for the .gguf files in it)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".gguf"))
        elif p.endswith(".gguf") and os.path.isfile(p):
            out.append(p)
    return out


def cache_tokenizers(models: list[str]) -> list[dict]:
    """Build each model's tokenizer into its cache (TOKENIZER_CACHE_DIR; by default beside the
    kernels in NUMBA_CACHE_DIR, which the cold start copies to /tmp with them), so a start with a
    baked-in model loads it (~0.1 s) instead of building it (~0.6 s for Qwen3.5's vocabulary)."""
    from engine.gguf_file import GGUFFile
    from engine.settings import tokenizer_cache_dir
    from engine.tokenizer import Tokenizer

    directory = tokenizer_cache_dir(os.environ)
    if directory is None:
        raise SystemExit("numba_cache tokenizers: no cache directory: set NUMBA_CACHE_DIR or TOKENIZER_CACHE_DIR")
    done = []
    for path in models:
        t0 = time.perf_counter()
        tok = Tokenizer.from_gguf_metadata(GGUFFile(path).metadata, cache_dir=directory)
        done.append({"model": path, "dir": directory, "n_vocab": tok.n_vocab, "was_cached": tok.cache_hit,
                     "ms": round((time.perf_counter() - t0) * 1e3, 1)})
    return done


def build(cache_dir: str, machine: str | None = None, arm64_cpu: str | None = None,
          flags: frozenset[str] | None = None, warm: tuple[str, ...] = ("-m", "engine", "warm-kernels"),
          models: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The image build: compile every kernel into `cache_dir` once per level this machine can run
    (warm-kernels runs models, so a level the build CPU lacks would die of SIGILL: it is left
    out, and said), write cpu.json, and build the tokenizer of each baked-in model (`models`:
    .gguf files or directories of them) beside the kernels. `arm64_cpu`: that one arm64 target
    with its own features instead of ARM64_LEVELS. Returns the levels built."""
    import subprocess
    import sys

    machine = machine or platform.machine()
    levels: list[tuple[str, str, tuple[str, ...]]]
    if machine in ("aarch64", "arm64"):
        levels = list(ARM64_LEVELS) if arm64_cpu is None else [(arm64_cpu, "", ())]
    elif machine in ("x86_64", "AMD64"):
        levels = [(name, "", requires) for name, requires in X86_LEVELS]
    else:
        levels = [("generic", "", ())]
    have = cpu_flags(machine=machine) if flags is None else flags
    os.makedirs(cache_dir, exist_ok=True)
    built: list[dict] = []
    for name, features, requires in levels:
        missing = [f for f in requires if f not in have]
        if missing:
            print(f"numba_cache build: skipping {name}: this build CPU lacks {' '.join(missing)} "
                  f"(build on a CPU that has them to include it)", flush=True)
            continue
        env = {**os.environ, "NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": features, "NUMBA_CACHE_DIR": cache_dir}
        subprocess.run([sys.executable, *warm], env=env, check=True)
        built.append(level_spec(name, requires, features))
    if not built:
        raise SystemExit(f"numba_cache build: no level of {[lv[0] for lv in levels]} runs on this CPU")
    with open(os.path.join(cache_dir, CPU_FILE), "w") as f:
        json.dump({"levels": built}, f)
    baked = gguf_files(models)
    if baked:      # one tokenizer cache for every level: its entries do not depend on the CPU
        env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
        env.pop("TOKENIZER_CACHE_DIR", None)
        subprocess.run([sys.executable, "-m", "function.numba_cache", "tokenizers", *baked], env=env, check=True)
    return [b["NUMBA_CPU_NAME"] for b in built]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m function.numba_cache")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the image's kernel cache, one per CPU level this machine runs")
    b.add_argument("--dir", default="/opt/numba-cache")
    b.add_argument("--arm64-cpu", default=None,
                   help="one arm64 target instead of the levels (neoverse-v1/-v2 with SVE: Graviton3/4 only)")
    b.add_argument("--models", nargs="*", default=[], help="baked-in .gguf files (or directories): their tokenizers too")
    t = sub.add_parser("tokenizers", help="build these models' tokenizers into TOKENIZER_CACHE_DIR / NUMBA_CACHE_DIR")
    t.add_argument("models", nargs="+")
    a = ap.parse_args()
    if a.cmd == "tokenizers":
        for row in cache_tokenizers(gguf_files(a.models)):
            print(json.dumps({"event": "tokenizer_cached", **row}), flush=True)
    else:
        print(json.dumps({"event": "numba_cache_build", "levels": build(a.dir, arm64_cpu=a.arm64_cpu, models=a.models)}))
