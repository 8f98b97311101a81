"""scankit: an inclusive prefix sum on the best backend this machine has.

    import scankit
    scankit.prefix_sum(x)          # x: any C-contiguous float32 buffer
    scankit.load().trace.text()    # which backend ran, and why

The CUDA variants come with ``pip install 'scankit[cuda13]'`` (or ``[cuda12]``);
without them, or without a GPU, the CPU twin answers and the trace says why.
"""

from __future__ import annotations

import threading
from typing import Any

import cuplug

__version__ = "0.1.0"
BACKEND = "scan"
_lock = threading.Lock()
_backend: cuplug.Backend | None = None


def load() -> cuplug.Backend:
    """A new instance of the best `scan` backend (close it, or use it as a context manager)."""
    return cuplug.load(BACKEND)


def prefix_sum(x: Any) -> Any:
    """Inclusive prefix sum of a float32 array, on one shared instance."""
    global _backend
    with _lock:
        if _backend is None:
            _backend = load()
    return _backend.run("prefix_sum", x)
