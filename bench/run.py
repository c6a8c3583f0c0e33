"""`make bench`: our engine and llama.cpp on the same 0.8B-shaped GGUFs, same threads, one run;
then the agent shape on the Q4_K_M model (`bench.agent_prefix`: turn 1, then (a) turn 2, (b)
another conversation with the same system + tools, (c) cold processes restoring from the
directory and from S3 over moto's server), `--agent-rounds` times, unpinned.

Builds the models if absent, runs each measurement in its own process (peak RSS and cold start
are per process), in up to three settings (`--modes`), prints a table and writes
bench/results/<stamp>.json:

- `native`: both sides on the host's own instruction set (ours: numba's host target and the
  kernels engine/quant/paths.py picks for it; llama.cpp built GGML_NATIVE=ON without AMX), with
  OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset, as on Lambda;
- `native-pinned`: the same with this machine's OpenBLAS pin left set;
- `avx2`: both held to x86-64-v3 — ours through NUMBA_CPU_NAME=x86-64-v3 *and* NUMBA_CPU_FEATURES
  with every feature above AVX2 off (the name alone keeps the host's features: numba's JIT
  takes its ISA from NUMBA_CPU_FEATURES, else the host), OpenBLAS pinned to Haswell; llama.cpp
  built GGML_NATIVE=OFF with AVX2/FMA/F16C and no AVX-512/AVX-VNNI (bench/build_llama.py).
  The name is x86-64-v3, not haswell: it is what the x86_64 image compiles for (Dockerfile,
  cpu.json), and generic tuning is what llama.cpp's -mavx2 build gets. Haswell's scheduling
  model made the parallel Q8_0 decode kernel 2.5-3x slower than its own serial twin on an
  Emerald Rapids host (same inner loop; docs/cpus.md), a cost no Lambda function pays.
- `image`: ours compiled as the image runs on this CPU (function/numba_cache.py X86_LEVELS: the
  best level the CPU has, `cascadelake` or `x86-64-v3`; on arm64 ARM64_LEVELS, neoverse-v1
  without SVE on Graviton3/4, neoverse-n1 on Graviton2), OpenBLAS unpinned; llama.cpp native.
  The only mode on arm64 (the default there).

Two peers, each built for the mode's variant (native, or avx2 for `avx2`) in
~/.cache/warmllm/peers (WARMLLM_PEERS_DIR; make bench builds them first, ~15-30 min each on 2
cores, reused after): mainline llama.cpp and ik_llama.cpp, each timed by its own `llama-bench -o
json` (bench/peers.py) in its best CPU options (recorded in the receipt), and mainline once more
through its Python binding (bench/llama_bench.py, from the same cache, else whatever `llama_cpp`
the venv has) for the figures llama-bench has no equivalent of (TTFT of the 421-token prompt,
token-by-token prefill, ready time, RSS). `ratios_vs_peers` is ours ÷ each peer for pp512, tg128
and both at each `--depths` context depth (default 4096: llama-bench -d / -gp, ours `engine
bench --depth`). `bandwidth` puts each decode against the host's read bandwidth (bench/bandwidth.py,
measured once per receipt with the bench's threads): bytes read per token × tok/s ÷ bandwidth.

The two sides alternate (ours, llama.cpp, ours, llama.cpp: `--rounds`) and each figure is the
best over the rounds: on this shared machine the load drifts over minutes, and measuring one
side after the other put that drift into the ratio (a TTFT ratio moved 0.96 -> 1.12 between
two settings of one run). Every round's raw figures are kept in the receipt.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import cpu_name

ROOT = Path(__file__).resolve().parents[1]
PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
KEYS = ["pp_tok_s", "pp2048_tok_s", "tg_tok_s", "ttft_ms", "token_by_token_prefill_tok_s", "peak_rss_mb", "ready_ms",
        "load_ms"]


def _py(args: list[str], env: dict) -> dict:
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _blas_info(env: dict) -> str:
    code = ("import json, numpy, threadpoolctl\n"
            "print(json.dumps([{k: i.get(k) for k in ('internal_api','architecture','num_threads')} "
            "for i in threadpoolctl.threadpool_info() if i.get('user_api') == 'blas']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return r.stdout.strip() or r.stderr.strip()[-200:]


def _cpu_flags() -> list[str]:
    """The host's x86 SIMD flags that decide the kernels (AMX listed: the VM may withhold it)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].split()
                return sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "asimd", "sve", "i8mm", "bf16")))
    except OSError:
        pass
    return []


