"""The snapshot store without a model: the .wsnap format, every kind of bad snapshot, the
memory / directory / S3 tiers (moto in-process and moto's server over real HTTP), caps and
eviction, the background writer, and two processes writing the same key."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import boto3
import numpy as np
import pytest

from engine import snapshots as S
from engine.settings import SnapshotSettings
from engine.state import KV_DTYPE, AttentionState, DeltaNetState, State

ROOT = Path(__file__).resolve().parents[2]
FP = "f" * 32
LAYOUT = [("deltanet", (3, 16), (2, 4, 4)), ("deltanet", (3, 16), (2, 4, 4)), ("attention", (1, 8), ())]


def make_snap(n: int, seed: int = 0, logits: bool = False) -> S.Snapshot:
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    # attention capacity larger than n: only the first n positions may be stored; K/V in the
    # cache's type (float16)
    h = lambda *s: r(*s).astype(KV_DTYPE)  # noqa: E731
    state = State(n, [DeltaNetState(r(3, 16), r(2, 4, 4)), DeltaNetState(r(3, 16), r(2, 4, 4)),
                      AttentionState(h(1, n + 7, 8), h(1, n + 7, 8))])
    tokens = rng.integers(0, 1000, n).astype(np.int32)
    return S.Snapshot(tokens, state, r(50) if logits else None)


def key_of(snap: S.Snapshot) -> S.Key:
    return (snap.n_tokens, S.prefix_hashes(snap.tokens, [snap.n_tokens])[snap.n_tokens])


class Log(list):
    def __call__(self, event, **fields):
        self.append({"event": event, **fields})

    def of(self, event):
        return [e for e in self if e["event"] == event]


def store(tmp_path=None, *, memory_mb=64, s3_uri=None, s3_client=None, dir_mb=1024, log=None, **kw):
    return S.SnapshotStore(FP, LAYOUT, memory_bytes=int(memory_mb * (1 << 20)),
                           dir=str(tmp_path) if tmp_path else None, dir_bytes=int(dir_mb * (1 << 20)),
                           s3_uri=s3_uri, s3_client=s3_client, every=0, flush_at_exit_s=0,
                           log=log if log is not None else Log(), **kw)


# ---- format --------------------------------------------------------------------------------

def test_round_trip_slices_kv_and_keeps_every_array():
    snap = make_snap(10, logits=True)
    key = key_of(snap)
    data = S.serialize(snap, FP, key[1])
    back = S.deserialize(data, fingerprint=FP, key=key, tokens=snap.tokens.tolist(), layout=LAYOUT)
    assert back.state.max_abs_diff(snap.state) == 0.0
    assert back.state.layers[2].k.shape == (1, 10, 8)  # sliced to n, not capacity
    assert np.array_equal(back.tokens, snap.tokens) and np.array_equal(back.logits, snap.logits)
    assert data[:8] == S.MAGIC and len(data) % 1 == 0
    # arrays parsed from a bytearray are writable (decode updates S in place)
    back.state.layers[0].S += 1


def test_wire_format_bytes_are_pinned():
    """The `.wsnap` bytes of a fixed snapshot: snapshots written by an older build on EFS or S3
    must stay readable, so a change here is a FORMAT_VERSION bump, never an accident. Version 1's
    digest was produced by engine/snapshots.py before it became a package (commit 0f4e76c);
    version 2 (float16 attention K/V) by engine/snapshots/format.py when the cache became float16."""
    f = lambda n, *s: np.arange(np.prod(s), dtype=np.float32).reshape(s) * 0.5 - n  # noqa: E731
    h = lambda n, *s: f(n, *s).astype(np.float16)  # noqa: E731
    state = State(5, [DeltaNetState(f(1, 3, 16), f(2, 2, 4, 4)), DeltaNetState(f(3, 3, 16), f(4, 2, 4, 4)),
                      AttentionState(h(5, 1, 9, 8), h(6, 1, 9, 8))])
    snap = S.Snapshot(np.arange(5, dtype=np.int32) * 7, state, np.linspace(-1, 1, 50, dtype=np.float32))
    data = bytes(S.serialize(snap, FP, "ab" * 16, created=1700000000.25))
    assert S.FORMAT_VERSION == 2
    assert len(data) == 2080
    assert hashlib.sha256(data).hexdigest() == "679f8c97acdbc3b867f0ecc2c0023ca602c7282ac2c9839257adb909ba1277d9"


def test_prefix_hashes_match_one_shot_hashes():
    toks = list(range(100))
    inc = S.prefix_hashes(toks, [10, 50, 100, 7])
    for p, h in inc.items():
        assert h == S.prefix_hashes(toks[:p], [p])[p]
    assert len(set(inc.values())) == 4


def _bad(kind: str, snap: S.Snapshot, key: S.Key) -> bytes:
    data = bytearray(S.serialize(snap, FP, key[1]))
    if kind == "truncated":
        return bytes(data[: len(data) // 2])
    if kind == "corrupt":
        data[len(data) // 2] ^= 0xFF
        return bytes(data)
    if kind == "bad_magic":
        data[:8] = b"NOTASNAP"
        return bytes(data)
    if kind == "wrong_version":
        struct.pack_into("<H", data, 8, S.FORMAT_VERSION + 1)
        return bytes(data)
    if kind == "wrong_model":
        return bytes(S.serialize(snap, "0" * 32, key[1]))
    if kind == "stale":  # another prefix's snapshot sitting under this key
        return bytes(S.serialize(snap, FP, "1" * 32))
    if kind == "garbage":
        return b"\x00" * 5
    raise AssertionError(kind)


REASON = {"truncated": "truncated", "corrupt": "corrupt", "bad_magic": "corrupt", "wrong_version": "wrong_version",
          "wrong_model": "wrong_model", "stale": "stale", "garbage": "truncated"}


def test_a_memory_hit_asks_slower_tiers_only_for_prefixes_worth_restoring(tmp_path):
    """With memory holding n tokens, a directory snapshot a few tokens longer is not worth its
    restore (nor S3's round trip): only one SLOW_TIER_MIN_GAIN or more tokens longer is asked for."""
    gain = S.SLOW_TIER_MIN_GAIN
    full = make_snap(100 + 2 * gain, seed=3, logits=True)
    toks = full.tokens.tolist()

    def snap_of(n):
        return S.Snapshot(full.tokens[:n], make_snap(n, seed=n).state)

    writer = store(tmp_path, memory_mb=0)
    for n in (100 + gain - 1, 100 + gain):
        writer.put((n, S.prefix_hashes(toks, [n])[n]), snap_of(n))
    assert writer.flush(10)
    asked = []
    st = store(tmp_path)
    real = st.slow_tiers[0].exists
    st.slow_tiers[0].exists = lambda key: asked.append(key[0]) or real(key)
    st.put((100, S.prefix_hashes(toks, [100])[100]), snap_of(100))
    assert st.flush(10)
    asked.clear()  # the put's own background write looked too
    hit = st.lookup(toks, [100, 100 + gain - 1])
    assert (hit.tier, hit.snapshot.n_tokens) == ("memory", 100) and asked == []
    hit = st.lookup(toks, [100, 100 + gain - 1, 100 + gain])
    assert (hit.tier, hit.snapshot.n_tokens) == ("efs", 100 + gain) and asked == [100 + gain]
    st2 = store(tmp_path)  # memory empty: every candidate is asked for
    assert st2.lookup(toks, [100 + gain - 1]).tier == "efs"


@pytest.mark.parametrize("kind", sorted(REASON))
def test_deserialize_names_each_kind_of_bad_snapshot(kind):
    snap = make_snap(9)
    key = key_of(snap)
    with pytest.raises(S.SnapshotError) as e:
        S.deserialize(_bad(kind, snap, key), fingerprint=FP, key=key, tokens=snap.tokens.tolist(), layout=LAYOUT)
    assert e.value.reason == REASON[kind]


def test_deserialize_rejects_other_tokens_other_layout_and_old_age():
    snap = make_snap(9)
    key = key_of(snap)
    data = S.serialize(snap, FP, key[1], created=time.time() - 100)
    other = snap.tokens.tolist()
    other[3] += 1
    with pytest.raises(S.SnapshotError, match="stale"):
        S.deserialize(data, fingerprint=FP, key=key, tokens=other, layout=LAYOUT)
    with pytest.raises(S.SnapshotError, match="wrong_model"):
        S.deserialize(data, fingerprint=FP, key=key, tokens=None,
                      layout=[("deltanet", (3, 16), (2, 4, 8))] + LAYOUT[1:])
    with pytest.raises(S.SnapshotError, match="stale"):
        S.deserialize(data, fingerprint=FP, key=key, tokens=None, layout=LAYOUT, max_age_s=10)
    S.deserialize(data, fingerprint=FP, key=key, tokens=None, layout=LAYOUT, max_age_s=1000)


def test_no_pickle_in_the_reader():
    for path in (ROOT / "engine" / "snapshots").glob("*.py"):
        src = path.read_text()
        assert "import pickle" not in src and "allow_pickle=True" not in src and "np.load(" not in src, path


# ---- tiers ---------------------------------------------------------------------------------

def test_memory_tier_is_lru_under_its_byte_cap():
    snaps = [make_snap(20, seed=i) for i in range(4)]
    cap = snaps[0].nbytes * 2 + 10
    tier = S.MemoryTier(cap)
    for s in snaps[:2]:
        tier.put(key_of(s), s)
    tier.get(key_of(snaps[0]))  # touch: snaps[1] is now the oldest
    tier.put(key_of(snaps[2]), snaps[2])
    assert key_of(snaps[1]) not in tier and key_of(snaps[0]) in tier and key_of(snaps[2]) in tier
    assert tier.bytes <= cap
    assert not tier.put(("x", 1), make_snap(2000))  # larger than the cap: refused


def test_lookup_prefers_the_longest_prefix_and_needs_logits_for_the_whole_prompt(tmp_path):
    st = store()
    base = make_snap(30, seed=1, logits=True)
    toks = base.tokens.tolist()
    for n in (10, 20):
        st.put((n, S.prefix_hashes(toks, [n])[n]), S.Snapshot(base.tokens[:n], make_snap(n, 2).state))
    st.put(key_of(base), S.Snapshot(base.tokens, base.state, None))  # end of prompt without logits
    hit = st.lookup(toks, [10, 20, 30])
    assert hit.tier == "memory" and hit.snapshot.n_tokens == 20
    st.put(key_of(base), base)
    assert st.lookup(toks, [30]).snapshot.n_tokens == 30
    assert st.lookup(toks + [5, 6], []).snapshot.n_tokens == 30  # memory lengths are always candidates
    assert st.lookup(toks, [10, 20], min_len=31) is None


def test_directory_tier_round_trip_promotion_and_log(tmp_path):
    log = Log()
    st = store(tmp_path, memory_mb=0, log=log)
    snap = make_snap(12, logits=True)
    st.put(key_of(snap), snap)
    assert st.flush(10)
    [w] = log.of("snapshot_write")
    assert w["tier"] == "efs" and w["ok"] and w["bytes"] > 0 and "ms" in w
    files = list((tmp_path / FP).iterdir())
    assert [f.name for f in files] == [S.snapshot_name(key_of(snap))]  # no temp files left behind
    st2 = store(tmp_path, log=log)  # a new process: memory empty
    hit = st2.lookup(snap.tokens.tolist(), [12])
    assert hit.tier == "efs" and hit.nbytes == files[0].stat().st_size
    assert hit.snapshot.state.max_abs_diff(snap.state) == 0.0
    assert st2.lookup(snap.tokens.tolist(), [12]).tier == "memory"  # promoted


@pytest.mark.parametrize("kind", sorted(REASON))
def test_bad_directory_snapshot_is_ignored_logged_deleted_and_replaced(tmp_path, kind):
    log = Log()
    st = store(tmp_path, memory_mb=0, log=log)
    good = make_snap(16, seed=3)
    short = S.Snapshot(good.tokens[:8], make_snap(8, 4).state)
    st.put(key_of(short), short)
    st.flush(10)
    path = tmp_path / FP / S.snapshot_name(key_of(good))
    path.write_bytes(_bad(kind, good, key_of(good)))
    hit = st.lookup(good.tokens.tolist(), [8, 16, 20], min_len=1)
    assert hit is not None and hit.snapshot.n_tokens == 8  # the request proceeds from what is good
    [ign] = log.of("snapshot_ignored")
    assert ign["reason"] == REASON[kind] and ign["tier"] == "efs" and ign["deleted"] is True
    assert not path.exists()
    st.put(key_of(good), good)  # the next capture writes a good one in its place
    assert st.flush(10)
    assert store(tmp_path).lookup(good.tokens.tolist() + [1], [16]).snapshot.n_tokens == 16


def test_a_bad_directory_snapshot_replaced_after_its_read_is_not_deleted(tmp_path):
    """Another instance may write a good file over the bad one between this lookup's read and
    its delete: the delete must leave the new file alone."""
    log = Log()
    st = store(tmp_path, memory_mb=0, log=log)
    good = make_snap(16, seed=3, logits=True)
    path = tmp_path / FP / S.snapshot_name(key_of(good))
    path.parent.mkdir(parents=True)
    path.write_bytes(_bad("corrupt", good, key_of(good)))
    real_read = st.dir.read

    def read_then_replaced(key, limit=None):
        data = real_read(key, limit)
        tmp = path.with_suffix(".new")
        tmp.write_bytes(S.serialize(good, FP, key[1]))
        os.replace(tmp, path)  # as DirTier.write does: a new inode
        return data

    st.dir.read = read_then_replaced
    assert st.lookup(good.tokens.tolist(), [16]) is None
    [ign] = log.of("snapshot_ignored")
    assert ign["reason"] == "corrupt" and ign["deleted"] is False and path.exists()
    assert store(tmp_path).lookup(good.tokens.tolist(), [16]).snapshot.n_tokens == 16


class _BytesTier:
    """A stored tier the store has never heard of, implementing only the Tier protocol."""

    name = "bytes"

    def __init__(self):
        self.items, self.calls = {}, []

    def existing(self, keys):
        self.calls.append(("existing", list(keys)))
        return [k for k in keys if k in self.items]

    def exists(self, key):
        self.calls.append(("exists", key))
        return key in self.items

    def read(self, key, limit=None):
        self.calls.append(("read", key))
        return self.items.get(key)

    def write(self, key, data):
        self.items[key] = bytearray(data)

    def delete(self, key):
        return self.items.pop(key, None) is not None


def test_the_store_drives_any_tier_through_the_tier_protocol():
    """One lookup asks the tier once which candidates it holds (`existing`) and reads the
    longest; the writer asks `exists` and writes; a bad one is deleted through `delete`."""
    log = Log()
    tier = _BytesTier()
    st = store(memory_mb=0, log=log)
    st.slow_tiers = [tier]
    snap = make_snap(24, logits=True)
    st.put(key_of(snap), snap)
    assert st.flush(10) and log.of("snapshot_write")[0]["tier"] == "bytes"
    tier.calls.clear()
    toks = snap.tokens.tolist() + [5]
    hit = st.lookup(toks, [8, 24])
    assert hit.tier == "bytes" and hit.snapshot.state.max_abs_diff(snap.state) == 0.0
    assert [c[0] for c in tier.calls] == ["existing", "read"] and tier.calls[1][1] == key_of(snap)
    tier.items[key_of(snap)] = bytearray(_bad("corrupt", snap, key_of(snap)))
    assert st.lookup(toks, [24]) is None and key_of(snap) not in tier.items
    assert log.of("snapshot_ignored")[0]["deleted"] is True


def test_missing_between_check_and_read_is_ignored(tmp_path):
    log = Log()
    st = store(tmp_path, memory_mb=0, log=log)
    snap = make_snap(8)
    st.put(key_of(snap), snap)
    st.flush(10)
    st.dir.read = lambda key, limit=None: None  # evicted by another instance after exists() said yes
    assert st.lookup(snap.tokens.tolist(), [8]) is None
    assert log.of("snapshot_ignored")[0]["reason"] == "missing"


def test_directory_cap_evicts_oldest_first_and_cleans_dead_temp_files(tmp_path):
    snaps = [make_snap(40, seed=i) for i in range(5)]
    size = len(S.serialize(snaps[0], FP, "0" * 32))
    tier = S.DirTier(str(tmp_path), FP, cap_bytes=int(size * 2.5))
    for i, s in enumerate(snaps):
        tier.write(key_of(s), S.serialize(s, FP, key_of(s)[1]))
        os.utime(tier.path(key_of(s)), (1000 + i, 1000 + i))
    tier.evict()
    left = sorted(p.name for p in (tmp_path / FP).iterdir())
    assert left == sorted(S.snapshot_name(key_of(s)) for s in snaps[3:])
    dead = tmp_path / FP / ".x.wsnap.1.abc.tmp"
    dead.write_bytes(b"partial")
    os.utime(dead, (0, 0))
    tier.evict()
    assert not dead.exists()


def test_writes_wait_for_release_and_flush_reports_timeouts(tmp_path):
    log = Log()
    st = store(tmp_path, log=log)
    st.hold()
    snap = make_snap(8)
    st.put(key_of(snap), snap)
    time.sleep(0.2)
    assert st.pending == 1 and not log.of("snapshot_write")  # held: the first token is not out yet
    st.release()
    assert st.flush(10) and st.pending == 0
    assert log.of("snapshot_write")[0]["queued_ms"] >= 150


def test_default_log_is_one_json_line_on_stdout(capsys):
    S.log_event("snapshot_ignored", reason="corrupt", tier="s3")
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[0]) == {"event": "snapshot_ignored", "reason": "corrupt", "tier": "s3"}


