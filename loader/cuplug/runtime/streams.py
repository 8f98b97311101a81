"""Streams: the handle behind a caller's ``stream=`` argument, and a framework's current stream.

``stream=None`` with PyTorch CUDA tensors or CuPy arrays runs on that framework's current stream (ordered
with the caller's work by CUDA itself, capturable in a CUDA graph); other producers on the instance's stream,
ordered after their work by the DLPack stream handshake. A given stream (an integer handle,
``torch.cuda.Stream``, a CuPy stream, anything with ``__cuda_stream__``) is used as it is.
"""

from __future__ import annotations

import ctypes
import sys

from ..contract.errors import InvalidInputError, cut, shown
from . import operands
from .operands import root as producer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NO_STREAM = ctypes.c_uint64(0)  # call_fast's stream argument for "the instance's stream"
CUDA_LEGACY_STREAM = 1  # cudaStreamLegacy: what a framework's "stream 0" means to the C side (0 = instance)


def c_stream(handle: int) -> int:
    return CUDA_LEGACY_STREAM if handle == 0 else handle


def stream_handle(stream: Any) -> int:
    """The cudaStream_t behind ``stream`` as an integer (0 = the legacy default stream)."""
    if isinstance(stream, bool):
        raise InvalidInputError(f"stream must be a CUDA stream or its handle, got {stream!r}")
    handle = stream if isinstance(stream, int) else _object_stream_handle(stream)
    if handle < 0:  # an address: a negative one is no stream, whoever gives it
        raise InvalidInputError(f"stream handle must be >= 0, got {handle}")
    if handle >= operands.ADDRESS_END:  # a cudaStream_t is an address (or 1, 2): ctypes would wrap 2^64 to 0
        raise InvalidInputError(f"stream handle {handle:#x} is no address of this process, so no CUDA stream")
    return handle


def _object_stream_handle(stream: Any) -> int:
    try:
        proto = getattr(stream, "__cuda_stream__", None)
    except Exception as exc:  # a property that raises
        raise InvalidInputError(
            f"stream: reading __cuda_stream__ raised {type(exc).__name__}: {cut(str(exc))}"
        ) from exc
    if proto is not None:
        try:
            _version, handle = proto() if callable(proto) else proto
            found = operands.as_index(handle)
        except Exception as exc:
            raise InvalidInputError(
                f"stream: __cuda_stream__ gave no (version, handle) pair: {type(exc).__name__}: {cut(str(exc))}"
            ) from exc
        if found is None:
            raise InvalidInputError(f"stream: __cuda_stream__ gave the handle {shown(handle)}, not an integer")
        return found
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy.cuda.Stream, cuda.core Stream
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise InvalidInputError(
        f"stream: expected an int handle, a torch.cuda.Stream, a CuPy stream or an object with __cuda_stream__, "
        f"got {type(stream).__name__}"
    )


def framework_stream(obj: Any, device: int) -> int | None:
    """The current stream of the framework that made ``obj`` (PyTorch, CuPy), or None."""
    root = producer(obj)
    mod = sys.modules.get(root)
    try:
        if root == "torch" and mod is not None:
            raw = getattr(getattr(mod, "_C", None), "_cuda_getCurrentRawStream", None)  # 0.2 us; current_stream()
            if raw is not None:  # makes a Stream object first
                try:
                    return int(raw(device))
                except Exception:  # (a build without CUDA says so here; current_stream() below decides)
                    pass
            return int(mod.cuda.current_stream(device).cuda_stream)
        if root == "cupy" and mod is not None:
            return int(mod.cuda.get_current_stream().ptr)
    except Exception:  # a framework that cannot say: the caller orders by hand (documented)
        return None
    return None