def _mode_env(mode: str, threads: int) -> tuple[dict, str]:
    """(environment, llama.cpp build variant) for a bench mode."""
    from bench import build_llama

    env = dict(os.environ, WARMLLM_THREADS=str(threads))
    variant = "avx2" if mode == "avx2" else "native"
    if mode in ("native", "image"):
        for k in PINS:
            env.pop(k, None)
    if mode == "image":
        from function import numba_cache

        if platform.machine() in ("aarch64", "arm64"):  # a real Graviton: the level its image start picks
            level = numba_cache.best_arm64_level(numba_cache.cpu_flags())
            where = "arm64"
        else:
            level = numba_cache.best_x86_level(numba_cache.cpu_flags())
            where = "x86_64"
        if level is None:
            raise SystemExit(f"--modes image: this CPU runs none of the {where} image's levels")
        env.update(NUMBA_CPU_NAME=level["NUMBA_CPU_NAME"], NUMBA_CPU_FEATURES=level["NUMBA_CPU_FEATURES"])
    if mode == "native-pinned":
        env.setdefault("OPENBLAS_CORETYPE", "Haswell")
    if mode == "avx2":
        from engine.quant import paths
        env.update(NUMBA_CPU_NAME="x86-64-v3", NUMBA_CPU_FEATURES=paths.features_flag_string(paths.X86_64_V3),
                   OPENBLAS_CORETYPE="Haswell")
    if build_llama.is_built(variant):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(build_llama.target_dir(variant)), env.get("PYTHONPATH")) if p)
    return env, variant


HIGHER_IS_BETTER = ("pp_tok_s", "pp2048_tok_s", "tg_tok_s", "token_by_token_prefill_tok_s")
LOWER_IS_BETTER = ("ttft_ms", "ready_ms", "load_ms", "compile_ms")