def test_settings_from_env_read_every_snapshot_variable(tmp_path):
    env = {"SNAPSHOT_MEMORY_MB": "3", "SNAPSHOT_DIR": str(tmp_path), "SNAPSHOT_DIR_MB": "5",
           "SNAPSHOT_S3_URI": "s3://b/some/prefix/", "SNAPSHOT_EVERY": "128", "SNAPSHOT_MAX_AGE_S": "60",
           "SNAPSHOT_FLUSH_S": "0"}
    st = S.SnapshotStore.from_settings(FP, LAYOUT, SnapshotSettings.from_env(env))
    assert st.memory.cap_bytes == 3 << 20 and st.dir.cap_bytes == 5 << 20 and st.every == 128
    assert st.s3.bucket == "b" and st.s3.prefix == f"some/prefix/{FP}" and st.max_age_s == 60
    assert st.tiers == ["memory", "efs", "s3"]
    with pytest.raises(ValueError):
        S.parse_s3_uri("bucket/x")


# ---- S3 -------------------------------------------------------------------------------------



@pytest.mark.parametrize("kind", ["truncated", "corrupt", "wrong_version", "wrong_model", "stale"])
def test_s3_in_process_round_trip_and_bad_objects(moto_s3, kind):
    log = Log()
    st = store(memory_mb=0, s3_uri="s3://snaps/pre", s3_client=moto_s3, log=log)
    snap = make_snap(20, logits=True)
    st.put(key_of(snap), snap)
    assert st.flush(10)
    obj = f"pre/{FP}/{S.snapshot_name(key_of(snap))}"
    assert moto_s3.head_object(Bucket="snaps", Key=obj)["ContentLength"] == log.of("snapshot_write")[0]["bytes"]
    hit = st.lookup(snap.tokens.tolist(), [20])
    assert hit.tier == "s3" and hit.snapshot.state.max_abs_diff(snap.state) == 0.0
    moto_s3.put_object(Bucket="snaps", Key=obj, Body=_bad(kind, snap, key_of(snap)))
    assert st.lookup(snap.tokens.tolist(), [20]) is None
    assert log.of("snapshot_ignored")[0]["reason"] == REASON[kind]
    assert moto_s3.list_objects_v2(Bucket="snaps").get("KeyCount", 0) == 0  # deleted


