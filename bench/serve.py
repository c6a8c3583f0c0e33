"""`make bench-serve` (issue 55): our resident server and mainline's `llama-server` on the same file
and threads, under concurrent streams and under a Poisson arrival load.

    python -m bench.serve [--model M] [--threads 2] [--concurrency 1,4,16]
                          [--tokens 64] [--rate 0.5 --duration 60] [--no-llama]

The model defaults to the factory's 0.8B shape in Q4_K_M with Qwen3.5's real vocabulary (built
once into models/ when missing, as bench.coldstart does). Each server runs in a process of its own
on loopback. A request is ``POST /v1/completions`` with
``stream: true``, greedy, every end-of-generation token banned (``logit_bias`` -100, which both
servers take), so each writes exactly ``--tokens`` tokens; prompts differ per request (no prefix
reuse between them). Per concurrency level c: c clients each send requests back to back until
``--requests-per-client`` are done; reported: aggregate generated tokens/s over the wall time, the
time between a stream's tokens (p50/p99 over every gap of every stream), TTFT p50/p99. The Poisson
part sends requests at ``--rate`` per second for ``--duration`` seconds and reports TTFT and the
time between tokens while prompts keep arriving. `llama-server` comes from
``python -m bench.peers build-server`` (a cmake build of llama-cpp-python's sdist with the server
on, cached outside the work tree) and runs with ``-np`` = the highest concurrency. Receipt:
bench/results/serve-*.json.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("river stone lantern orbit meadow cipher harbor velvet quartz ember summit willow falcon "
         "prism canyon tundra saffron beacon glacier thicket").split()


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    sent_at: float
    first_at: float | None = None
    times: list[float] = field(default_factory=list)   # arrival of each chunk that carried text
    tokens: int = 0
    status: int | None = None
    error: str | None = None


def prompt(i: int, words: int = 48) -> str:
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" ({i})."


def one_request(host: str, port: int, body: dict, timeout: float = 600) -> Stream:
    s = Stream(time.monotonic())
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        s.status = r.status
        if r.status != 200:
            s.error = r.read()[:300].decode(errors="replace")
            return s
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            text = "".join(c.get("text") or "" for c in chunk.get("choices") or [])
            if text:
                now = time.monotonic()
                if s.first_at is None:
                    s.first_at = now
                s.times.append(now)
                s.tokens += 1
    except Exception as exc:        # recorded in the receipt
        s.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return s


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * (len(v) - 1))))]


def summarize(streams: list[Stream], wall_s: float, tokens: int) -> dict:
    ok = [s for s in streams if s.status == 200 and s.error is None and s.first_at is not None]
    gaps = [(b - a) * 1e3 for s in ok for a, b in zip(s.times, s.times[1:])]
    ttft = [(s.first_at - s.sent_at) * 1e3 for s in ok if s.first_at is not None]
    generated = sum(tokens for _ in ok)          # each wrote exactly `tokens` (end banned)
    return {"requests": len(streams), "ok": len(ok), "errors": [s.error for s in streams if s.error][:3],
            "wall_s": round(wall_s, 2), "aggregate_tok_s": round(generated / wall_s, 2) if wall_s else None,
            "tbt_ms_p50": _r(percentile(gaps, 50)), "tbt_ms_p99": _r(percentile(gaps, 99)),
            "ttft_ms_p50": _r(percentile(ttft, 50)), "ttft_ms_p99": _r(percentile(ttft, 99)),
            "chunks_per_stream": round(sum(s.tokens for s in ok) / len(ok), 1) if ok else None}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def closed_loop(host: str, port: int, bodies, concurrency: int, per_client: int, tokens: int) -> dict:
    """`concurrency` clients, each sending `per_client` requests back to back."""
    out: list[Stream] = []
    lock = threading.Lock()
    counter = iter(range(1_000_000))

    def client() -> None:
        for _ in range(per_client):
            with lock:
                i = next(counter)
            s = one_request(host, port, bodies(i))
            with lock:
                out.append(s)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"concurrency": concurrency, **summarize(out, time.monotonic() - t0, tokens)}


def poisson(host: str, port: int, bodies, rate: float, duration_s: float, tokens: int, seed: int = 0) -> dict:
    """Requests arriving at `rate` per second (exponential gaps) for `duration_s`."""
    rng = random.Random(seed)
    out: list[Stream] = []
    lock = threading.Lock()
    threads = []
    t0 = time.monotonic()
    i = 10_000
    at = t0
    while at - t0 < duration_s:
        delay = at - time.monotonic()
        if delay > 0:
            time.sleep(delay)

        def go(i=i) -> None:
            s = one_request(host, port, bodies(i))
            with lock:
                out.append(s)
        th = threading.Thread(target=go)
        th.start()
        threads.append(th)
        i += 1
        at += rng.expovariate(rate)
    for th in threads:
        th.join()
    return {"rate_per_s": rate, "duration_s": duration_s, **summarize(out, time.monotonic() - t0, tokens)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, path: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the server on port {port} was not ready in {timeout:g} s")


def start_ours(model: Path, threads: int, queue: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "MODEL_PATH": str(model), "WARMLLM_THREADS": str(threads), "SERVE_QUEUE": str(queue),
           "INIT_BUDGET_S": "600", "STREAM_DEADLINE_S": "890",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.Popen([sys.executable, "-m", "function.serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, "/health", proc)
    return proc, port


def start_llama(binary: Path, model: Path, threads: int, slots: int, ctx_per_slot: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads),
                             "-np", str(slots), "-c", str(slots * ctx_per_slot), "--host", "127.0.0.1",
                             "--port", str(port), "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, "/health", proc)
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def eog_bias(model: Path) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from engine.gguf_file import GGUFFile
    from engine.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf_metadata(GGUFFile(model).metadata)
    return {str(i): -100.0 for i in sorted(tok.eog_ids)}


def run_server(name: str, port: int, model: Path, args: argparse.Namespace, levels: list[int]) -> dict:
    bias = eog_bias(model)

    def bodies(i: int) -> dict:
        return {"model": "bench", "prompt": prompt(i), "max_tokens": args.tokens, "temperature": 0.0,
                "stream": True, "logit_bias": bias}
    one_request("127.0.0.1", port, bodies(999_999))           # warm: the first request of a process
    res: dict = {"server": name, "closed_loop": []}
    for c in levels:
        row = closed_loop("127.0.0.1", port, bodies, c, args.requests_per_client, args.tokens)
        res["closed_loop"].append(row)
        print(json.dumps({"server": name, **row}), flush=True)
    if args.rate > 0:
        res["poisson"] = poisson("127.0.0.1", port, bodies, args.rate, args.duration, args.tokens)
        print(json.dumps({"server": name, **res["poisson"]}), flush=True)
    return res


def default_model() -> Path:
    path = ROOT / "models" / "0.8b-Q4_K_M-qwen35.gguf"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "engine", "make-model", "--preset", "0.8b", "--weights", "Q4_K_M",
                        "--vocab", "qwen35", "--seed", "0", "--out", str(path)], cwd=ROOT, check=True)
    return path


def batch_settings() -> dict[str, str]:
    """The batching our server runs with: the environment's, else the defaults."""
    from engine import settings as S
    from function.serve import DEFAULT_MAX_NUM_SEQS

    defaults = {"WARMLLM_MAX_NUM_SEQS": DEFAULT_MAX_NUM_SEQS, "WARMLLM_BATCH_PREFILL_CHUNK": S.DEFAULT_BATCH_PREFILL_CHUNK,
                "WARMLLM_BATCH_EXACT": False, "WARMLLM_BATCH_PREFILL_RATIO": S.DEFAULT_BATCH_PREFILL_RATIO}
    return {k: os.environ.get(k, str(d).lower()) for k, d in defaults.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: the 0.8B shape, real vocabulary)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: skip)")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    model = Path(a.model).resolve() if a.model else default_model()
    levels = [int(x) for x in a.concurrency.split(",") if x.strip()]
    receipt: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpu": _cpu(), "machine": platform.machine(),
                     "threads": a.threads, "model": str(model.relative_to(ROOT)) if model.is_relative_to(ROOT)
                     else str(model), "tokens": a.tokens, "command": "python -m bench.serve " + " ".join(
                         argv if argv is not None else sys.argv[1:]), "servers": [],
                     # ours batches as the environment says (function/serve.py's defaults otherwise)
                     "ours_settings": batch_settings()}
    proc, port = start_ours(model, a.threads, queue=max(levels) * 2)
    try:
        receipt["servers"].append(run_server("warmllm", port, model, a, levels))
    finally:
        stop(proc)
    if not a.no_llama:
        from bench.peers import PEERS, server_binary

        binary = server_binary(PEERS["mainline"], "native")
        if not binary.is_file():
            print(f"llama-server is not built ({binary}): python -m bench.peers build-server", file=sys.stderr)
        else:
            proc, port = start_llama(binary, model, a.threads, max(levels), ctx_per_slot=512 + a.tokens * 2)
            try:
                receipt["servers"].append(run_server("llama-server", port, model, a, levels))
            finally:
                stop(proc)
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(receipt, indent=1) + "\n")
    print(f"receipt: {out}")
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
