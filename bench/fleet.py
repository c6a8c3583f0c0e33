"""`make bench-fleet` (issue 55): N resident servers on this machine sharing one S3 snapshot store
(a moto server on loopback), replaying an agent trace.

    python -m bench.fleet [--model M] [--servers 1,2,4] [--threads 2] [--conversations 12]
                          [--turns 3] [--systems 3] [--clients 4] [--tokens 16]

The trace: `--conversations` conversations, each opening with one of `--systems` long system
prompts (shared by many conversations, as an agent's instructions are) and growing over `--turns`
turns (each turn sends the whole history: the system prompt, every earlier question and reply,
the new question). `--clients` conversations run at once, each turn after the last one's reply.
Requests go to the servers in turn (a load balancer without affinity), so a conversation's next
turn usually lands on another server than its last, which finds the prefix in the shared store.
Each N starts fresh servers on a fresh store prefix (`--threads` split between them) and reports:
the prefill modes, the snapshot hit rate (requests that reused a prefix: restored from S3 or
memory, or extended), the prompt tokens reused, TTFT p50/p99 and aggregate generated tokens/s.
Receipt: bench/results/fleet-*.json.
"""
from __future__ import annotations

import argparse
import http.client
import itertools
import json
import logging
import os
import platform
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.serve import WORDS, _cpu, default_model, free_port, percentile, stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "fleet"
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
REUSED = ("snapshot_s3", "snapshot_memory", "snapshot_efs", "extend", "cached")


@dataclass
class Turn:
    """One request of the trace as the client saw it."""

    server: int
    sent_at: float
    first_at: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tokens: int = 0
    reply: str = ""
    error: str | None = None


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def system_prompt(i: int, n_words: int = 220) -> str:
    return f"You are agent {i}. Follow these instructions exactly. " + words(random.Random(f"system-{i}"), n_words)


def question(conv: int, turn: int) -> str:
    return f"Conversation {conv}, step {turn}: " + words(random.Random(f"q-{conv}-{turn}"), 24)


def chat(port: int, body: dict, server: int, timeout: float = 900) -> Turn:
    t = Turn(server, time.monotonic())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            t.error = f"{r.status}: {r.read()[:300].decode(errors='replace')}"
            return t
        parts: list[str] = []
        while line := r.readline():
            if not line.startswith(b"data: ") or line[6:].strip() == b"[DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                t.prompt_tokens = chunk["usage"]["prompt_tokens"]
                t.cached_tokens = chunk["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            for c in chunk.get("choices") or []:
                piece = (c.get("delta") or {}).get("content") or ""
                if piece or (c.get("delta") or {}).get("reasoning_content"):
                    if t.first_at is None:
                        t.first_at = time.monotonic()
                    t.tokens += 1
                parts.append(piece)
        t.reply = "".join(parts)
    except Exception as exc:        # recorded in the receipt
        t.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return t


def replay(ports: list[int], a: argparse.Namespace) -> dict:
    """The trace against `ports` (round robin), `a.clients` conversations at a time."""
    turns: list[Turn] = []
    lock = threading.Lock()
    pick = itertools.count()
    todo = iter(range(a.conversations))

    def conversation(c: int) -> None:
        history = [{"role": "system", "content": system_prompt(c % a.systems)}]
        for k in range(a.turns):
            history.append({"role": "user", "content": question(c, k)})
            with lock:
                server = next(pick) % len(ports)
            body = {"model": "bench", "messages": history, "max_tokens": a.tokens, "temperature": 0.0,
                    "stream": True, "stream_options": {"include_usage": True}}
            t = chat(ports[server], body, server)
            with lock:
                turns.append(t)
            if t.error is not None:
                return
            history.append({"role": "assistant", "content": t.reply})

    def client() -> None:
        while True:
            with lock:
                c = next(todo, None)
            if c is None:
                return
            conversation(c)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return summarize(turns, time.monotonic() - t0, prefill_modes(ports))


def prefill_modes(ports: list[int]) -> Counter:
    """The generations' prefill paths, summed over the servers' /metrics (a stream's response
    cannot say it: its headers go out before the prefill runs)."""
    modes: Counter = Counter()
    for port in ports:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        for m in re.finditer(r'^warmllm_prefill_total\{mode="([a-z_0-9]+)"\} ([0-9.e+]+)$', text, re.M):
            modes[m.group(1)] += int(float(m.group(2)))
    return modes


def summarize(turns: list[Turn], wall_s: float, modes: Counter) -> dict:
    ok = [t for t in turns if t.error is None and t.first_at is not None]
    ttft = [(t.first_at - t.sent_at) * 1e3 for t in ok if t.first_at is not None]
    prompt = sum(t.prompt_tokens for t in ok)
    return {"requests": len(turns), "ok": len(ok), "errors": [t.error for t in turns if t.error][:3],
            "wall_s": round(wall_s, 2), "modes": dict(sorted(modes.items(), key=lambda kv: str(kv[0]))),
            "hit_rate": round(sum(modes[m] for m in REUSED) / sum(modes.values()), 3) if modes else None,
            "s3_restores": modes["snapshot_s3"],
            "prompt_tokens": prompt, "reused_tokens": sum(t.cached_tokens for t in ok),
            "reused_share": round(sum(t.cached_tokens for t in ok) / prompt, 3) if prompt else None,
            "ttft_ms_p50": _r(percentile(ttft, 50)), "ttft_ms_p99": _r(percentile(ttft, 99)),
            "aggregate_tok_s": round(sum(t.tokens for t in ok) / wall_s, 2) if wall_s else None}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def start_server(model: Path, threads: int, env_extra: dict[str, str]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, **CREDS, **env_extra, "MODEL_PATH": str(model), "WARMLLM_THREADS": str(threads),
           "INIT_BUDGET_S": "600", "STREAM_DEADLINE_S": "890",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.Popen([sys.executable, "-m", "function.serve", "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, "/health", proc)
    except BaseException:
        stop(proc)
        raise
    return proc, port


def run(model: Path, levels: list[int], a: argparse.Namespace) -> list[dict]:
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)   # moto's server logs every request
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    rows = []
    try:
        url = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        for n in levels:
            env = {"SNAPSHOT_S3_URI": f"s3://{BUCKET}/n{n}-{int(time.time())}", "SNAPSHOT_S3_ENDPOINT_URL": url}
            procs: list[subprocess.Popen] = []
            ports: list[int] = []
            try:
                for _ in range(n):
                    proc, p = start_server(model, max(1, a.threads // n), env)
                    procs.append(proc)
                    ports.append(p)
                row = {"servers": n, "threads_each": max(1, a.threads // n), **replay(ports, a)}
            finally:
                for p in procs:
                    stop(p)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        moto.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: the 0.8B shape, real vocabulary)")
    ap.add_argument("--servers", default="1,2,4")
    ap.add_argument("--threads", type=int, default=2, help="split between the servers of a level")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--systems", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    model = Path(a.model).resolve() if a.model else default_model()
    levels = [int(x) for x in a.servers.split(",") if x.strip()]
    receipt = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpu": _cpu(), "machine": platform.machine(),
               "threads": a.threads, "model": str(model.relative_to(ROOT)) if model.is_relative_to(ROOT)
               else str(model), "command": "python -m bench.fleet " + " ".join(
                   argv if argv is not None else sys.argv[1:]),
               "trace": {"conversations": a.conversations, "turns": a.turns, "systems": a.systems,
                         "clients": a.clients, "tokens": a.tokens},
               "levels": run(model, levels, a)}
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"fleet-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(receipt, indent=1) + "\n")
    print(f"receipt: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
