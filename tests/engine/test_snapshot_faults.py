"""Store faults (issue 18 items 2 and 3): every bad snapshot is a fault that is logged, deleted
where it can be and rewritten, the answer being the from-scratch answer; every slow tier is
bounded in time (an S3 endpoint that never answers, or dribbles) and in memory (a stored size
is checked before anything is read); a shared bucket can require MAC'd snapshots."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engine import snapshots as S
from engine.snapshots import format as F
from engine.snapshots import tiers as T
from engine.session import Session
from tests.engine.test_snapshot_store import FP, LAYOUT, Log, key_of, make_snap
from tests.engine.test_snapshot_store import moto_server  # noqa: F401  (the fixture: moto over real HTTP)
from tests.engine.test_session_restores_snapshots import PROMPT, greedy, load, new_store

ROOT = Path(__file__).resolve().parents[2]


def store(tmp_path=None, *, log=None, memory_mb=0, dir_mb=1024, **kw):
    return S.SnapshotStore(FP, LAYOUT, memory_bytes=int(memory_mb * (1 << 20)),
                           dir=str(tmp_path) if tmp_path else None, dir_bytes=int(dir_mb * (1 << 20)),
                           every=0, flush_at_exit_s=0, log=log if log is not None else Log(), **kw)


def raw_wsnap(header_text: bytes) -> bytes:
    """A .wsnap with any header text and a valid checksum (the checksum proves nothing)."""
    body = F._PRELUDE.pack(F.MAGIC, F.FORMAT_VERSION, 0, len(header_text)) + header_text
    body += b"\0" * (-len(body) % 64)
    return body + hashlib.sha256(body).digest()


def resealed(data: bytes | bytearray, mutate) -> bytes:
    """`data` with its header JSON changed by `mutate(header)` and the checksum made valid again."""
    magic, version, flags, hlen = F._PRELUDE.unpack_from(data, 0)
    header = json.loads(bytes(data[16:16 + hlen]))
    mutate(header)
    hb = json.dumps(header, separators=(",", ":")).encode()
    old_start = -(-(16 + hlen) // 64) * 64
    payload = bytes(data[old_start:len(data) - 32])
    head = F._PRELUDE.pack(magic, version, flags, len(hb)) + hb
    head += b"\0" * (-len(head) % 64)
    out = bytearray(head + payload)
    if "total_bytes" in header and isinstance(header["total_bytes"], int):
        header["total_bytes"] = len(out) + 32
        hb = json.dumps(header, separators=(",", ":")).encode()
        head = F._PRELUDE.pack(magic, version, flags, len(hb)) + hb
        head += b"\0" * (-len(head) % 64)
        out = bytearray(head + payload)
    return bytes(out) + hashlib.sha256(out).digest()


def _nan_snap(n):
    snap = make_snap(n, logits=True)
    snap.state.layers[0].S[0, 0, 0] = np.nan
    return snap


def _int_state_snap(n):
    snap = make_snap(n, logits=True)
    snap.state.layers[1].S = snap.state.layers[1].S.astype(np.int32)
    return snap


BAD_CONTENT = {
    "created_not_a_number": lambda snap, key: resealed(S.serialize(snap, FP, key[1]),
                                                       lambda h: h.update(created="yesterday")),
    "deep_header": lambda snap, key: raw_wsnap(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "nan_in_state": lambda snap, key: bytes(S.serialize(_nan_snap(snap.n_tokens), FP, key[1])),
    "wrong_dtype": lambda snap, key: bytes(S.serialize(_int_state_snap(snap.n_tokens), FP, key[1])),
    "logits_wrong_shape": lambda snap, key: bytes(S.serialize(
        S.Snapshot(snap.tokens, snap.state, np.zeros(49, np.float32)), FP, key[1])),
    "header_not_object": lambda snap, key: raw_wsnap(b"[1, 2, 3]"),
    "shape_negative": lambda snap, key: resealed(S.serialize(snap, FP, key[1]),
                                                 lambda h: h["arrays"][0].update(shape=[-1])),
}


@pytest.mark.parametrize("kind", sorted(BAD_CONTENT))
def test_bad_content_with_a_valid_checksum_is_a_snapshot_error(kind):
    snap = make_snap(9, logits=True)
    key = key_of(snap)
    data = BAD_CONTENT[kind](make_snap(9, logits=True), key)
    with pytest.raises(S.SnapshotError) as e:                # nothing else escapes
        S.deserialize(data, fingerprint=FP, key=key, tokens=snap.tokens.tolist(), layout=LAYOUT, n_vocab=50)
    assert e.value.reason == "corrupt", e.value


@pytest.mark.parametrize("kind", sorted(BAD_CONTENT))
def test_a_bad_directory_snapshot_is_deleted_and_rewritten(tmp_path, kind):
    log = Log()
    st = store(tmp_path, log=log, n_vocab=50)
    good = make_snap(9, logits=True)
    key = key_of(good)
    path = tmp_path / FP / S.snapshot_name(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(BAD_CONTENT[kind](good, key))
    assert st.lookup(good.tokens.tolist(), [9]) is None       # not a 500, not a wrong answer
    [ign] = log.of("snapshot_ignored")
    assert ign["deleted"] is True and not path.exists()
    st.put(key, good)                                          # the fresh prefill's capture
    assert st.flush(10) and path.is_file()
    hit = store(tmp_path, n_vocab=50).lookup(good.tokens.tolist(), [9])   # another instance restores it
    assert hit is not None and hit.snapshot.state.max_abs_diff(good.state) == 0.0


@pytest.mark.parametrize("kind", ["directory", "fifo", "unreadable"])
def test_a_non_regular_or_unreadable_thing_at_a_key_is_repaired(tmp_path, kind, monkeypatch):
    log = Log()
    st = store(tmp_path, log=log)
    good = make_snap(12, logits=True)
    key = key_of(good)
    path = tmp_path / FP / S.snapshot_name(key)
    path.parent.mkdir(parents=True)
    if kind == "directory":
        (path / "inner").mkdir(parents=True)
    elif kind == "fifo":
        os.mkfifo(path)                        # opening it would block the request for good
    else:
        path.write_bytes(S.serialize(good, FP, key[1]))
        real_open = os.open

        def deny(p, *a, **k):
            if os.fspath(p) == str(path):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(p, *a, **k)
        monkeypatch.setattr(T.os, "open", deny)   # as root a chmod 000 file stays readable
    t = time.perf_counter()
    assert st.lookup(good.tokens.tolist(), [12]) is None
    assert time.perf_counter() - t < 2.0
    [ign] = log.of("snapshot_ignored")
    assert ign["reason"] in ("not_a_file", "unreadable") and ign["deleted"] is True
    assert not os.path.lexists(path)
    monkeypatch.undo()
    st.put(key, good)
    assert st.flush(10) and path.is_file() and log.of("snapshot_write")[-1]["ok"]


def test_writer_replaces_a_directory_at_the_key(tmp_path):
    st = store(tmp_path)
    good = make_snap(12, logits=True)
    path = tmp_path / FP / S.snapshot_name(key_of(good))
    (path / "x").mkdir(parents=True)
    st.put(key_of(good), good)
    assert st.flush(10) and path.is_file()


def test_an_evicted_prefix_is_written_again(tmp_path):
    log = Log()
    a, b = make_snap(40, seed=1), make_snap(40, seed=2)
    one = len(S.serialize(a, FP, key_of(a)[1]))
    st = store(tmp_path, log=log, dir_mb=(one * 1.5) / (1 << 20))   # room for one snapshot
    st.put(key_of(a), a)
    assert st.flush(10)
    st.put(key_of(b), b)                                          # evicts a
    assert st.flush(10)
    assert not (tmp_path / FP / S.snapshot_name(key_of(a))).exists()
    st.put(key_of(a), a)                                          # was never written again
    assert st.flush(10)
    assert [w["key"] for w in log.of("snapshot_write")].count(S.snapshot_name(key_of(a))) == 2
    assert (tmp_path / FP / S.snapshot_name(key_of(a))).exists()


def test_dead_temp_files_are_cleaned_at_start_and_live_ones_count(tmp_path):
    d = tmp_path / FP
    d.mkdir()
    dead = d / ".00000001-x.wsnap.1.abcd.tmp"
    dead.write_bytes(b"x" * 1000)
    old = time.time() - T.TMP_MAX_AGE_S - 10
    os.utime(dead, (old, old))
    store(tmp_path)
    for _ in range(100):                        # the start-up sweep runs on its own thread
        if not dead.exists():
            break
        time.sleep(0.02)
    assert not dead.exists()
    live = d / ".00000002-y.wsnap.1.abcd.tmp"
    live.write_bytes(b"y" * 4096)
    snap = make_snap(8)
    tier = T.DirTier(str(tmp_path), FP, cap_bytes=4096 + 10)
    tier.write(key_of(snap), S.serialize(snap, FP, key_of(snap)[1]))
    # the live temp file counts against the cap (so the snapshot goes), and is not deleted
    assert live.exists() and not os.path.exists(tier.path(key_of(snap)))


def test_a_file_too_large_for_its_prefix_is_refused_before_reading(tmp_path):
    log = Log()
    st = store(tmp_path, log=log, dir_mb=8192)    # a cap above the file: eviction is not what removes it
    snap = make_snap(10, logits=True)
    path = tmp_path / FP / S.snapshot_name(key_of(snap))
    path.parent.mkdir(parents=True)
    with open(path, "wb") as fh:                       # sparse: 2 GB that costs nothing on disk
        fh.truncate(2 << 30)
    assert st.lookup(snap.tokens.tolist(), [10]) is None
    [ign] = log.of("snapshot_ignored")
    assert ign["reason"] == "too_large" and ign["deleted"] is True


PEAK = r"""
import os, resource, sys, json
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from test_snapshot_store import make_snap, key_of, FP, LAYOUT, Log
from engine import snapshots as S
root = sys.argv[1]
snap = make_snap(10, logits=True)
p = os.path.join(root, FP, S.snapshot_name(key_of(snap)))
os.makedirs(os.path.dirname(p), exist_ok=True)
with open(p, "wb") as fh:
    fh.truncate(2 << 30)
