"""A host bfloat16 array for the tests: NumPy has no bfloat16, so ``BF16(bits)`` exports a
uint16 NumPy array of bfloat16 bit patterns through DLPack as dtype bfloat16 (code 4, 16 bits),
read in place like any producer's tensor."""

from __future__ import annotations

import ctypes

import numpy as np


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_api = ctypes.PyDLL(None)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class BF16:
    """bfloat16 view of ``bits`` (uint16); valid while this object lives (it owns the memory)."""

    def __init__(self, bits: np.ndarray) -> None:
        self.bits = np.ascontiguousarray(bits, dtype=np.uint16)
        self.shape = self.bits.shape
        self._shape = (ctypes.c_int64 * max(1, self.bits.ndim))(*self.shape)
        t = _DLTensor(self.bits.ctypes.data, 1, 0, self.bits.ndim, _DLDataType(4, 16, 1), self._shape, None, 0)
        self._managed = _DLManagedTensor(t, None, None)  # no deleter: this object owns everything

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __dlpack__(self, stream: object = None, max_version: object = None, **kwargs: object) -> object:
        return _api.PyCapsule_New(ctypes.addressof(self._managed), b"dltensor", None)
