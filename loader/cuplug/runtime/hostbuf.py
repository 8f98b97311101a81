"""cuplug's own host memory of one dtype and shape, which needs no NumPy: ``HostTensor`` (alias ``HostBuffer``).

What a call returns on the host when the caller's kind of array is unknown (a producer with only
``__dlpack__``, an N-D result of ``array.array`` inputs), what ``Tensor.to_host()`` returns, float16/bfloat16
scalar results, probe samples. It keeps its shape and dtype and is read without a copy by anyone:
DLPack (``np.from_dlpack``, ``torch.from_dlpack``, ``jax.dlpack.from_dlpack``, and any backend of cuplug's),
NumPy's ``__array_interface__`` (``np.asarray(t)``; not bfloat16, which NumPy lacks), and the buffer protocol
on Python >= 3.12 (PEP 688; ``t.memoryview()`` on any Python) for the dtypes a memoryview can spell (not
float16 and bfloat16: a memoryview of them would read as integers, so it is refused, naming DLPack).
"""

from __future__ import annotations

import ctypes
import struct

from ..contract import abi, dtypes
from . import dlpack
from .signature import numel

TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins  # (in the class, ``memoryview`` is the method below)
    from typing import Any

_MEMORYVIEW_FORMATS = frozenset("bBhHiIlLqQfd?")  # what memoryview.cast() takes (no 'e' before 3.12's buffers)


class HostTensor:
    """Host memory of one dtype and shape (C-contiguous), exported through DLPack, ``__array_interface__`` and
    the buffer protocol. ``values()``: its elements as Python numbers; ``tolist()``: nested as its shape."""

    def __init__(self, dt: dtypes.DType, shape: tuple[int, ...]) -> None:
        self.dtype = dt
        self.shape = tuple(shape)
        self.n = n = numel(self.shape)
        self.raw = (ctypes.c_char * max(n * dt.itemsize, 1))()

    @property
    def nbytes(self) -> int:
        return self.n * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d cuplug.HostTensor")
        return self.shape[0]

    def __iter__(self) -> Any:
        if not self.shape:
            raise TypeError("iteration over a 0-d cuplug.HostTensor")
        return iter(self.tolist())

    def __repr__(self) -> str:
        return f"<cuplug.HostTensor {self.dtype.name}{list(self.shape)}>"

    # ---- exports
    def __dlpack_device__(self) -> tuple[int, int]:
        return (dtypes.DEVICE_CPU, 0)

    def __dlpack__(self, stream: Any = None, max_version: Any = None, **_: Any) -> Any:
        versioned = dlpack.wants_versioned(max_version)
        return dlpack.export(
            self,
            ctypes.addressof(self.raw),
            self.__dlpack_device__(),
            abi.CDtype(self.dtype.code, self.dtype.bits, 1),
            self.shape,
            versioned,
        )

    @property
    def __array_interface__(self) -> dict[str, Any]:
        if not self.dtype.typestr:  # bfloat16: NumPy has no such dtype (ml_dtypes reads DLPack)
            raise AttributeError("a bfloat16 HostTensor has no __array_interface__; read it through DLPack")
        return {
            "shape": self.shape,
            "typestr": self.dtype.typestr,
            "data": (ctypes.addressof(self.raw), False),
            "strides": None,
            "version": 3,
        }

    def memoryview(self) -> builtins.memoryview[Any]:
        """Its bytes as a memoryview of its format and shape (the buffer protocol of Python < 3.12)."""
        fmt = self.dtype.format
        if fmt not in _MEMORYVIEW_FORMATS:
            raise BufferError(
                f"a memoryview cannot spell {self.dtype.name}: read this HostTensor through DLPack "
                "(np.from_dlpack(t), torch.from_dlpack(t)) or __array_interface__ (np.asarray(t))"
            )
        view = memoryview(self.raw).cast("B")[: self.nbytes]
        # a 0-d tensor gives a 0-d view (shape ()), never a 1-element one; its items are ints, floats or bools.
        # (fmt is a str of _MEMORYVIEW_FORMATS: typeshed's cast() overloads take only literal formats)
        shaped: builtins.memoryview[Any] = view.cast(fmt, self.shape)  # type: ignore[call-overload]
        return shaped

    def tobytes(self) -> bytes:
        """A copy of its bytes, in C order (as NumPy's and array.array's tobytes())."""
        return bytes(self.raw)[: self.nbytes]

    # PEP 688 (Python >= 3.12): memoryview(t), np.asarray(t)
    def __buffer__(self, flags: int) -> builtins.memoryview[Any]:
        return self.memoryview()

    # ---- values
    def values(self) -> list[float]:
        """The elements as Python numbers, in C order (float16 and bfloat16 decoded from their bits)."""
        data = bytes(self.raw)[: self.n * self.dtype.itemsize]
        if self.dtype.name == "bfloat16":
            bits = struct.unpack(f"<{self.n}H", data)
            return [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bits]
        return list(struct.unpack(f"<{self.n}{self.dtype.format}", data))

    def tolist(self) -> Any:
        """The elements nested as the shape (a number for a 0-d tensor), as NumPy's tolist() gives them."""
        flat = self.values()
        if self.dtype.code == dtypes.DL_BOOL:
            flat = [bool(v) for v in flat]
        return _nest(flat, self.shape)

    def fill(self, values: list[float]) -> None:
        if self.dtype.name == "bfloat16":  # the values are exact in bfloat16: truncating the float32 bits is exact
            data = b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in values)
        else:
            data = struct.pack(
                f"<{len(values)}{self.dtype.format}", *(int(v) if not self.dtype.is_float else v for v in values)
            )
        ctypes.memmove(self.raw, data, len(data))


def _nest(flat: list[Any], shape: tuple[int, ...]) -> Any:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat[: shape[0]]
    step = numel(shape[1:])
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


HostBuffer = HostTensor  # its name before it was a public result type
