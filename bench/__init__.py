from __future__ import annotations

# Before any bench module imports numpy: the engine sets the thread environment OpenBLAS reads
# once, at load (engine/threads.py); measured after numpy, OpenBLAS spun ~0.1 s after every product.
import engine  # noqa: F401


def cpu_name() -> str:
    """The host's CPU model as /proc/cpuinfo names it, for a receipt."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
