"""One JSON emitter for the whole process (engine/jsonlog.py): the snapshot store, the request
line, the watchdog and the model download all write through it."""
from __future__ import annotations

import json
import threading

from engine import jsonlog
from engine.snapshots import store as snapshot_store


def test_every_logging_module_uses_the_one_emitter():
    from function import model_source, request_log, runtime, watchdog

    for mod in (request_log, watchdog, model_source, runtime):
        assert mod.emit is jsonlog.emit, mod.__name__
    assert snapshot_store.SnapshotStore.__init__.__kwdefaults__["log"] is jsonlog.log_event


def test_lines_from_two_threads_stay_whole(capsys):
    def burst(who: str) -> None:
        for i in range(300):
            jsonlog.log_event("snapshot_write", who=who, i=i, pad="é" * 200)

    threads = [threading.Thread(target=burst, args=(w,)) for w in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 600
    got = [json.loads(line) for line in lines]  # each a whole object
    assert {(g["who"], g["i"]) for g in got} == {(w, i) for w in "ab" for i in range(300)}
    assert got[0]["pad"] == "é" * 200 and "é" in lines[0]  # UTF-8 as is, as the request line always was
