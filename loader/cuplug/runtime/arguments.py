"""Which importer reads an operand: cuplug's resident Tensor, NumPy's buffer export, PyTorch's own accessors,
DLPack, ``__cuda_array_interface__`` or the buffer protocol, in that order (the common kinds first: each
costs a look-up less); and whether a device operand belongs to this backend's device."""

from __future__ import annotations

import sys

from ..contract import dtypes
from ..contract.errors import InvalidInputError, cut
from . import operands
from .operands import Arg
from .operands import root as producer
from .streams import c_stream
from .tensor import Tensor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Backend = Any  # (the module that defines it imports this one)


def _torch_exact(torch: Any) -> tuple[type, ...]:
    """torch.Tensor and torch.nn.Parameter: the types whose accessors are PyTorch's own (read each time: a test's
    stand-in module may sit in sys.modules before the real one)."""
    found = (getattr(torch, "Tensor", None), getattr(getattr(torch, "nn", None), "Parameter", None))
    return tuple(t for t in found if isinstance(t, type))


_NDARRAY: list[type | None] = [None]


def _ndarray() -> type | None:
    """numpy.ndarray once NumPy is imported (by anyone; cuplug never imports it itself), then remembered."""
    nd = getattr(sys.modules.get("numpy"), "ndarray", None)
    _NDARRAY[0] = nd
    return nd


def _has(obj: Any, protocol: str) -> bool:
    """Whether ``obj`` offers ``protocol``; a property that raises anything but AttributeError offers it
    (broken): the importer then names what it raised, instead of hasattr() letting it out."""
    try:
        getattr(obj, protocol)
    except AttributeError:
        return False
    except Exception:
        return True
    return True


def _capsule(obj: Any, name: str, stream: int | None = None) -> Any:
    """``obj.__dlpack__()`` (with ``stream`` for a device producer); whatever the producer raises becomes an
    InvalidInputError naming the operand, with the producer's exception as its cause."""
    try:
        try:
            return obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
        except TypeError:
            if stream is None:
                raise
            return obj.__dlpack__()  # a producer from before the stream keyword
    except Exception as exc:
        raise InvalidInputError(f"{name}: its __dlpack__() failed: {type(exc).__name__}: {cut(str(exc))}") from exc


def read(self: Backend, obj: Any, name: str, writable: bool, handshake: int | None) -> Arg:
    """The operand ``obj`` read by the importer of its kind (operands.py), every field checked."""
    kind = type(obj)
    if kind is Tensor:
        tensor: Tensor = obj
        return tensor._arg(self, name)
    if kind is _NDARRAY[0] or (_NDARRAY[0] is None and kind is _ndarray()):  # NumPy, the host's usual array:
        try:  # its buffer export, no DLPack round trip
            view: memoryview | None = memoryview(obj)
        except (TypeError, ValueError, BufferError):  # datetime64 and the like: no buffer format; DLPack says why
            view = None
        if view is not None and view.format in dtypes.BY_FORMAT:  # else (ml_dtypes' bfloat16): DLPack names it
            return operands.from_memoryview(obj, name, writable, view)
    torch = sys.modules.get("torch")
    if torch is not None and kind in _torch_exact(torch):  # its own accessors (torch's __dlpack__ costs
        # microseconds a call); a subclass, whose accessors may be anyone's, goes through DLPack
        arg = operands.from_torch(obj, name, writable)  # (its layout first: PyTorch's own accessors, TorchReader)
        if not arg.host:
            on_this_device(self, arg.device[1], name)
        return arg
    if writable and producer(obj) in ("jax", "jaxlib"):
        raise InvalidInputError(
            f"{name}: JAX arrays are immutable, so out= cannot write one; take the result "
            "(jnp.asarray(result) shares its memory), or call the op inside jax.jit through cuplug.jax"
        )
    if isinstance(obj, Tensor):
        return obj._arg(self, name)
    masked = getattr(sys.modules.get("numpy.ma"), "MaskedArray", None)
    if masked is not None and isinstance(obj, masked):  # its buffer is the data without the mask
        raise InvalidInputError(
            f"{name}: a NumPy masked array: its mask would be ignored; pass x.filled(value) or x.data"
        )
    if _has(obj, "__dlpack__") and _has(obj, "__dlpack_device__"):
        dev_type, dev_id = operands.dlpack_device(obj, name)
        if dev_type in dtypes.HOST_DEVICES:
            try:  # the buffer protocol where the host array has it: no capsule, read-only arrays too
                view = memoryview(obj)
            except (TypeError, ValueError, BufferError):  # BufferError: a __buffer__ (PEP 688) that refuses
                view = None
            if view is not None and view.format in dtypes.BY_FORMAT:
                return operands.from_memoryview(obj, name, writable, view)
            return operands.from_dlpack_capsule(obj, _capsule(obj, name), name, writable, (dev_type, dev_id))
        if dev_type != dtypes.DEVICE_CUDA:
            raise InvalidInputError(f"{name}: DLPack device type {dev_type} is neither the host nor CUDA")
        on_this_device(self, dev_id, name)
        capsule = _capsule(obj, name, c_stream(handshake or 0))
        return operands.from_dlpack_capsule(obj, capsule, name, writable, (dev_type, dev_id))
    if _has(obj, "__cuda_array_interface__"):
        if self.device_type != dtypes.DEVICE_CUDA:
            raise cuda_on_cpu(self, name, None)
        return operands.from_cai(obj, name, writable, self.device_index)
    try:
        view = memoryview(obj)
    except (TypeError, ValueError, BufferError):  # no buffer (TypeError), no format (ValueError), refused (BufferError)
        raise InvalidInputError(
            f"{name}: expected an array (the buffer protocol, __dlpack__ or __cuda_array_interface__), "
            f"got {type(obj).__name__}"
        ) from None
    return operands.from_memoryview(obj, name, writable, view)


def on_this_device(self: Backend, dev_id: int, name: str) -> None:
    """A CUDA operand on cuda:``dev_id``: this must be a CUDA backend of that device."""
    if self.device_type != dtypes.DEVICE_CUDA:
        raise cuda_on_cpu(self, name, dev_id)
    if dev_id != self.device_index:
        raise InvalidInputError(
            f"{name} is on cuda:{dev_id}, this backend on cuda:{self.device_index}: move it "
            f"(x.to('cuda:{self.device_index}')) or load a backend for that device (cuplug.load(device={dev_id}))"
        )


def cuda_on_cpu(self: Backend, name: str, dev_id: int | None) -> InvalidInputError:
    where = f"cuda:{dev_id}" if dev_id is not None else "a CUDA device"
    why = ""
    code = getattr(self.trace, "decision_code", None)
    if code == "forced":
        why = " (forced by CUPLUG_BACKEND)"
    elif code:
        why = f" (CUDA could not serve: {code}: {self.trace.decision_reason})"
    return InvalidInputError(
        f"{name} is on {where}, but this is the CPU backend{why}: pass a host array (x.cpu()) or fix the CUDA "
        "install (`cuplug doctor` says why)"
    )