st = S.SnapshotStore(FP, LAYOUT, memory_bytes=0, dir=root, every=0, flush_at_exit_s=0, log=Log())
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
st.lookup(snap.tokens.tolist(), [10])
print(json.dumps({"grew_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base}))
"""


def test_peak_rss_of_a_2gb_sparse_snapshot_is_bounded(tmp_path):
    out = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path), str(ROOT), str(ROOT / "tests" / "engine")],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    grew = json.loads(out.stdout.strip().splitlines()[-1])["grew_kb"]
    assert grew < 32 * 1024, grew          # was 2.26 GB: the file read whole before its size was checked


# ---- S3: timeouts, budget, cool-down ---------------------------------------------------------------

class BlackHole:
    """A local endpoint that accepts connections and never answers (or, `dribble`, answers a
    HEAD and then sends a GET's body a byte every half second)."""

    def __init__(self, dribble: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.dribble = dribble
        self.conns: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            if self.dribble:
                threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            while not self._stop:
                req = c.recv(65536)
                if not req:
                    return
                if req.startswith(b"HEAD"):
                    c.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 4000\r\nETag: "e"\r\n\r\n')
                    continue
                c.sendall(b'HTTP/1.1 206 Partial Content\r\nContent-Length: 4000\r\nETag: "e"\r\n'
                          b"Content-Range: bytes 0-3999/4000\r\n\r\n")
                while not self._stop:
                    c.sendall(b"x")
                    time.sleep(0.5)
        except OSError:
            return

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def aws_env(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("dribble", [False, True], ids=["never_answers", "dribbles"])
def test_an_s3_endpoint_that_hangs_costs_the_budget_then_cools_down(aws_env, dribble):
    hole = BlackHole(dribble)
    log = Log()
    try:
        st = store(log=log, s3_uri="s3://snaps/p", s3_endpoint_url=hole.url, lookup_budget_s=1.0, cooldown_s=60,
                   s3_read_timeout_s=30)      # a read timeout longer than the budget: the budget bounds it
        snap = make_snap(20, logits=True)
        toks = snap.tokens.tolist()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            assert st.lookup(toks, [20]) is None
            times.append(time.perf_counter() - t)
        assert times[0] < 1.6 and times[1] < 1.6, times       # was 150 s a request
        assert times[2] < 0.05, times                           # cooling down: not asked
        skipped = log.of("snapshot_tier_skipped")
        assert len(skipped) == 2 and skipped[0]["reason"] == "budget" and skipped[0]["tier"] == "s3"
        assert log.of("snapshot_tier_cooldown")[0]["seconds"] == 60
    finally:
        hole.close()


def test_s3_network_errors_are_logged_with_the_real_error(aws_env):
    log = Log()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                              # nothing listens: connection refused
    st = store(log=log, s3_uri="s3://snaps/p", s3_endpoint_url=f"http://127.0.0.1:{port}", lookup_budget_s=5)
    snap = make_snap(20, logits=True)
    t = time.perf_counter()
    assert st.lookup(snap.tokens.tolist(), [20]) is None
    assert time.perf_counter() - t < 5
    [ign] = log.of("snapshot_ignored")
    assert "AttributeError" not in ign["detail"] and "connect" in ign["detail"].lower(), ign


def test_s3_code_of_errors_without_a_response():
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError
    assert S.S3Tier._code(EndpointConnectionError(endpoint_url="http://x")) == ""
    assert S.S3Tier._code(ReadTimeoutError(endpoint_url="http://x")) == ""
    err = Exception("x")
    err.response = None  # type: ignore[attr-defined]
    assert S.S3Tier._code(err) == ""


def test_the_s3_client_has_bounded_timeouts_and_retries(aws_env):
    tier = S.S3Tier("s3://b/p", FP, endpoint_url="http://127.0.0.1:9", connect_timeout_s=0.7, read_timeout_s=1.3,
                    attempts=2)
    cfg = tier.client.meta.config
    assert (cfg.connect_timeout, cfg.read_timeout) == (0.7, 1.3)
    assert cfg.retries["total_max_attempts"] == 2


def test_an_s3_object_too_large_for_its_prefix_is_not_allocated(moto_s3):
    log = Log()
    st = store(log=log, s3_uri="s3://snaps/pre", s3_client=moto_s3)
    snap = make_snap(20, logits=True)
    obj = st.s3.object_key(key_of(snap))
    moto_s3.put_object(Bucket="snaps", Key=obj, Body=b"x" * 10)
    real_head = moto_s3.head_object
    moto_s3.head_object = lambda **kw: {**real_head(**kw), "ContentLength": 3 << 30}   # "HEAD says 3 GB"
    assert st.lookup(snap.tokens.tolist(), [20]) is None
    [ign] = log.of("snapshot_ignored")
    assert ign["reason"] == "too_large" and ign["deleted"] is True




def test_a_bad_s3_object_over_http_is_repaired_and_a_second_process_restores_it(moto_server):  # noqa: F811
    log = Log()
    snap = make_snap(30, logits=True)
    key = key_of(snap)
    st = store(log=log, s3_uri="s3://snaps/rep", s3_endpoint_url=moto_server, n_vocab=50)
    st.s3.client.put_object(Bucket="snaps", Key=st.s3.object_key(key), Body=BAD_CONTENT["nan_in_state"](snap, key))
    assert st.lookup(snap.tokens.tolist(), [30]) is None
    assert log.of("snapshot_ignored")[0]["deleted"] is True
    st.put(key, snap)
    assert st.flush(20)
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from test_snapshot_store import make_snap, key_of, FP, LAYOUT, Log\n"
            "from engine import snapshots as S\n"
            "snap = make_snap(30, logits=True)\n"
            "st = S.SnapshotStore(FP, LAYOUT, memory_bytes=0, s3_uri='s3://snaps/rep', s3_endpoint_url=sys.argv[3],"
            " every=0, flush_at_exit_s=0, log=Log(), n_vocab=50)\n"
            "hit = st.lookup(snap.tokens.tolist(), [30])\n"
            "print(hit.tier, hit.snapshot.state.max_abs_diff(snap.state))\n")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(ROOT / "tests" / "engine"), moto_server],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["s3", "0.0"]


# ---- HMAC ----------------------------------------------------------------------------------------

def test_hmac_key_required_and_checked(tmp_path):
    snap = make_snap(16, logits=True)
    key = key_of(snap)
    toks = snap.tokens.tolist()
    path = tmp_path / FP / S.snapshot_name(key)
    keyed = store(tmp_path, hmac_key=b"k1")
    keyed.put(key, snap)
    assert keyed.flush(10)
    data = path.read_bytes()
    assert struct.unpack_from("<H", data, 10)[0] & F.FLAG_HMAC
    assert store(tmp_path, hmac_key=b"k1").lookup(toks, [16]).snapshot.state.max_abs_diff(snap.state) == 0.0
    log = Log()
    assert store(tmp_path, hmac_key=b"k2", log=log).lookup(toks, [16]) is None      # another key
    assert log.of("snapshot_ignored")[0]["reason"] == "unauthenticated"
    path.write_bytes(data)
    log = Log()
    assert store(tmp_path, log=log).lookup(toks, [16]) is None       # no key: not applied, not deleted
    assert log.of("snapshot_ignored")[0]["reason"] == "unauthenticated" and path.exists()
    # a planted snapshot with a valid SHA-256 (what anyone with bucket access can write)
    forged = bytearray(S.serialize(snap, FP, key[1]))
    path.write_bytes(forged)
    log = Log()
    assert store(tmp_path, hmac_key=b"k1", log=log).lookup(toks, [16]) is None
    assert log.of("snapshot_ignored")[0]["reason"] == "unauthenticated" and not path.exists()


def test_hmac_key_from_env():
    from engine.settings import SnapshotSettings
    assert SnapshotSettings.from_env({"SNAPSHOT_HMAC_KEY": "secret"}).hmac_key == b"secret"
    assert SnapshotSettings.from_env({}).hmac_key is None
    s = SnapshotSettings.from_env({"SNAPSHOT_LOOKUP_BUDGET_S": "1.5", "SNAPSHOT_TIER_COOLDOWN_S": "5",
                                   "SNAPSHOT_S3_CONNECT_TIMEOUT_S": "0.5", "SNAPSHOT_S3_READ_TIMEOUT_S": "3",
                                   "SNAPSHOT_S3_ATTEMPTS": "1"})
    assert (s.lookup_budget_s, s.cooldown_s, s.s3_connect_timeout_s, s.s3_read_timeout_s, s.s3_attempts) == \
        (1.5, 5.0, 0.5, 3.0, 1)
    assert "s3cr3t" not in repr(SnapshotSettings.from_env({"SNAPSHOT_HMAC_KEY": "s3cr3t"}))


# ---- on the real forward: the from-scratch answer -------------------------------------------------

def test_a_snapshot_that_fails_while_applied_gives_the_from_scratch_answer(model_factory, tmp_path, monkeypatch):
    m, fp, layout = load(model_factory)
    fresh = Session(m)
    want = greedy(fresh, fresh.prefill(PROMPT).logits)
    log = Log()
    writer = new_store(model_factory, memory_bytes=0, dir=str(tmp_path), log=log)
    w = Session(m, store=writer)
    w.prefill(PROMPT)
    assert writer.flush(20)
    st = new_store(model_factory, memory_bytes=0, dir=str(tmp_path), log=log)
    s = Session(m, store=st)
    real = m.forward_capturing
    calls = {"n": 0}

    def broken_once(*a, **k):            # the first forward after the restore raises
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("operands could not be broadcast together")
        return real(*a, **k)
    monkeypatch.setattr(m, "forward_capturing", broken_once)
    r = s.prefill(PROMPT + [7, 8, 9])
    monkeypatch.undo()
    assert r.mode == "batched"
    [fault] = [e for e in log.of("snapshot_ignored") if e["reason"] == "apply_error"]
    assert fault["deleted"] is True and "broadcast" in fault["detail"]
    s2 = Session(m)
    assert greedy(s, r.logits) == greedy(s2, s2.prefill(PROMPT + [7, 8, 9]).logits)
    assert st.flush(20)
    # rewritten from the fresh prefill: a new store restores it
    again = new_store(model_factory, memory_bytes=0, dir=str(tmp_path))
    s3 = Session(m, store=again)
    r3 = s3.prefill(PROMPT)
    assert r3.mode.startswith("snapshot_") and greedy(s3, r3.logits) == want


def test_engine_answer_with_a_hanging_s3_tier_is_the_from_scratch_answer(tiny_model_path, aws_env):
    from engine.generate import Engine, SamplingParams
    from engine.settings import Settings, SnapshotSettings
    hole = BlackHole()
    try:
        plain = Engine.load(str(tiny_model_path), settings=Settings(threads=2, snapshots=SnapshotSettings(
            memory_mb=0)))
        want = plain.generate("The warm Lambda says", max_tokens=6, sampling=SamplingParams(temperature=0)).text
        eng = Engine.load(str(tiny_model_path), settings=Settings(threads=2, snapshots=SnapshotSettings(
            memory_mb=0, s3_uri="s3://snaps/x", s3_endpoint_url=hole.url, lookup_budget_s=1.0, flush_s=0)))
        t = time.perf_counter()
        got = eng.generate("The warm Lambda says", max_tokens=6, sampling=SamplingParams(temperature=0))
        assert time.perf_counter() - t < 1.0 + 2.0
        assert got.text == want
    finally:
        hole.close()


def test_only_failures_in_a_row_cool_a_tier_down():
    class Flaky:
        name = "flaky"

        def __init__(self):
            self.fail = True
            self.asked = 0

        def existing(self, keys):
            self.asked += 1
            if self.fail:
                raise OSError("connection reset")
            return []

        def exists(self, key):
            return False

        def read(self, key, limit=None):
            return None

        def write(self, key, data):
            pass

        def delete(self, key):
            return False

    log = Log()
    st = store(log=log, cooldown_s=60)
    tier = Flaky()
    st.slow_tiers = [tier]
    toks = make_snap(20).tokens.tolist()
    st.lookup(toks, [20])                  # failure 1
    tier.fail = False
    st.lookup(toks, [20])                  # answered (nothing stored): the run is over
    tier.fail = True
    st.lookup(toks, [20])                  # failure 1 again: no cool-down yet
    assert log.of("snapshot_tier_cooldown") == [] and tier.asked == 3
    st.lookup(toks, [20])                  # failure 2 in a row: cooling down
    assert log.of("snapshot_tier_cooldown")[0]["error"] == "OSError: connection reset"
    st.lookup(toks, [20])
    assert tier.asked == 4                 # not asked while it cools down
    assert all("connection reset" in e["detail"] for e in log.of("snapshot_ignored"))


def test_hmac_key_from_ssm_or_secrets_manager(monkeypatch, tmp_path):
    from moto import mock_aws

    from engine.settings import SnapshotSettings
    from engine.snapshots.keys import resolve_hmac_key
    for k, v in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        import boto3
        boto3.client("ssm").put_parameter(Name="/warmllm/snap", Value="from-ssm", Type="SecureString")
        boto3.client("secretsmanager").create_secret(Name="warmllm-snap", SecretString="from-secret")
        s = resolve_hmac_key(SnapshotSettings.from_env({"SNAPSHOT_HMAC_KEY_SSM": "/warmllm/snap"}))
        assert s.hmac_key == b"from-ssm"
        s = resolve_hmac_key(SnapshotSettings.from_env({"SNAPSHOT_HMAC_KEY_SECRET": "warmllm-snap"}))
        assert s.hmac_key == b"from-secret"
        # a secret in another region, given as its ARN (as the templates take it), is read from there
        arn = boto3.client("secretsmanager", region_name="eu-west-1").create_secret(
            Name="warmllm-snap-eu", SecretString="from-eu")["ARN"]
        s = resolve_hmac_key(SnapshotSettings.from_env({"SNAPSHOT_HMAC_KEY_SECRET": arn}))
        assert arn.split(":")[3] == "eu-west-1" and s.hmac_key == b"from-eu"
        with pytest.raises(ValueError, match="SNAPSHOT_HMAC_KEY_SSM='/nope'.*ssm:GetParameter"):
            resolve_hmac_key(SnapshotSettings.from_env({"SNAPSHOT_HMAC_KEY_SSM": "/nope"}))
        # the store built from settings MACs with the key it read
        st = S.SnapshotStore.from_settings(FP, LAYOUT, SnapshotSettings(
            memory_mb=0, dir=str(tmp_path), flush_s=0, hmac_key_ssm="/warmllm/snap"), log=Log())
        assert st.hmac_key == b"from-ssm"
    with pytest.raises(ValueError, match="both set"):
        SnapshotSettings.from_env({"SNAPSHOT_HMAC_KEY": "a", "SNAPSHOT_HMAC_KEY_SSM": "/b"})


@pytest.mark.parametrize("var,endpoint", [("SNAPSHOT_HMAC_KEY_SSM", "AWS_ENDPOINT_URL_SSM"),
                                          ("SNAPSHOT_HMAC_KEY_SECRET", "AWS_ENDPOINT_URL_SECRETS_MANAGER")])
def test_hmac_key_read_is_bounded_when_the_service_never_answers(monkeypatch, var, endpoint):
    """In a VPC without a route to SSM / Secrets Manager the read must fail init quickly, naming
    the variable, not hang on botocore's 60 s timeouts and retries."""
    from engine.settings import SnapshotSettings
    from engine.snapshots.keys import resolve_hmac_key
    hole = BlackHole()
    for k, v in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1",
                 endpoint: hole.url}.items():
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=var):
        resolve_hmac_key(SnapshotSettings.from_env({var: "/warmllm/snap"}))
    assert time.monotonic() - t0 < 9.0       # Lambda's init phase is 10 s
