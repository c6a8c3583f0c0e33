"""Progress on stderr for the long local steps (model build, first kernel compile): a line when a
step starts, one every few seconds while it runs, and one with its time when it ends, so a
newcomer's terminal never sits silent for 20 s. Lambda's own progress goes to the JSON log."""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager


@contextmanager
def heartbeat(what: str, hint: str = "", every_s: float = 5.0, stream=None):
    """Print ``what…`` now, ``… still <what> (N s)`` every ``every_s``, and the elapsed time at the end."""
    out = stream or sys.stderr
    t0 = time.monotonic()
    print(f"warmllm: {what}{' (' + hint + ')' if hint else ''}…", file=out, flush=True)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            print(f"warmllm: … still {what} ({time.monotonic() - t0:.0f} s)", file=out, flush=True)

    t = threading.Thread(target=beat, name="warmllm-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        print(f"warmllm: {what}: done in {time.monotonic() - t0:.1f} s", file=out, flush=True)