def test_s3_hit_is_promoted_to_memory_and_directory(moto_s3, tmp_path):
    log = Log()
    snap = make_snap(20)
    st = store(memory_mb=0, s3_uri="s3://snaps", s3_client=moto_s3, log=log)
    st.put(key_of(snap), snap)
    st.flush(10)
    st2 = store(tmp_path, s3_uri="s3://snaps", s3_client=moto_s3, log=log)
    assert st2.lookup(snap.tokens.tolist() + [1], [20]).tier == "s3"
    assert st2.flush(10)
    assert (tmp_path / FP / S.snapshot_name(key_of(snap))).exists()
    assert st2.lookup(snap.tokens.tolist() + [1], [20]).tier == "memory"
    assert store(tmp_path, log=log).lookup(snap.tokens.tolist() + [1], [20]).tier == "efs"


class _CountingGets:
    """An S3 client whose get_object calls are recorded (their Range), passed through."""

    def __init__(self, client):
        self._client, self.ranges = client, []

    def get_object(self, **kw):
        self.ranges.append(kw.get("Range"))
        return self._client.get_object(**kw)

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_s3_reads_a_snapshot_in_parallel_ranges(moto_s3, monkeypatch):
    monkeypatch.setattr(S.S3Tier, "PART_BYTES", 1000)
    log = Log()
    snap = make_snap(40, logits=True)
    data = bytes(S.serialize(snap, FP, key_of(snap)[1]))
    client = _CountingGets(moto_s3)
    tier = S.S3Tier("s3://snaps/ranged", FP, client=client)
    tier.write(key_of(snap), data)
    n_parts = -(-len(data) // 1000)
    assert n_parts > 3
    # after a HEAD (the store's lookup asks one first): every range at once
    assert tier.existing([key_of(snap)]) == [key_of(snap)]
    assert bytes(tier.read(key_of(snap))) == data
    assert sorted(client.ranges, key=lambda r: int(r[6:].split("-")[0])) == [
        f"bytes={lo}-{min(len(data), lo + 1000) - 1}" for lo in range(0, len(data), 1000)]
    # without one: the first range tells the size, then the rest
    client.ranges.clear()
    assert bytes(tier.read(key_of(snap))) == data and len(client.ranges) == n_parts
    assert client.ranges[0] == "bytes=0-999"
    # what a HEAD learnt is kept for one lookup only (a long-lived instance asks about many keys)
    other = (7, "0" * 32)
    tier.write(other, data)
    assert tier.existing([key_of(snap), other]) == [key_of(snap), other]
    tier.existing([key_of(snap)])
    assert set(tier._heads) == {key_of(snap)}
    # and through the store, as a cold instance restores
    st = store(memory_mb=0, s3_uri="s3://snaps/ranged", s3_client=client, log=log)
    hit = st.lookup(snap.tokens.tolist(), [40])
    assert hit.tier == "s3" and hit.snapshot.state.max_abs_diff(snap.state) == 0.0


def test_s3_object_replaced_between_head_and_read_is_a_read_error_not_a_mixture(moto_s3, monkeypatch):
    monkeypatch.setattr(S.S3Tier, "PART_BYTES", 1000)
    snap = make_snap(40, logits=True)
    tier = S.S3Tier("s3://snaps/race", FP, client=moto_s3)
    tier.write(key_of(snap), S.serialize(snap, FP, key_of(snap)[1]))
    assert tier.exists(key_of(snap))
    tier.write(key_of(snap), S.serialize(make_snap(40, seed=5, logits=True), FP, key_of(snap)[1]))
    with pytest.raises(Exception, match="PreconditionFailed|412"):
        tier.read(key_of(snap))


def test_s3_empty_object_is_ignored_and_deleted(moto_s3):
    log = Log()
    snap = make_snap(20, logits=True)
    st = store(memory_mb=0, s3_uri="s3://snaps/empty", s3_client=moto_s3, log=log)
    obj = f"empty/{FP}/{S.snapshot_name(key_of(snap))}"
    moto_s3.put_object(Bucket="snaps", Key=obj, Body=b"")
    assert st.lookup(snap.tokens.tolist(), [20]) is None
    assert log.of("snapshot_ignored")[0]["reason"] == "truncated"
    assert moto_s3.list_objects_v2(Bucket="snaps").get("KeyCount", 0) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto_server():
    """moto's server mode: real HTTP on 127.0.0.1, as a second process would reach S3."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="snaps")
    yield url
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_s3_over_http_with_moto_server(moto_server):
    log = Log()
    snap = make_snap(33, logits=True)
    st = store(memory_mb=0, s3_uri="s3://snaps/http", s3_endpoint_url=moto_server, log=log)  # its own client
    st.put(key_of(snap), snap)
    assert st.flush(20)
    assert log.of("snapshot_write")[0]["ok"]
    st2 = store(memory_mb=0, s3_uri="s3://snaps/http", s3_endpoint_url=moto_server, log=log)
    hit = st2.lookup(snap.tokens.tolist(), [5, 33])
    assert hit.tier == "s3" and hit.snapshot.state.max_abs_diff(snap.state) == 0.0


WRITER = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [{root!r}, {tests!r}]
    from test_snapshot_store import make_snap, key_of, store, FP
    from engine import snapshots as S
    kind, where, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    snap = make_snap(64, seed=11, logits=True)
    data = S.serialize(snap, FP, key_of(snap)[1])
    # attempts=8: moto's server races on concurrent PUTs of one key (its FakeKey.etag reads the
    # value of a key the other PUT has just disposed: a 500, "I/O operation on closed file",
    # for 73 of 160 PUTs from 4 threads); botocore's standard mode retries a 500, as S3 asks
    tier = S.DirTier(where, FP, 1 << 30) if kind == "dir" else S.S3Tier("s3://snaps/race", FP, endpoint_url=where,
                                                                        attempts=8)
    while time.time() < start:
        time.sleep(0.001)
    for _ in range(25):
        tier.write(key_of(snap), data)
    print("done")
""")


