"""scankit: an inclusive prefix sum on the best backend this machine has.

    import scankit
    scankit.prefix_sum(x)          # x: any C-contiguous float32 array (host or GPU)
    scankit.segment_sum(x, 4096)   # x: float16/float32, n a multiple of the segment: one float32 sum each
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


def _shared() -> cuplug.Backend:
    global _backend
    with _lock:
        if _backend is None:
            _backend = load()
    return _backend


def prefix_sum(x: Any) -> Any:
    """Inclusive prefix sum of a float32 array, on one shared instance."""
    return _shared().run("prefix_sum", x)


def segment_sum(x: Any, segment: int = 4096) -> Any:
    """float32 sums of consecutive ``segment``-element pieces of a float16/float32 array."""
    return _shared().run("segment_sum", x, segment=segment)
