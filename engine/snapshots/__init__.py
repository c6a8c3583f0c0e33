"""Prefix-state snapshots: a State captured at a token position, kept in memory, a directory
(EFS) and S3, so a later request — on this instance or another — resumes instead of
re-prefilling.

    format  the `.wsnap` wire format: header, checksum, (de)serialisation of the layer states
    tiers   the `Tier` protocol every stored tier implements; `MemoryTier` and `DirTier`
    s3      `S3Tier`
    store   `SnapshotStore`: lookup memory → directory → S3, promotion, the background writer

Anything read back that fails its checks is ignored with one `{"event": "snapshot_ignored", ...}`
line through the store's logger (engine/jsonlog.py unless given another) and deleted.
"""
from engine.jsonlog import log_event
from engine.snapshots.format import (FORMAT_VERSION, MAGIC, SUFFIX, Key, Snapshot, SnapshotError, deserialize,
                                     prefix_hashes, serialize, snapshot_name, state_layout)
from engine.snapshots.s3 import S3Tier, parse_s3_uri
from engine.snapshots.store import (DEFAULT_DIR_MB, DEFAULT_EVERY, DEFAULT_FLUSH_S, DEFAULT_MEMORY_MB,
                                    SLOW_TIER_MIN_GAIN, Restored, SnapshotStore)
from engine.snapshots.tiers import DirTier, MemoryTier, Tier

__all__ = [
    "DEFAULT_DIR_MB", "DEFAULT_EVERY", "DEFAULT_FLUSH_S", "DEFAULT_MEMORY_MB", "FORMAT_VERSION", "MAGIC",
    "SLOW_TIER_MIN_GAIN", "SUFFIX", "DirTier", "Key", "MemoryTier", "Restored", "S3Tier", "Snapshot",
    "SnapshotError", "SnapshotStore", "Tier", "deserialize", "log_event", "parse_s3_uri", "prefix_hashes",
    "serialize", "snapshot_name", "state_layout",
]
