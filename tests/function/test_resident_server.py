"""The resident server (function/serve.py + function/asgi.py, issue 54) as hostile and busy clients
meet it, on loopback: a client trickling its headers or its body is cut at a deadline; a body over
the limit is refused before it is read; a client gone mid-stream stops its decode and leaves one
log line, not a traceback; a full queue answers 429 with Retry-After; /health and /metrics answer
while a generation runs; SIGTERM drains the streams in flight and exits 0; 16 concurrent streams
with slow readers and disconnects all end complete or with a clear error.

Time bounds are wide (a loaded 2-core CI host): a deadline of 1-2 s is checked against 15-30 s."""
from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from engine.gguf_file import GGUFFile
from engine.tokenizer import Tokenizer
from function.asgi import ServeSettings
from function.serve import serve_in_thread
from tests.function.warm import start_serve, stop_serve, warm_runtime

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def rt(tiny_model_path):
    return warm_runtime(tiny_model_path, STREAM_KEEPALIVE_S="0")


@pytest.fixture(scope="module")
def rt_batched(tiny_model_path):
    """Four generations decoding together, prompts prefilled 8 tokens a step, each step's rows
    multiplied one at a time (WARMLLM_BATCH_EXACT: outputs equal to each one's alone)."""
    return warm_runtime(tiny_model_path, STREAM_KEEPALIVE_S="0", WARMLLM_MAX_NUM_SEQS="4",
                        WARMLLM_BATCH_PREFILL_CHUNK="8", WARMLLM_BATCH_EXACT="1")


@pytest.fixture(scope="module")
def rt_fast(tiny_model_path):
    """The server's default batching: sixteen slots, a step's rows multiplied together."""
    return warm_runtime(tiny_model_path, STREAM_KEEPALIVE_S="0", WARMLLM_MAX_NUM_SEQS="16")


def no_eos(path: Path) -> dict[str, float]:
    """logit_bias that bans every end-of-generation token: a random-weights model then writes
    exactly max_tokens."""
    tok = Tokenizer.from_gguf_metadata(GGUFFile(path).metadata)
    return {str(i): -100 for i in sorted(tok.eog_ids)}


def body(path: Path, max_tokens: int, stream: bool = True) -> bytes:
    return json.dumps({"model": "warmllm", "messages": [{"role": "user", "content": "Count to many"}],
                       "max_tokens": max_tokens, "stream": stream, "temperature": 1.0, "seed": 3,
                       "logit_bias": no_eos(path)}).encode()


def host_port(url: str) -> tuple[str, int]:
    m = re.match(r"http://([^:/]+):(\d+)/", url)
    assert m, url
    return m.group(1), int(m.group(2))


class StreamReader:
    """One streamed request on its own thread: its status, headers, SSE data lines, whether it
    ended with [DONE], and when its first data arrived."""

    def __init__(self, url: str, payload: bytes, *, read_delay_s: float = 0.0, stop_after: int | None = None):
        self.host, self.port = host_port(url)
        self.payload, self.read_delay_s, self.stop_after = payload, read_delay_s, stop_after
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.data: list[str] = []
        self.done = False
        self.error: str | None = None
        self.first_at: float | None = None
        self.body = b""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StreamReader:
        self.thread.start()
        return self

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request("POST", CHAT, self.payload, {"content-type": "application/json"})
            r = conn.getresponse()
            self.status, self.headers = r.status, {k.lower(): v for k, v in r.getheaders()}
            if r.status != 200:
                self.body = r.read()
                return
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    if self.first_at is None:
                        self.first_at = time.monotonic()
                    text = line[6:].strip().decode()
                    self.data.append(text)
                    if text == "[DONE]":
                        self.done = True
                        break
                    if self.stop_after is not None and len(self.data) >= self.stop_after:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                        break
                    if self.read_delay_s:
                        time.sleep(self.read_delay_s)
        except Exception as exc:      # recorded: the test asserts on it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()

    def join(self, timeout: float = 180) -> StreamReader:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream never ended"
        return self


def slow_engine(rt, monkeypatch, per_token_s: float = 0.01) -> list[float]:
    """Each decode step takes at least `per_token_s` (a generation long enough to overlap others,
    whatever the host's speed); returns the steps' times."""
    steps: list[float] = []
    for session in rt.engine.pool.sessions:
        def step(tok, real=session.step):
            time.sleep(per_token_s)
            steps.append(time.monotonic())
            return real(tok)
        monkeypatch.setattr(session, "step", step)
    return steps


