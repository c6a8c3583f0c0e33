"""The agent shape: a 421-token system + tools prompt, then what reuse buys.

    python -m bench.agent_prefix --model models/0.8b-Q4_K_M.gguf [--s3] [--tokens 421]

Measures time to first token (TTFT = tokenize + restore + prefill, i.e. until the first
token's logits exist; model load excluded) for
  turn1  a fresh instance, nothing stored
  a      turn 2 of the same conversation on the same instance        (goal ≤ 10% of turn1)
  b      a different conversation, same system + tools, same instance (goal ≤ 10%)
  c_dir  a cold process restoring the prefix from the directory tier (goal ≤ 25%)
  c_s3   a cold process restoring it from S3 (moto server over HTTP; --s3)  (goal ≤ 25%)
and prints one JSON object with TTFTs, ratios, modes, bytes per snapshot and restore ms.

The factory models have random weights, so the assistant reply is scripted (a fixed text
fed through the sampler); the timing path is the real one. Pending snapshot writes are
flushed before each measured request. moto's server is far slower than S3 (one Python
process serving HTTP), so c_s3 over-states S3's restore time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SYSTEM_SENTENCE = ("You are an operations agent for a fleet of serverless functions. Use the tools to inspect "
                   "logs, metrics and deployments before answering, and cite what you found. ")
TOOLS = [
    {"type": "function", "function": {"name": "query_logs", "description": "Run a CloudWatch Logs Insights query",
                                      "parameters": {"type": "object", "properties": {
                                          "log_group": {"type": "string"}, "query": {"type": "string"},
                                          "minutes": {"type": "integer"}}, "required": ["log_group", "query"]}}},
    {"type": "function", "function": {"name": "get_metric", "description": "Read one CloudWatch metric",
                                      "parameters": {"type": "object", "properties": {
                                          "namespace": {"type": "string"}, "name": {"type": "string"},
                                          "stat": {"type": "string", "enum": ["p50", "p99", "Sum"]}},
                                          "required": ["namespace", "name"]}}},
]
USER_1 = "Why did the p99 latency of the checkout function jump this morning?"
REPLY_1 = "I should look at the logs first.\n</think>\n\nThe p99 rose after the 09:12 deployment."
USER_2 = "Roll it back?"
USER_B = "List the functions whose error rate rose in the last hour."
USER_C = "Which deployment changed the memory size yesterday?"


def _messages(eng, n_tokens: int) -> list[dict]:
    """System message sized so that system + tools + first user turn is ~n_tokens tokens."""
    words = (SYSTEM_SENTENCE * 200).split()
    lo, hi = 1, len(words)
    while lo < hi:  # the largest system text whose prompt fits n_tokens
        mid = (lo + hi + 1) // 2
        msgs = [{"role": "system", "content": " ".join(words[:mid])}, {"role": "user", "content": USER_1}]
        if len(eng.tokenizer.encode(eng.render_chat(msgs, tools=TOOLS))) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return [{"role": "system", "content": " ".join(words[:lo])}, {"role": "user", "content": USER_1}]


def _script(eng, text: str) -> None:
    import engine.generate as gen
    from engine.synthetic.scripted import ScriptedSampler

    ids = eng.tokenizer.encode(text, add_special=False)
    end = eng.tokenizer.token_id("<|im_end|>")
    gen.Sampler = lambda params: ScriptedSampler(ids, end)


def _run(eng, messages, reply="Done.") -> dict:
    # Earlier requests' background writes would share the CPU (and, with moto's in-process
    # server, the GIL) with this one: let them finish first, outside the measurement.
    eng.flush_snapshots(600)
    _script(eng, reply)
    t0 = time.perf_counter()
    cp = eng.chat_prompt(messages, tools=TOOLS)
    render_ms = (time.perf_counter() - t0) * 1e3
    r = eng.generate(cp, max_tokens=64)
    p = r.prefill
    return {"ttft_ms": round(render_ms + r.tokenize_ms + p.prefill_ms, 1), "mode": p.mode,
            "prompt_tokens": r.prompt_tokens, "reused_tokens": p.reused_tokens,
            "prefilled_tokens": p.prefilled_tokens, "restore_ms": round(p.restore_ms, 1),
            "prefill_ms": round(p.prefill_ms, 1), "snapshot_tier": p.snapshot_tier,
            "snapshot_bytes": p.snapshot_or_checkpoint_bytes, "text": r.text}


def child(args) -> int:
    """A cold process: load, then one request."""
    from engine.generate import Engine
    from engine.settings import Settings

    t0 = time.perf_counter()
    eng = Engine.load(args.model, settings=Settings.from_env(os.environ))
    load_ms = (time.perf_counter() - t0) * 1e3
    out = _run(eng, json.loads(args.messages))
    out["load_ms"] = round(load_ms, 1)
    eng.snapshots.hold()  # measure only: the promotion writes need not happen
    # one write with its newline: print() writes the text and the "\n" apart, and a background
    # snapshot write's log line landing between them broke the RESULT line (seen in make test)
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)


def _wait_for(url: str, server: subprocess.Popen, timeout_s: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"moto server exited with {server.returncode} before answering on {url}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"moto server did not answer on {url} within {timeout_s:.0f} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.agent_prefix", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--s3", action="store_true", help="also restore from S3 (moto server on 127.0.0.1)")
    ap.add_argument("--tokens", type=int, default=421)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--messages", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    work = tempfile.mkdtemp(prefix="agent-prefix-")
    try:
        return _measure(args, work)
    finally:
        # 26-36 MB per snapshot, ~320 MB per run: make bench left ~7 GB in /tmp over a day
        shutil.rmtree(work, ignore_errors=True)


def _measure(args, work: str) -> int:
    env = {**os.environ, "SNAPSHOT_DIR": os.path.join(work, "snapshots"), "SNAPSHOT_S3_URI": ""}
    server = None
    try:
        if args.s3:
            import boto3

            # moto in its own process, as S3 is another host: a ThreadedMotoServer in this process
            # parsed the background PUTs of 33 MB snapshots under our GIL (numpy.arange calls took
            # ~1 ms each beside it; case (b) 166-250 ms against 155-170 without an S3 tier)
            port = _free_port()
            server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{port}"
            _wait_for(url, server)
            creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
            env.update(creds, SNAPSHOT_S3_URI="s3://bench-snapshots/agent", SNAPSHOT_S3_ENDPOINT_URL=url)
            os.environ.update(creds)
            boto3.client("s3", endpoint_url=url).create_bucket(Bucket="bench-snapshots")
        os.environ.update({k: env[k] for k in ("SNAPSHOT_DIR", "SNAPSHOT_S3_URI")})
        if args.s3:
            os.environ["SNAPSHOT_S3_ENDPOINT_URL"] = env["SNAPSHOT_S3_ENDPOINT_URL"]

        from engine.generate import Engine
        from engine.settings import Settings

        writes: list[dict] = []
        eng = Engine.load(args.model, settings=Settings.from_env(os.environ))
        eng.snapshots.log = lambda event, **f: writes.append({"event": event, **f})
        msgs = _messages(eng, args.tokens)
        out: dict = {"model": args.model, "threads": eng.threads}
        out["turn1"] = _run(eng, msgs, REPLY_1)
        turn2 = msgs + [{"role": "assistant", "content": "The p99 rose after the 09:12 deployment.",
                         "reasoning_content": "I should look at the logs first."},
                        {"role": "user", "content": USER_2}]
        out["a"] = _run(eng, turn2)
        out["b"] = _run(eng, [msgs[0], {"role": "user", "content": USER_B}])
        t0 = time.perf_counter()
        flushed = eng.flush_snapshots(600)
        out["flush_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        out["flushed"] = flushed
        ok = [w for w in writes if w["event"] == "snapshot_write" and w.get("ok") and not w.get("skipped")]
        out["snapshot_writes"] = [{k: w[k] for k in ("tier", "n_tokens", "bytes", "ms")} for w in ok]
        cold_msgs = json.dumps([msgs[0], {"role": "user", "content": USER_C}])
        tiers = [("c_dir", {"SNAPSHOT_S3_URI": ""})]
        if args.s3:  # S3 only: an instance without the EFS mount
            tiers.append(("c_s3", {"SNAPSHOT_DIR": ""}))
        for name, extra in tiers:
            p = subprocess.run([sys.executable, "-m", "bench.agent_prefix", "--model", args.model, "--child",
                                "--messages", cold_msgs], env={**env, **extra}, capture_output=True, text=True,
                               timeout=3600)
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            out[name] = json.loads(line[0][7:]) if line else {"error": p.stderr[-2000:]}
        base = out["turn1"]["ttft_ms"]
        out["ratios"] = {k: round(out[k]["ttft_ms"] / base, 4) for k in ("a", "b", "c_dir", "c_s3")
                         if k in out and "ttft_ms" in out[k]}
        goals = {"a": 0.10, "b": 0.10, "c_dir": 0.25, "c_s3": 0.25}
        out["goals_met"] = {k: v <= goals[k] for k, v in out["ratios"].items()}
        for k in ("turn1", "a", "b", "c_dir", "c_s3"):
            if k in out:
                out[k].pop("text", None)
        print(json.dumps(out, indent=1))
        return 0
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
