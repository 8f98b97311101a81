"""llmkit: four kernels of the kind LLM code needs, on the best backend this machine has.

    import llmkit
    y, mean, rstd = llmkit.layernorm(x, weight, bias)   # x (B, T, C) float32: mean and rstd are (B, T)
    hist = llmkit.histogram(data, bins=256)             # uint8 -> uint32 counts
    out = llmkit.gelu(x)                                # bfloat16, tanh form, computed in float32
    probs = llmkit.softmax(logits)                      # float32, over the last dimension

Every array may live on the host (NumPy, PyTorch CPU) or the GPU (PyTorch, CuPy); results come back of the
caller's kind. The CUDA variants come with ``pip install 'llmkit[cuda13]'`` (or ``[cuda12]``).
"""

from __future__ import annotations

import threading
from typing import Any

import cuplug

__version__ = "0.1.0"
BACKEND = "llm"
_lock = threading.Lock()
_backend: cuplug.Backend | None = None


def load() -> cuplug.Backend:
    """A new instance of the best `llm` backend (close it, or use it as a context manager)."""
    return cuplug.load(BACKEND)


def _shared() -> cuplug.Backend:
    global _backend
    with _lock:
        if _backend is None or _backend.closed:
            _backend = load()
        return _backend


def layernorm(x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Any:
    return _shared().run("layernorm", x, weight, bias, eps=eps)


def histogram(data: Any, bins: int = 256) -> Any:
    return _shared().run("histogram", data, bins=bins)


def gelu(x: Any) -> Any:
    return _shared().run("gelu", x)


def softmax(x: Any) -> Any:
    return _shared().run("softmax", x)
