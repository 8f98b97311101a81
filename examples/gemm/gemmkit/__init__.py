"""gemmkit: C = A B of two row-major float32 matrices, through cuBLAS on the GPU or the CPU twin.

    import gemmkit
    gemmkit.gemm(a, b, side)      # a, b: side*side float32 elements each (host or GPU)
    gemmkit.load().trace.text()   # which backend ran, and why

The CUDA variants come with ``pip install 'gemmkit[cuda13]'`` (or ``[cuda12]``), which brings NVIDIA's
cuBLAS wheel; without them, or without a GPU, the CPU twin answers and the trace says why.
"""

from __future__ import annotations

from typing import Any

import cuplug

__version__ = "0.1.0"
BACKEND = "gemm"


def load() -> cuplug.Backend:
    """A new instance of the best `gemm` backend (close it, or use it as a context manager)."""
    return cuplug.load(BACKEND)


def gemm(a: Any, b: Any, side: int) -> Any:
    """``a @ b`` of two row-major ``side`` x ``side`` float32 matrices (flat or 2-D)."""
    with load() as backend:
        return backend.run("gemm", a, b, side=side)
