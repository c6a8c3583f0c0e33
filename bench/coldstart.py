"""The cold start (issue 53): a fresh process per run, the Lambda handler module imported as
Lambda's init phase does, then the first request and one like it once warm.

    python -m bench.coldstart [--models tiny,0.8b-qwen35,real] [--runs 2] [--no-llama] [--out F]

Per model and per condition -- the model file's pages cold or warm in the page cache, the
kernel cache (NUMBA_CACHE_DIR, which holds the tokenizer cache too) empty or filled -- one child
process reports, from a clock started before its first import (the interpreter's own start,
~20-40 ms, is before it):

- ``import_to_ready_ms``: ``import function.app`` done (the module-level init: numba cache, model
  resolution, load, tokenizer, kernels, warm-up; the init line's stages beside it);
- ``first_ms`` / ``warm_ms``: a chat request of ~421 prompt tokens with ``max_tokens: 1`` (its
  first token), the first after init, then another of the same length and other words, so no
  prefix is reused; ``first_over_warm`` is their ratio (goal <= 1.15).

Pages go cold by ``/proc/sys/vm/drop_caches`` when the process may write it, else by
``posix_fadvise(POSIX_FADV_DONTNEED)`` on the model file and every kernel and tokenizer cache
file (the receipt says which). llama.cpp's load (``Llama(model_path)``) and first token of a
421-token prompt run beside it on the same file, threads and page-cache state, when its Python
binding is built (``python -m bench.build_llama native``; ``make bench-coldstart`` builds it).
The receipt goes to bench/results/coldstart-*.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import cpu_name

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TOKENS = 421
# ~1 token each with Qwen's vocabulary; the count is tuned to ~421 prompt tokens with its template
WORDS = ("river stone light window paper garden music orange silver cloud market winter forest "
         "engine letter bridge yellow castle dream honey planet rabbit summer ticket violin").split()


def _prompt(n_words: int, shift: int) -> str:
    return " ".join(WORDS[(i * 7 + shift) % len(WORDS)] for i in range(n_words))


def _event(text: str) -> dict:
    body = {"model": "warmllm", "messages": [{"role": "user", "content": text}], "max_tokens": 1,
            "temperature": 0, "reasoning_effort": "none"}
    return {"version": "2.0", "routeKey": "$default", "rawPath": "/v1/chat/completions", "rawQueryString": "",
            "headers": {"content-type": "application/json"}, "isBase64Encoded": False,
            "requestContext": {"http": {"method": "POST", "path": "/v1/chat/completions"}, "requestId": "bench"},
            "body": json.dumps(body)}


class _Ctx:
    aws_request_id = "bench-coldstart"

    def get_remaining_time_in_millis(self) -> int:
        return 600_000


# The child: a clock started before its first import (a `-m bench...` child would import the
# engine first, through bench/__init__.py), then the handler module, then the requests.
CHILD = """import time
T0 = time.perf_counter()
import function.app as app
READY = time.perf_counter()
import json, sys
from bench.coldstart import requests_after
print(json.dumps({"event": "coldstart_result", "result": requests_after(app, int(sys.argv[1]), T0, READY)}),
      flush=True)
