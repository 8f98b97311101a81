"""quantkit: blockwise absmax int8 quantization on the best backend this machine has.

    import quantkit
    q, absmax = quantkit.quantize(x, blocksize=256)   # x: float16, bfloat16 or float32, any shape
    y = quantkit.dequantize(q, absmax, blocksize=256)  # float32, shaped like q
    quantkit.load().trace.text()                       # which backend ran, and why

x is split into blocks of ``blocksize`` consecutive elements (C order; the last block
may be short). Per block b, in IEEE float32 with round-to-nearest-even and no FMA,
the same bits on the GPU and the CPU:

    absmax[b] = max |float32(x_i)|          (NaN if the block holds a NaN)
    scale     = 127.0f / absmax[b]          (one division per block)
    q_i       = 0 if x_i * scale is NaN, else round_half_even(clamp(x_i * scale, -127, 127))
    y_i       = float32(q_i) * (absmax[b] / 127.0f)

So absmax 0 gives q 0; a NaN in a block gives absmax NaN and q 0 for the whole
block (which dequantizes to NaN); NaN is always written as 0x7FC00000. blocksize
must be a power of two in [64, 4096] (the ops refuse others with their own
message), and dequantize checks that absmax has ceil(numel(q) / blocksize)
elements.

Device inputs (PyTorch/CuPy CUDA tensors, cuplug Tensors) are read in place and
give backend-owned tensors (``torch.from_dlpack(q)`` shares their memory); host
inputs (NumPy, array.array) give host arrays. ``out=`` writes into yours.

The CUDA variants come with ``pip install 'quantkit[cuda13]'`` (or ``[cuda12]``);
without them, or without a GPU, the CPU twin answers and the trace says why.
"""

from __future__ import annotations

import threading
from typing import Any

import cuplug

__version__ = "0.1.0"
__all__ = ["BACKEND", "DEFAULT_BLOCKSIZE", "dequantize", "load", "quantize"]

BACKEND = "quant"
DEFAULT_BLOCKSIZE = 256
_lock = threading.Lock()
_backend: cuplug.Backend | None = None


def load() -> cuplug.Backend:
    """A new instance of the best `quant` backend (close it, or use it as a context manager)."""
    return cuplug.load(BACKEND)


def _shared() -> cuplug.Backend:
    global _backend
    with _lock:
        if _backend is None or _backend.closed:
            _backend = load()
        return _backend


def quantize(x: Any, blocksize: int = DEFAULT_BLOCKSIZE, *, out: Any = None, stream: Any = None) -> tuple[Any, Any]:
    """(q, absmax): int8 q shaped like x and float32 absmax of ceil(x.size / blocksize) blocks.

    ``out=(q, absmax)`` writes into the caller's arrays; ``stream`` (a CUDA stream or its
    handle) runs the kernel there instead of on the backend's own stream.
    """
    q, absmax = _shared().run("quantize_blockwise", x, out=out, stream=stream, blocksize=blocksize)
    return q, absmax


def dequantize(q: Any, absmax: Any, blocksize: int = DEFAULT_BLOCKSIZE, *, out: Any = None, stream: Any = None) -> Any:
    """float32 shaped like q: q_i * (absmax[block of i] / 127)."""
    return _shared().run("dequantize_blockwise", q, absmax, out=out, stream=stream, blocksize=blocksize)
