from __future__ import annotations

# Before any bench module imports numpy: the engine sets the thread environment OpenBLAS reads
# once, at load (engine/threads.py); measured after numpy, OpenBLAS spun ~0.1 s after every product.
import engine  # noqa: F401
