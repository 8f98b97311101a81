"""Host memory of one dtype and shape that needs no NumPy: float16/bfloat16 scalar results, probe samples.

Exported to any backend through DLPack (cuplug's own capsule), so the same buffer
feeds a CUDA and a CPU backend.
"""

from __future__ import annotations

import ctypes
import struct

from ..contract import abi, dtypes
from . import dlpack
from .signature import numel

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class HostBuffer:
    """Host memory of one dtype and shape, readable by any backend through DLPack."""

    def __init__(self, dt: dtypes.DType, shape: tuple[int, ...]) -> None:
        self.dtype = dt
        self.shape = shape
        self.n = n = numel(shape)
        self.raw = (ctypes.c_char * max(n * dt.itemsize, 1))()

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

    def values(self) -> list[float]:
        """The elements as Python numbers (float16 and bfloat16 decoded from their bits)."""
        data = bytes(self.raw)[: self.n * self.dtype.itemsize]
        if self.dtype.name == "bfloat16":
            bits = struct.unpack(f"<{self.n}H", data)
            return [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bits]
        return list(struct.unpack(f"<{self.n}{self.dtype.format}", data))

    def fill(self, values: list[float]) -> None:
        if self.dtype.name == "bfloat16":  # the values are exact in bfloat16: truncating the float32 bits is exact
            data = b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in values)
        else:
            data = struct.pack(
                f"<{len(values)}{self.dtype.format}", *(int(v) if not self.dtype.is_float else v for v in values)
            )
        ctypes.memmove(self.raw, data, len(data))
