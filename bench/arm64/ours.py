"""Our side of `make bench-arm64`: the phases of `llama_driver.c`, on our engine, one thread.

    python -m bench.arm64.ours MODEL [P1 P2 N]     (default 128 512 16; run under qemu by run.py)

After load and a warm-up like the driver's (a 70-token prefill and 2 decode steps, which also
loads every kernel from the numba cache or compiles it), the phases are bracketed by markers the
counting plugin snapshots at: 0, prefill P1 (fresh session), 1, prefill P2 (fresh session), 2,
N decode steps continuing the P2 prompt, 3. A marker is `lseek(-1, MARK_MAGIC, phase)`, EBADF
on any kernel. Token ids: the driver's LCG, so both sides see the same ids.
"""
from __future__ import annotations

import json
import os
import sys
import time

MARK_MAGIC = 0x5741524D  # "WARM": insn_classes.c and llama_driver.c


def mark(phase: int, times: list[float] | None = None) -> None:
    try:
        os.lseek(-1, MARK_MAGIC, phase)
    except OSError:
        pass  # EBADF is the point: the call only exists for the plugin's syscall callback
    if times is not None:  # natively, the phases' wall times (bench/arm64/calibrate.py)
        times.append(time.perf_counter())


class Lcg:
    """llama_driver.c's `next_id`: ids in [0, 4000) from a 32-bit LCG."""

    def __init__(self, seed: int = 12345) -> None:
        self.state = seed

    def ids(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            self.state = (self.state * 1103515245 + 12345) & 0xFFFFFFFF
            out.append((self.state >> 8) % 4000)
        return out


def main(argv: list[str]) -> int:
    from engine.generate import Engine
    from engine.quant import paths
    from engine.session import Session

    if len(argv) not in (1, 4):
        print("usage: python -m bench.arm64.ours MODEL [P1 P2 N]", file=sys.stderr)
        return 2
    p1, p2, n = (int(x) for x in argv[1:]) if len(argv) == 4 else (128, 512, 16)
    eng = Engine.load(argv[0], threads=1)
    ids = Lcg()
    s = Session(eng.model)
    s.prefill(ids.ids(70))
    for t in ids.ids(2):
        s.step(t)
    at: list[float] = []
    mark(0, at)
    Session(eng.model).prefill(ids.ids(p1))
    mark(1, at)
    s = Session(eng.model)
    s.prefill(ids.ids(p2))
    mark(2, at)
    for t in ids.ids(n):
        s.step(t)
    mark(3, at)
    print(json.dumps({"p1": p1, "p2": p2, "n": n, "n_vocab": eng.model.config.n_vocab, "threads": eng.threads,
                      "target": paths.summary(), "kernels": eng.kernel_paths,
                      "phase_ms": [round(1e3 * (b - a), 3) for a, b in zip(at, at[1:])]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