def best_of(rounds: list[dict]) -> dict:
    """One side's figures over the rounds: the best of each speed figure, the largest peak RSS."""
    ok = [r for r in rounds if "error" not in r] or rounds[:1]
    out = dict(ok[0])
    for k in out:
        vals = [r[k] for r in ok if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        if not vals:
            continue
        if k in HIGHER_IS_BETTER:
            out[k] = max(vals)
        elif k in LOWER_IS_BETTER:
            out[k] = min(vals)
        elif k == "peak_rss_mb":
            out[k] = max(vals)
    if "batched_over_token_by_token" in out:  # of the figures reported, not the best ratio
        out["batched_over_token_by_token"] = round(out["pp_tok_s"] / out["token_by_token_prefill_tok_s"], 2)
    return out


def measure(model: Path, threads: int, p: int, n: int, env: dict, with_llama: bool, rounds: int,
            extra_pp: str = "2048", quick: bool = False, variant: str = "native",
            depths: tuple[int, ...] = (), peer_repetitions: int = 3) -> dict:
    """`quick` (--large): load, ready, pp, tg and peak RSS only, no empty-cache cold start.
    Each round also runs every peer's llama-bench built for `variant` (bench/peers.py; its
    ``-r peer_repetitions``), and ours and theirs at each context depth in `depths`."""
    from bench import peers as peers_mod

    built = {k: pr for k, pr in peers_mod.PEERS.items() if peers_mod.is_built(pr, variant)}
    peer_runs: dict[str, list[dict]] = {k: [] for k in built}
    depth_runs: dict[int, list[dict]] = {d: [] for d in depths}
    common = ["--model", str(model), "-p", str(p), "-n", str(n), "--extra-pp", extra_pp, "--threads", str(threads),
              "--repeat", "1", "--json"] + (["--no-ttft", "--tbt", "0"] if quick else [])
    ours_runs, theirs_runs = [], []
    # one discarded run first, so no measured process compiles kernels: a compiling process's
    # RSS includes LLVM's (~190 MB: 20261201-082416 reported 1124 MB for Q4_K_M from the round
    # that compiled after a source change, 929 MB for the warm one)
    _py(["-m", "engine", "bench", "--model", str(model), "-p", "64", "-n", "4", "--threads", str(threads),
         "--repeat", "1", "--json"], env)
    for _ in range(rounds):
        ours_runs.append(_py(["-m", "engine", "bench", *common], env))
        if with_llama:
            theirs_runs.append(_py(["-m", "bench.llama_bench", *common], env))
        for d in depths:
            depth_runs[d].append(_py(["-m", "engine", "bench", "--model", str(model), "-p", str(p), "-n", str(n),
                                      "--threads", str(threads), "--repeat", "1", "--no-ttft", "--tbt", "0",
                                      "--depth", str(d), "--json"], env))
        for key, peer in built.items():
            r = peers_mod.run(peer, variant, str(model), threads, p, n, repetitions=peer_repetitions)
            for d in depths:
                at = peers_mod.run(peer, variant, str(model), threads, p, n, depth=d, repetitions=peer_repetitions)
                r.setdefault("figures", {}).update(at.get("figures", {}))
                if "error" in at:
                    r.setdefault("errors", []).append(at["error"])
            peer_runs[key].append(r)
    ours = best_of(ours_runs)
    for d in depths:
        best = best_of(depth_runs[d])
        for k in ("pp_tok_s", "tg_tok_s"):
            if isinstance(best.get(k), (int, float)):
                ours[f"{k}@d{d}"] = best[k]
    if not quick:
        # cold start with an empty kernel cache: every kernel compiles
        cold_env = dict(env, NUMBA_CACHE_DIR=tempfile.mkdtemp(prefix="numba-cold-"))
        cold = _py(["-m", "engine", "bench", "--model", str(model), "-p", "64", "-n", "4", "--threads", str(threads),
                    "--json"], cold_env)
        shutil.rmtree(cold_env["NUMBA_CACHE_DIR"], ignore_errors=True)
        ours["cold_start_ms_empty_cache"] = cold.get("ready_ms")
    ours["cold_start_ms_warm_cache"] = ours.get("ready_ms")
    row = {"ours": ours, "rounds": {"ours": ours_runs}}
    if with_llama:
        theirs = best_of(theirs_runs)
        row["llama_cpp"] = theirs
        row["rounds"]["llama_cpp"] = theirs_runs
        ratios = {}
        for k in ("pp_tok_s", "pp2048_tok_s", "tg_tok_s", "token_by_token_prefill_tok_s"):
            if isinstance(ours.get(k), (int, float)) and isinstance(theirs.get(k), (int, float)):
                ratios[k] = round(ours[k] / theirs[k], 3)
        for k in ("ttft_ms", "peak_rss_mb"):  # lower is better: ours / theirs
            if isinstance(ours.get(k), (int, float)) and isinstance(theirs.get(k), (int, float)):
                ratios[k] = round(ours[k] / theirs[k], 3)
        row["ratios"] = ratios
    if built:
        row["peers"] = {k: peer_summary(runs) for k, runs in peer_runs.items()}
        row["rounds"]["peers"] = peer_runs
        row["ratios_vs_peers"] = {k: peer_ratios(ours, v["figures"], p, n, depths) for k, v in row["peers"].items()}
    if depths:
        row["rounds"]["ours_depth"] = {str(d): runs for d, runs in depth_runs.items()}
    return row


def peer_summary(runs: list[dict]) -> dict:
    """One peer over the rounds: what ran (engine, package, variant, options) and the best of each
    llama-bench figure (every figure is a rate)."""
    ok = [r for r in runs if r.get("figures")]
    if not ok:
        return {"error": next((r["error"] for r in runs if "error" in r), "no rounds")}
    out = {k: ok[0][k] for k in ("engine", "package", "variant", "options") if k in ok[0]}
    keys = sorted({k for r in ok for k in r["figures"]})
    out["figures"] = {k: max(r["figures"][k] for r in ok if k in r["figures"]) for k in keys}
    return out


def peer_ratios(ours: dict, figures: dict, p: int, n: int, depths: tuple[int, ...] = ()) -> dict:
    """Ours ÷ a peer for each figure both have: pp{p}, tg{n} and both at each depth (higher is
    better on both sides: these are rates)."""
    pairs = {f"pp{p}": "pp_tok_s", f"tg{n}": "tg_tok_s"}
    for d in depths:
        pairs[f"pp{p}@d{d}"] = f"pp_tok_s@d{d}"
        pairs[f"tg{n}@d{d}"] = f"tg_tok_s@d{d}"
    out = {}
    for theirs, mine in pairs.items():
        a, b = ours.get(mine), figures.get(theirs)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
            out[theirs] = round(a / b, 3)
    return out


def bandwidth_figures(model: Path, ours: dict, peers: dict, n: int, bandwidth: float) -> dict:
    """Decode as a share of the host's read bandwidth: bytes read per token x tok/s ÷ bandwidth,
    ours and each peer's tg on the same file (bench/bandwidth.py)."""
    from bench.bandwidth import decode_bytes_per_token, fraction

    bpt = decode_bytes_per_token(model)
    out: dict = {"decode_bytes_per_token": bpt, "read_gb_s": round(bandwidth / 1e9, 2)}
    if isinstance(ours.get("tg_tok_s"), (int, float)):
        out["ours"] = fraction(bpt, ours["tg_tok_s"], bandwidth)
    for key, peer in peers.items():
        tg = peer.get("figures", {}).get(f"tg{n}")
        if isinstance(tg, (int, float)):
            out[key] = fraction(bpt, tg, bandwidth)
    return out



AGENT_GOALS = {"a": 0.10, "b": 0.10, "c_dir": 0.25, "c_s3": 0.25}  # TTFT / turn 1's (issue 2)


def agent_rounds(model: Path, env: dict, rounds: int) -> list[dict]:
    """`python -m bench.agent_prefix --model M --s3`, `rounds` times, each in its own process."""
    out = []
    for _ in range(rounds):
        r = subprocess.run([sys.executable, "-m", "bench.agent_prefix", "--model", str(model), "--s3"],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        start = r.stdout.find("{")
        try:
            out.append(json.loads(r.stdout[start:]) if r.returncode == 0 and start >= 0 else
                       {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]})
        except ValueError:
            out.append({"error": "unreadable output: " + r.stdout[-200:]})
    return out


def agent_summary(runs: list[dict]) -> dict:
    """The agent shape over its rounds: per case the median of its TTFT ÷ turn 1's (with the
    range), the goal and whether the median meets it, and the snapshot sizes and restore times."""
    ok = [r for r in runs if "ratios" in r]
    if not ok:
        return {"error": next((r["error"] for r in runs if "error" in r), "no rounds")}
    out: dict = {"rounds": len(ok), "turn1_ttft_ms": statistics.median(r["turn1"]["ttft_ms"] for r in ok)}
    for case, goal in AGENT_GOALS.items():
        vals = sorted(r["ratios"][case] for r in ok if case in r["ratios"])
        if vals:
            med = round(statistics.median(vals), 4)
            out[case] = {"median_ratio": med, "min": vals[0], "max": vals[-1], "goal": goal, "met": med <= goal,
                         "restore_ms": statistics.median(r[case]["restore_ms"] for r in ok if case in r["ratios"]),
                         "prefilled_tokens": ok[0][case]["prefilled_tokens"], "mode": ok[0][case]["mode"]}
    sizes = sorted({w["bytes"] for r in ok for w in r.get("snapshot_writes", [])})
    out["snapshot_bytes"] = {"min": sizes[0], "max": sizes[-1]} if sizes else None
    return out

# `--large` (not in the default run): Qwen3.5-4B and -9B shapes in the files that fit Lambda's
# 10 GB with room for the KV cache. Load time, ready time, peak RSS, pp512 and tg128 against
# llama.cpp, native mode; no pp2048, TTFT, token-by-token rate, empty-cache cold start, agent
# shape or constrained decoding (at 2 threads a 9B prefill of 512 tokens is a minute or more).
# `--large-only 9b:IQ4_XS,...` measures some of them.
LARGE_RUNS = (("4b", "Q4_K_M"), ("9b", "Q3_K_M"), ("9b", "IQ4_XS"))
KV_GOAL_TOKENS = 8192  # the RSS goal: peak RSS <= 1.1 x (file + K/V for this many tokens)


def default_modes(machine: str | None = None) -> str:
    """x86_64: native, avx2 (the floor Lambda promises), native-pinned. arm64 (a real Graviton,
    docs/arm64.md's recipe): `image`, ours as the image's kernels for this Graviton (numba's host
    target there would be SVE code, which its LLVM miscompiles), llama.cpp native."""
    return "image" if (machine or platform.machine()) in ("aarch64", "arm64") else "native,avx2,native-pinned"


@dataclass(frozen=True)
class Plan:
    runs: tuple[tuple[str, str], ...]   # (preset, weights)
    modes: tuple[str, ...]
    extra_pp: str
    agent_rounds: int
    constrained_rounds: int = 0
    quick: bool = False                 # measure(quick=True)
    depths: tuple[int, ...] = ()        # context depths for the pp/tg rows (engine bench --depth)


def plan(a: argparse.Namespace) -> Plan:
    """What a `bench.run` invocation measures."""
    if a.large:
        modes = ("native",) if a.modes is None else tuple(a.modes.split(","))
        runs = LARGE_RUNS
        if a.large_only:
            want = [tuple(r.split(":", 1)) for r in a.large_only.split(",")]
            unknown = [":".join(r) for r in want if r not in LARGE_RUNS]
            if unknown:
                raise SystemExit(f"--large-only {','.join(unknown)}: choose from "
                                 + ",".join(":".join(r) for r in LARGE_RUNS))
            runs = tuple(r for r in LARGE_RUNS if r in want)
        return Plan(runs, modes, "", 0, 0, quick=True)
    modes = tuple((a.modes or default_modes()).split(","))
    depths = tuple(int(d) for d in str(getattr(a, "depths", "") or "").split(",") if d.strip())
    real = getattr(a, "real", "")
    runs = () if real == "only" else tuple((a.preset, w) for w in a.weights.split(","))
    if real:
        runs += ((REAL_PRESET, "Q4_K_M"),)
    agent, constrained = (0, 0) if real == "only" else (a.agent_rounds, a.constrained_rounds)
    return Plan(runs, modes, "2048", agent, constrained, depths=depths)


# `--real` / `--real only`: the one trained model here (make real-model: Qwen2.5-Coder-0.5B-Instruct,
# the dense qwen2 family, a Q4_K_M mix that is mostly Q5_0) beside or instead of the factory files
REAL_PRESET = "real"


def model_path(preset: str, weights: str) -> Path:
    """The file a run measures: the factory's models/<preset>-<weights>.gguf (built if absent), or
    the real model (fetched and verified if absent)."""
    if preset == REAL_PRESET:
        from function import real_model

        out = ROOT / real_model.DEFAULT_OUT
        if not out.is_file():
            real_model.link(real_model.fetch(), out)
        return out
    model = ROOT / "models" / f"{preset}-{weights}.gguf"
    if not model.exists():
        subprocess.run([sys.executable, "-m", "engine", "make-model", "--preset", preset, "--weights", weights,
                        "--seed", "0", "--out", str(model)], check=True, cwd=ROOT)
    return model


def kv_bytes(model: Path, tokens: int) -> int:
    """Bytes of our K/V cache (f32, engine/state.py) for `tokens` positions of this model."""
    from engine.gguf_file import GGUFFile
    from engine.models.qwen35 import Qwen35Config

    c = Qwen35Config.from_gguf(GGUFFile(str(model)))
    n_attn = sum(1 for il in range(c.n_layer) if not c.is_recurrent(il))
    return 2 * n_attn * c.n_head_kv * c.head_dim * 4 * tokens


def rss_goal(run: dict, model: Path, p: int) -> dict:
    """The 9B RSS goal's figures: the budget 1.1 x (file + K/V for KV_GOAL_TOKENS), our peak as
    measured (the bench's longest context is `p` tokens) and that peak with the K/V grown to
    KV_GOAL_TOKENS (what the same process would hold at 8k tokens: the rest does not grow)."""
    kv_goal, kv_used = kv_bytes(model, KV_GOAL_TOKENS), kv_bytes(model, p)
    budget = 1.1 * (run["model_bytes"] + kv_goal)
    out: dict = {"kv_tokens": KV_GOAL_TOKENS, "kv_bytes": kv_goal, "budget_mb": round(budget / 2**20, 1)}
    peak = run.get("ours", {}).get("peak_rss_mb")
    if isinstance(peak, (int, float)):
        at_goal = peak + (kv_goal - kv_used) / 2**20
        out.update(peak_rss_mb=peak, peak_rss_mb_at_kv_tokens=round(at_goal, 1),
                   ratio=round(at_goal * 2**20 / (run["model_bytes"] + kv_goal), 3), met=at_goal * 2**20 <= budget)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="0.8b")
    ap.add_argument("--weights", default="Q4_K_M,Q8_0")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=2, help="alternating ours / llama.cpp runs; best of them")
    ap.add_argument("--peer-repetitions", type=int, default=3,
                    help="each peer's llama-bench -r per round (1 for a long prompt: three 32k-token "
                         "prefills take ~10 min per peer on 2 cores)")
    ap.add_argument("--agent-rounds", type=int, default=3, help="agent-shape runs on Q4_K_M (0: skip)")
    ap.add_argument("--constrained-rounds", type=int, default=2,
                    help="decode with a JSON schema vs unconstrained on Q4_K_M with Qwen3.5's vocabulary "
                         "(bench.constrained; 0: skip)")
    ap.add_argument("--modes", default=None,
                    help="comma-separated: native, native-pinned, avx2, image (see the module docstring); "
                         "default native,avx2,native-pinned on x86_64, image on arm64 (--large: native)")
    ap.add_argument("--real", nargs="?", const="also", default="", choices=["also", "only"],
                    help="the real model (make real-model) beside the factory files; `--real only`: it alone")
    ap.add_argument("--large", action="store_true",
                    help="4B Q4_K_M, 9B Q3_K_M and 9B IQ4_XS (LARGE_RUNS) instead of --preset/--weights")
    ap.add_argument("--large-only", default="", help="with --large: some of LARGE_RUNS, e.g. 4b:Q4_K_M,9b:IQ4_XS")
    ap.add_argument("--depths", default="4096",
                    help="context depths for pp/tg rows, ours and both peers (comma-separated; '' none; "
                         "add 32768 for an agent's long session)")
    return ap.parse_args(argv)