def wait_for(cond, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def closed_within(sock: socket.socket, feed: bytes, every_s: float, limit_s: float) -> float | None:
    """Send `feed` a byte every `every_s` until the server closes the connection: the seconds it
    took, or None if it was still open after `limit_s`."""
    t0 = time.monotonic()
    sock.settimeout(every_s)
    i = 0
    while time.monotonic() - t0 < limit_s:
        try:
            if i < len(feed):
                sock.send(feed[i:i + 1])
                i += 1
            data = sock.recv(4096)
            if data == b"":
                return time.monotonic() - t0
            return -(time.monotonic() - t0) if data.startswith(b"HTTP/1.1 408") else time.monotonic() - t0
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - t0
    return None


# ----------------------------------------------------------------------------- hostile clients

def test_a_client_trickling_its_headers_is_cut_at_the_header_deadline(rt, capfd):
    """Three clients sending their headers a byte every 0.2 s: each is cut at the 1 s deadline
    (http.server held all three for as long as they kept sending)."""
    feed = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 400
    took: list[float | None] = [None] * 3
    with serve_in_thread(rt, ServeSettings(header_timeout_s=1.0)) as (url, _):
        def one(i: int) -> None:
            with socket.create_connection(host_port(url)) as s:
                took[i] = closed_within(s, feed, 0.2, 30.0)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert all(t is not None and 0.5 <= abs(t) < 15 for t in took), took      # 1 s deadline, not the minute
    out = capfd.readouterr().out
    assert out.count('"event":"serve_slow_client"') >= 3 and "Traceback" not in out


def test_a_body_trickled_a_byte_at_a_time_is_answered_408(rt, capfd):
    with serve_in_thread(rt, ServeSettings(header_timeout_s=5.0, body_timeout_s=1.0)) as (url, _):
        s = socket.create_connection(host_port(url))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 400\r\n\r\n")
        s.settimeout(0.3)
        t0, reply = time.monotonic(), b""
        while time.monotonic() - t0 < 30 and b"\r\n\r\n" not in reply:
            try:
                s.send(b" ")
                reply += s.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                break
        took = time.monotonic() - t0
        s.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert took < 15
    assert b"request_timeout" in reply or b"connection: close" in reply.lower()
    out = capfd.readouterr().out
    assert '"error_code":"request_timeout"' in out and "Traceback" not in out


def test_a_body_over_the_limit_is_refused_before_it_is_all_read(rt, capfd):
    """A body one byte over MAX_BODY_BYTES is a 413 naming the setting; a client announcing 16x the
    limit and sending without end is cut once the limit is passed, not read to its end."""
    limit = rt.settings.limits.max_body_bytes
    with serve_in_thread(rt) as (url, _):
        conn = http.client.HTTPConnection(*host_port(url), timeout=60)
        conn.request("POST", CHAT, b"x" * (limit + 1), {"Content-Type": "application/json"})
        r = conn.getresponse()
        status, reply = r.status, json.loads(r.read())
        conn.close()
        assert status == 413 and reply["error"]["code"] == "request_too_large"
        assert "MAX_BODY_BYTES" in reply["error"]["message"]

        s = socket.create_connection(host_port(url), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (16 * limit))
        sent, closed = 0, False
        try:
            while sent < 16 * limit:
                s.sendall(b"x" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            closed = True                  # not a timeout: the server closed the connection
        s.close()
    assert closed and sent < 16 * limit, sent        # the rest was never taken
    out = capfd.readouterr().out
    refused = [json.loads(x) for x in out.splitlines() if '"event":"serve_refused"' in x]
    assert [x["error_code"] for x in refused] == ["request_too_large"] * 2 and "Traceback" not in out


def test_a_client_gone_mid_stream_stops_its_decode_with_one_line(rt, tiny_model_path, capfd, monkeypatch):
    steps = slow_engine(rt, monkeypatch, 0.002)
    with serve_in_thread(rt) as (url, _):
        r = StreamReader(url, body(tiny_model_path, 2000), stop_after=3).start().join()
        assert not r.done and len(r.data) == 3
        # the decode stopped at its next token after the disconnect, not 2,000 tokens later
        assert wait_for(lambda: rt.engine is not None and rt.engine.pool.busy == 0, 60)
        n = len(steps)
        time.sleep(1.0)
        assert len(steps) == n and n < 100, n
        after = StreamReader(url, body(tiny_model_path, 4)).start().join()   # the server still serves
        assert after.done
    out = capfd.readouterr()
    lines = [json.loads(x) for x in out.out.splitlines() if x.startswith("{")]
    gone = [x for x in lines if x.get("event") in ("stream_closed", "serve_client_gone")]
    assert len(gone) == 1, gone
    assert "Traceback" not in out.out + out.err and "BrokenPipeError" not in out.err


# ----------------------------------------------------------------------------- the queue

def test_a_full_queue_answers_429_with_retry_after_and_loses_nothing(rt, tiny_model_path, monkeypatch):
    slow_engine(rt, monkeypatch)
    with serve_in_thread(rt, ServeSettings(queue=1)) as (url, app):
        running = StreamReader(url, body(tiny_model_path, 300)).start()
        assert wait_for(lambda: running.first_at is not None, 120)
        waiting = StreamReader(url, body(tiny_model_path, 8)).start()
        assert wait_for(lambda: app.load.waiting == 1, 60)
        refused = StreamReader(url, body(tiny_model_path, 8)).start().join()
        assert refused.status == 429, (refused.status, refused.body[:300])
        err = json.loads(refused.body)["error"]
        assert err["code"] == "queue_full" and err["type"] == "rate_limit_error" and "SERVE_QUEUE=1" in err["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert running.join().done and waiting.join().done         # accepted ones complete
        metrics = http.client.HTTPConnection(*host_port(url), timeout=30)
        metrics.request("GET", "/metrics")
        text = metrics.getresponse().read().decode()
    assert 'warmllm_refused_total{code="queue_full"} 1.0' in text


def test_health_and_metrics_answer_while_a_generation_runs(rt, tiny_model_path, monkeypatch):
    slow_engine(rt, monkeypatch)
    with serve_in_thread(rt) as (url, _):
        long = StreamReader(url, body(tiny_model_path, 300)).start()
        assert wait_for(lambda: long.first_at is not None, 120)
        c = http.client.HTTPConnection(*host_port(url), timeout=30)
        c.request("GET", "/health")
        health = c.getresponse()
        assert health.status == 200 and json.loads(health.read())["status"] == "ok"
        c.request("GET", "/metrics")
        during = c.getresponse().read().decode()
        assert not long.done                        # answered beside the generation, not after it
        assert "warmllm_active_sequences 1.0" in during and "warmllm_queue_depth 0.0" in during
        assert long.join().done
        scrapes: list[tuple[str, str]] = []

        def scrape() -> bool:
            # the request is counted when its handler returns, just after the stream's last
            # bytes: a client that scrapes the moment it has read them can be a moment early
            c.request("GET", "/metrics")
            m = c.getresponse()
            scrapes.append((m.getheader("content-type"), m.read().decode()))
            return re.search(r'warmllm_requests_total\{route="chat",status="200"\} [1-9]', scrapes[-1][1]) is not None

        counted = wait_for(scrape, 30)
        ctype, after = scrapes[-1]
        assert ctype.startswith("text/plain")
    assert counted, after
    assert re.search(r"warmllm_generated_tokens_total [1-9]", after)
    assert re.search(r'warmllm_prefill_total\{mode="[a-z_]+"\} [1-9]', after)
    assert "warmllm_snapshot_misses_total" in after and "warmllm_decode_tokens_per_second" in after


def test_metrics_need_the_key_when_one_is_set(rt, monkeypatch):
    monkeypatch.setattr(rt, "api_key", "sekrit")
    with serve_in_thread(rt) as (url, _):
        c = http.client.HTTPConnection(*host_port(url), timeout=30)
        c.request("GET", "/metrics")
        r = c.getresponse()
        assert r.status == 401 and json.loads(r.read())["error"]["code"] == "invalid_api_key"
        c.request("GET", "/metrics", headers={"Authorization": "Bearer sekrit"})
        r = c.getresponse()
        assert r.status == 200 and b"warmllm_queue_depth" in r.read()


# ----------------------------------------------------------------------------- load

@pytest.mark.parametrize("runtime", ["rt", "rt_fast"])
def test_sixteen_streams_with_slow_readers_and_disconnects_all_end_cleanly(runtime, request, tiny_model_path, capfd):
    rt = request.getfixturevalue(runtime)
    with serve_in_thread(rt, ServeSettings(queue=16)) as (url, _):
        readers = [StreamReader(url, body(tiny_model_path, 24), read_delay_s=0.05 if i % 4 == 1 else 0.0,
                                stop_after=2 if i % 8 == 3 else None) for i in range(16)]
        for r in readers:
            r.start()
        for r in readers:
            r.join()
    quitters = [r for i, r in enumerate(readers) if i % 8 == 3]
    stayers = [r for i, r in enumerate(readers) if i % 8 != 3]
    assert all(r.status == 200 and r.done and r.error is None for r in stayers), \
        [(r.status, r.done, r.error, r.body[:100]) for r in stayers]
    # nothing starved: every stream's content arrived, each ending with a finish_reason
    for r in stayers:
        chunks = [json.loads(d) for d in r.data if d != "[DONE]"]
        assert chunks and chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1:]
    assert all(r.status == 200 and not r.done for r in quitters)
    if runtime == "rt_fast":                  # the streams decoded together, not one by one
        assert rt.engine.scheduler.stats.max_rows >= 4, rt.engine.scheduler.stats
    out = capfd.readouterr()
    assert "Traceback" not in out.out + out.err


# ----------------------------------------------------------------------------- continuous batching

def greedy_body(path: Path, i: int, max_tokens: int) -> bytes:
    return json.dumps({"model": "warmllm", "messages": [{"role": "user", "content": f"Story {i}: " + "go " * (3 * i)}],
                       "max_tokens": max_tokens, "stream": True, "temperature": 0,
                       "logit_bias": no_eos(path)}).encode()


def content(r: StreamReader) -> str:
    chunks = [json.loads(d) for d in r.data if d != "[DONE]"]
    # the reply and its reasoning (the tiny model's template may open a <think> block)
    return "".join((c["choices"][0]["delta"].get("reasoning_content") or "") + "|" +
                   (c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])


def test_streams_decoding_together_write_what_they_write_alone(rt_batched, tiny_model_path):
    """Six greedy streams at once on four slots (two join as others end), then each alone: the
    same text, and steps decoded several streams together."""
    sched = rt_batched.engine.scheduler
    rows0, steps0 = sched.stats.decode_rows, sched.stats.decode_steps
    with serve_in_thread(rt_batched, ServeSettings(queue=16)) as (url, _):
        together = [StreamReader(url, greedy_body(tiny_model_path, i, 20)).start() for i in range(6)]
        for r in together:
            r.join()
        rows, steps = sched.stats.decode_rows - rows0, sched.stats.decode_steps - steps0
        alone = [StreamReader(url, greedy_body(tiny_model_path, i, 20)).start().join() for i in range(6)]
        c = http.client.HTTPConnection(*host_port(url), timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    assert all(r.done for r in together + alone), [(r.status, r.error) for r in together + alone]
    assert [content(r) for r in together] == [content(r) for r in alone]
    assert all(content(r).replace("|", "") for r in together)
    assert rows >= 6 * 19 and rows / steps > 1.5, (rows, steps)     # batched: not one stream per step
    m_rows = float(re.search(r"^warmllm_decode_rows_total ([0-9.e+]+)$", text, re.M).group(1))
    m_steps = float(re.search(r"^warmllm_decode_steps_total ([0-9.e+]+)$", text, re.M).group(1))
    assert m_rows > m_steps > 0


def test_a_full_batch_and_queue_answer_429_naming_both_limits(rt_batched, tiny_model_path, monkeypatch):
    slow_engine(rt_batched, monkeypatch)
    with serve_in_thread(rt_batched, ServeSettings(queue=1)) as (url, app):
        running = [StreamReader(url, body(tiny_model_path, 400)).start() for _ in range(4)]
        assert wait_for(lambda: all(r.first_at is not None for r in running), 120)   # four at once
        waiting = StreamReader(url, body(tiny_model_path, 4)).start()
        assert wait_for(lambda: app.load.waiting == 1, 60)
        refused = StreamReader(url, body(tiny_model_path, 4)).start().join()
        assert refused.status == 429, (refused.status, refused.body[:300])
        msg = json.loads(refused.body)["error"]["message"]
        assert "4 generations running (WARMLLM_MAX_NUM_SEQS=4)" in msg and "SERVE_QUEUE=1" in msg
        assert all(r.join().done for r in running) and waiting.join().done


def test_sigterm_drains_the_streams_in_flight_then_exits_0(tiny_model_path):
    proc, url = start_serve(tiny_model_path, SERVE_DRAIN_S="60")
    try:
        assert url is not None, proc.stderr.read() if proc.stderr else ""
        first = StreamReader(url, body(tiny_model_path, 400), read_delay_s=0.005).start()
        assert wait_for(lambda: first.first_at is not None, 120)
        queued = StreamReader(url, body(tiny_model_path, 6)).start()
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert first.join().done and queued.join().done        # both finish: nothing cut
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read() if proc.stderr else ""
        assert '"event": "serve_stopped"' in err and "Traceback" not in err
        with pytest.raises(OSError):                            # the listener is gone
            socket.create_connection(host_port(url), timeout=5)
    finally:
        stop_serve(proc)
