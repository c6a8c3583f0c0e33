"""engine.allocator: freed activation memory stays in the process (no page faults per pass)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import allocator

ROOT = Path(__file__).resolve().parents[2]

ALLOC_CYCLES = """
import resource, sys
if sys.argv[1] == "engine":
    import engine
import numpy as np
faults = []
for rep in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(2_000_000, np.float32) for _ in range(40)]  # 320 MB in 8 MB blocks, as a prefill's
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del arrays
print(faults[-1])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_importing_the_engine_keeps_freed_activation_memory():
    # a prefill frees and re-allocates the same activations every pass: with glibc's defaults
    # every pass faults its pages in again (~21k faults per pass here: numpy asks for huge
    # pages for big arrays, so fewer than one per 4 KB page); with the engine's settings ~0
    pages = 40 * 8_000_000 // 4096
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                            "GLIBC_TUNABLES")}

    def third_pass_faults(what: str) -> int:
        r = subprocess.run([sys.executable, "-c", ALLOC_CYCLES, what], capture_output=True, text=True, env=env,
                           timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-1000:]
        return int(r.stdout.split()[-1])

    assert third_pass_faults("numpy") > pages // 10  # the default: the pages come back every time
    assert third_pass_faults("engine") < pages // 100


def test_user_malloc_settings_are_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert allocator.keep_freed_memory() is False