def main() -> int:
    a = parse_args()
    pl = plan(a)
    from bench import build_llama

    with_llama = any(build_llama.is_built(v) for v in build_llama.VARIANTS)
    if not with_llama:
        try:
            import llama_cpp  # noqa: F401
            with_llama = True
        except ImportError:
            print("llama_cpp is not installed: printing our figures alone (python -m bench.build_llama)", file=sys.stderr)
    from bench.bandwidth import read_bandwidths

    probes = read_bandwidths(a.threads)
    bandwidth = max(probes.values())
    receipt = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "cpu": cpu_name(),
               "cpu_flags": _cpu_flags(), "machine": platform.machine(), "threads": a.threads, "rounds": a.rounds,
               "read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
               "read_bandwidth_probes_gb_s": {k: round(v / 1e9, 2) for k, v in probes.items()},
               "depths": list(pl.depths), "runs": [],
               "large": a.large}
    for preset, weights in pl.runs:
        model = model_path(preset, weights)
        for mode in pl.modes:
            env, variant = _mode_env(mode, a.threads)
            run = {"weights": weights, "model": str(model.relative_to(ROOT)), "mode": mode,
                   "openblas_pinned": "OPENBLAS_CORETYPE" in env, "pins": {k: env.get(k) for k in PINS},
                   "numba_cpu_name": env.get("NUMBA_CPU_NAME"), "numba_cpu_features": env.get("NUMBA_CPU_FEATURES"),
                   "llama_cpp_build": variant, "blas": _blas_info(env)}
            run["preset"] = preset
            run["model_bytes"] = model.stat().st_size
            run["load_average_before"] = os.getloadavg()
            run.update(measure(model, a.threads, a.p, a.n, env, with_llama, a.rounds, pl.extra_pp, pl.quick,
                               variant, pl.depths, a.peer_repetitions))
            run["load_average_after"] = os.getloadavg()
            run["bandwidth"] = bandwidth_figures(model, run["ours"], run.get("peers", {}), a.n, bandwidth)
            if a.large:
                run["rss_goal"] = rss_goal(run, model, a.p)
            receipt["runs"].append(run)
            _print(run)
    agent_model = ROOT / "models" / f"{a.preset}-Q4_K_M.gguf"
    if pl.agent_rounds > 0 and agent_model.exists():
        env = {k: v for k, v in os.environ.items() if k not in PINS}
        env["WARMLLM_THREADS"] = str(a.threads)
        runs = agent_rounds(agent_model, env, pl.agent_rounds)
        receipt["agent_prefix"] = {"model": str(agent_model.relative_to(ROOT)), "summary": agent_summary(runs),
                                   "rounds": runs}
        _print_agent(receipt["agent_prefix"]["summary"])
    if pl.constrained_rounds > 0:
        receipt["constrained"] = constrained(a.preset, a.threads, a.constrained_rounds)
        c = receipt["constrained"]
        print(f"\nconstrained decoding ({c.get('model')}): json_schema {c.get('json_schema_tok_s')} tok/s vs "
              f"free {c.get('free_tok_s')} (ratio {c.get('ratio')}, goal >= 0.9), mask "
              f"{c.get('mask_ms_per_token')} ms/token, {c.get('tools')}-tool grammar compile "
              f"{c.get('tools_compile_ms')} ms (goal <= 50), trie build {c.get('trie_build_ms')} ms")
        if "error" in c:
            print(f"constrained run failed: {c['error']}")
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(receipt, indent=2))
    print(f"receipt: {out}")
    return 0