"""


def requests_after(app: Any, words: int, t0: float, ready: float) -> dict:
    """In the child, once the handler module is imported (init done): the two requests."""
    out: dict = {"import_to_ready_ms": round((ready - t0) * 1e3, 1)}
    for key, shift in (("first", 0), ("warm", 3)):
        t = time.perf_counter()
        resp = app.handler(_event(_prompt(words, shift)), _Ctx())
        out[f"{key}_ms"] = round((time.perf_counter() - t) * 1e3, 1)
        body = json.loads(resp["body"])
        if resp.get("statusCode") != 200:
            out["error"] = body
            return out
        out["prompt_tokens"] = body["usage"]["prompt_tokens"]
    out["first_over_warm"] = round(out["first_ms"] / out["warm_ms"], 3)
    return out


def llama_child(model: str, threads: int) -> dict:
    """llama.cpp in this fresh process: load, then the first token of a 421-token prompt."""
    import numpy as np
    from llama_cpp import Llama

    from bench.llama_runner import logits_of
    t = time.perf_counter()
    llm = Llama(model_path=model, n_ctx=PROMPT_TOKENS + 16, n_batch=512, n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    out: dict = {"load_ms": round((time.perf_counter() - t) * 1e3, 1)}
    ids = np.random.default_rng(3).integers(0, min(llm.n_vocab(), 4000), PROMPT_TOKENS).tolist()
    t = time.perf_counter()
    llm.eval(ids)
    int(np.argmax(logits_of(llm)))
    out["first_token_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    return out


# ----------------------------------------------------------------------------- the parent

def drop_pages(paths: list[Path]) -> str:
    """Evict ``paths`` from the page cache: the whole cache when allowed, else file by file."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        pass
    for p in paths:
        for f in ([p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()] if p.is_dir() else []):
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "posix_fadvise"


def _run_child(args: list[str], env: dict) -> tuple[dict, list[dict]]:
    p = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    lines = []
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    result = next((x["result"] for x in lines if x.get("event") == "coldstart_result"), None)
    if result is None:
        return {"error": f"exit {p.returncode}: {p.stderr[-2000:]}"}, lines
    return result, lines


def _init_stages(lines: list[dict]) -> dict:
    init = next((x for x in lines if x.get("event") == "init"), {})
    return {k: v for k, v in init.items() if k.endswith("_ms") or k in ("phase", "restored")}


def models(names: list[str]) -> list[tuple[str, Path]]:
    """The models asked for that exist or can be made (the factory's); the real one when fetched."""
    out = []
    for name in names:
        if name == "tiny":
            path = ROOT / "models" / "tiny-Q4_K_M.gguf"
            args = ["--preset", "tiny", "--weights", "Q4_K_M"]
        elif name == "0.8b-qwen35":
            path = ROOT / "models" / "0.8b-Q4_K_M-qwen35.gguf"
            args = ["--preset", "0.8b", "--weights", "Q4_K_M", "--vocab", "qwen35"]
        elif name == "real":
            path = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
            if path.exists():
                out.append((name, path))
            continue
        else:
            raise SystemExit(f"--models: unknown model {name!r} (tiny, 0.8b-qwen35, real)")
        if not path.exists():
            subprocess.run([sys.executable, "-m", "engine", "make-model", *args, "--seed", "0", "--out", str(path)],
                           cwd=ROOT, check=True)
        out.append((name, path))
    return out