@pytest.mark.parametrize("kind", ["dir", "s3"])
def test_two_processes_writing_the_same_key(kind, tmp_path, moto_server):
    where = str(tmp_path) if kind == "dir" else moto_server
    script = WRITER.format(root=str(ROOT), tests=str(ROOT / "tests" / "engine"))
    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", script, kind, where, str(start)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    snap = make_snap(64, seed=11, logits=True)
    reads = 0
    if kind == "dir":  # read while they write: every read sees a whole, valid file
        tier = S.DirTier(where, FP, 1 << 30)
        while any(p.poll() is None for p in procs):
            got = tier.read(key_of(snap))
            if got is not None:
                S.deserialize(got, fingerprint=FP, key=key_of(snap), tokens=None, layout=LAYOUT)
                reads += 1
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "done", err
    st = store(tmp_path if kind == "dir" else None, memory_mb=0,
               s3_uri="s3://snaps/race" if kind == "s3" else None, s3_endpoint_url=moto_server)
    hit = st.lookup(snap.tokens.tolist(), [64])
    assert hit is not None and hit.snapshot.state.max_abs_diff(snap.state) == 0.0
    if kind == "dir":
        assert reads > 0
        assert [p.name for p in (tmp_path / FP).iterdir()] == [S.snapshot_name(key_of(snap))]