def constrained(preset: str, threads: int, rounds: int) -> dict:
    """bench.constrained in its own process on the Q4_K_M model with the real vocabulary (the
    factory vocabulary's fillers would make the mask look free), unpinned as on Lambda."""
    model = ROOT / "models" / f"{preset}-Q4_K_M-qwen35.gguf"
    if not model.exists():
        subprocess.run([sys.executable, "-m", "engine", "make-model", "--preset", preset, "--weights", "Q4_K_M",
                        "--vocab", "qwen35", "--seed", "0", "--out", str(model)], check=True, cwd=ROOT)
    env = {k: v for k, v in os.environ.items() if k not in PINS}
    env["WARMLLM_THREADS"] = str(threads)
    return _py(["-m", "bench.constrained", "--model", str(model.relative_to(ROOT)), "--rounds", str(rounds),
                "--threads", str(threads)], env)


def _print(run: dict) -> None:
    print(f"\n{run['weights']}  mode={run['mode']}  OPENBLAS pinned={run['openblas_pinned']}  blas={run['blas']}")
    print(f"kernels: {run['ours'].get('kernels')}")
    print(f"{'metric':32s} {'ours':>12s} {'llama.cpp':>12s} {'ratio':>8s}")
    for k in KEYS + ["cold_start_ms_empty_cache", "cold_start_ms_warm_cache"]:
        o = run["ours"].get(k, "")
        t = run.get("llama_cpp", {}).get(k, "")
        r = run.get("ratios", {}).get(k, "")
        print(f"{k:32s} {str(o):>12s} {str(t):>12s} {str(r):>8s}")
    for side in ("ours", "llama_cpp"):
        if "error" in run.get(side, {}):
            print(f"{side} failed: {run[side]['error']}")
    for key, peer in run.get("peers", {}).items():
        if "error" in peer:
            print(f"{key} failed: {peer['error']}")
            continue
        ratios = run.get("ratios_vs_peers", {}).get(key, {})
        print(f"{peer['engine']} ({peer['package']}, {peer['variant']}, {' '.join(peer['options'])}) llama-bench:")
        for k, v in peer["figures"].items():
            print(f"  {k:30s} {v:>12.2f}   ours/theirs {ratios.get(k, '')}")
    bw = run.get("bandwidth", {})
    print(f"decode reads {bw.get('decode_bytes_per_token')} bytes/token; share of {bw.get('read_gb_s')} GB/s read "
          f"bandwidth: " + ", ".join(f"{k} {v}" for k, v in bw.items() if k not in ("decode_bytes_per_token", "read_gb_s")))


def _print_agent(summary: dict) -> None:
    print(f"\nagent shape (Q4_K_M, unpinned): turn 1 TTFT {summary.get('turn1_ttft_ms')} ms, "
          f"{summary.get('rounds')} rounds, snapshots {summary.get('snapshot_bytes')} bytes")
    if "error" in summary:
        print(f"agent shape failed: {summary['error']}")
    for case in AGENT_GOALS:
        if case in summary:
            c = summary[case]
            print(f"  {case:6s} {c['mode']:16s} prefilled {c['prefilled_tokens']:4d}  ratio {c['median_ratio']:.3f} "
                  f"({c['min']:.3f}-{c['max']:.3f}), goal <= {c['goal']}: {'met' if c['met'] else 'MISSED'}, "
                  f"restore {c['restore_ms']} ms")


if __name__ == "__main__":
    sys.exit(main())