def measure(name: str, model: Path, threads: int, runs: int, llama: bool, words: int, cache_root: Path,
            pages_states: list[str], kernel_states: list[str]) -> dict:
    # "warm" kernels: the cache this shell uses (make sets NUMBA_CACHE_DIR), else one filled here
    warm_kernels = Path(os.environ.get("NUMBA_CACHE_DIR") or cache_root / "numba")
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_S3_URI", "AWS_LAMBDA_FUNCTION_NAME")}
    env.update(MODEL_PATH=str(model), WARMLLM_THREADS=str(threads), INIT_BUDGET_S="600",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    rows = []
    # the warm cache filled first (and its run discarded), so "warm" means what a second start sees
    _run_child(["-c", CHILD, str(words)], dict(env, NUMBA_CACHE_DIR=str(warm_kernels)))
    for pages in pages_states:
        for kernels in kernel_states:
            for r in range(runs):
                cold_dir = Path(tempfile.mkdtemp(prefix="numba-cold-", dir=cache_root))
                kdir = warm_kernels if kernels == "warm" else cold_dir
                how = drop_pages([model, kdir]) if pages == "cold" else "-"
                res, lines = _run_child(["-c", CHILD, str(words)], dict(env, NUMBA_CACHE_DIR=str(kdir)))
                shutil.rmtree(cold_dir, ignore_errors=True)
                rows.append({"pages": pages, "kernel_cache": kernels, "run": r, "evicted_by": how, **res,
                             "init": _init_stages(lines)})
                print(json.dumps({"model": name, **rows[-1]}), flush=True)
    out: dict = {"model": str(model.relative_to(ROOT)), "threads": threads, "rows": rows}
    if llama:
        lrows = []
        for pages in pages_states:
            for r in range(runs):
                how = drop_pages([model]) if pages == "cold" else "-"
                lenv = dict(env)
                if os.environ.get("WARMLLM_LLAMA_PATH"):
                    lenv["PYTHONPATH"] = os.pathsep.join([os.environ["WARMLLM_LLAMA_PATH"], env["PYTHONPATH"]])
                res, _ = _run_child(["-m", "bench.coldstart", "--llama-child", "--model", str(model),
                                     "--threads", str(threads)], lenv)
                lrows.append({"pages": pages, "run": r, "evicted_by": how, **res})
                print(json.dumps({"model": name, "llama_cpp": lrows[-1]}), flush=True)
        out["llama_cpp"] = lrows
    out["summary"] = summary(out)
    return out


def _best(rows: list[dict], key: str, **where: str) -> float | None:
    vals = [r[key] for r in rows if all(r.get(k) == v for k, v in where.items()) and isinstance(r.get(key), (int, float))]
    return min(vals) if vals else None


def summary(m: dict) -> dict:
    """Best of the runs per condition; the goals' ratios where both sides were measured."""
    s: dict = {}
    for pages in ("warm", "cold"):
        for kernels in ("warm", "cold"):
            tag = f"pages_{pages}_kernels_{kernels}"
            s[tag] = {k: _best(m["rows"], k, pages=pages, kernel_cache=kernels)
                      for k in ("import_to_ready_ms", "first_ms", "warm_ms", "first_over_warm")}
    if m.get("llama_cpp"):
        for pages in ("warm", "cold"):
            s[f"llama_cpp_pages_{pages}"] = {k: _best(m["llama_cpp"], k, pages=pages)
                                              for k in ("load_ms", "first_token_ms")}
        ours, theirs = s["pages_cold_kernels_warm"]["import_to_ready_ms"], s["llama_cpp_pages_cold"]["load_ms"]
        if ours and theirs:
            s["cold_pages_ready_over_llama_load"] = round(ours / theirs, 3)
    return s


def _llama_path() -> str | None:
    """Where llama.cpp's Python binding is: the bench's native build (bench/build_llama.py), else
    an installed one ("" when only that), else None."""
    from bench import build_llama
    if build_llama.is_built("native"):
        return str(build_llama.target_dir("native"))
    try:
        import llama_cpp  # noqa: F401
        return ""
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,0.8b-qwen35,real")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--words", type=int, default=400, help="prompt words (~421 tokens with Qwen's vocabulary)")
    ap.add_argument("--pages", default="warm,cold", help="page-cache states to run (warm, cold)")
    ap.add_argument("--kernels", default="warm,cold", help="kernel-cache states to run (warm, cold)")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--llama-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.llama_child:
        print(json.dumps({"event": "coldstart_result", "result": llama_child(a.model, a.threads)}), flush=True)
        return 0
    llama_path = None if a.no_llama else _llama_path()
    llama = llama_path is not None
    if llama_path:
        os.environ["WARMLLM_LLAMA_PATH"] = llama_path
    cache_root = Path(tempfile.mkdtemp(prefix="warmllm-coldstart-"))
    receipt: dict = {"date": dt.datetime.now().isoformat(timespec="seconds"), "cpu": cpu_name(), "threads": a.threads,
                     "command": "python -m bench.coldstart " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "llama_cpp": llama, "models": {}}
    try:
        for name, path in models(a.models.split(",")):
            receipt["models"][name] = measure(name, path, a.threads, a.runs, llama, a.words, cache_root,
                                              a.pages.split(","), a.kernels.split(","))
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"coldstart-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(receipt, indent=2))
    for name, m in receipt["models"].items():
        print(f"\n{name}: {json.dumps(m['summary'], indent=1)}")
    print(f"receipt: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
