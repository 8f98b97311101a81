"""Producers that lie: DLPack capsules, CUDA array interfaces and buffers built field by field.

A test (or the fuzz run) states each field; the capsule is a real ``PyCapsule`` over a real
``DLManagedTensor`` (legacy or versioned) whose shape array holds exactly ``ndim`` extents, so
the only lies are the ones the test tells. Everything stays alive with the producer object.
"""

from __future__ import annotations

import ctypes

_api = ctypes.PyDLL(None)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


FLOAT32 = (2, 32, 1)


class LyingDLPack:
    """An object with ``__dlpack__``/``__dlpack_device__`` whose capsule says what it is told.

    ``data``: an int address, or a bytes-like object whose memory is used (kept alive here);
    ``shape``/``strides``: the arrays behind the pointers (``shape_ptr``/``strides_ptr`` override
    them, e.g. 0 for NULL); ``ndim`` defaults to ``len(shape)``; ``device``: what the capsule says,
    ``dlpack_device``: what ``__dlpack_device__`` says (default: the same; a callable's result, or an
    exception to raise); ``version``: None for a legacy capsule, else (major, minor); ``name``: the
    capsule's name (default the right one); ``capsule``: return this object instead of a capsule.
    """

    def __init__(
        self,
        data: object = None,
        shape: tuple[int, ...] = (4,),
        dtype: tuple[int, int, int] = FLOAT32,
        *,
        ndim: int | None = None,
        strides: tuple[int, ...] | None = None,
        shape_ptr: int | None = None,
        strides_ptr: int | None = None,
        byte_offset: int = 0,
        device: tuple[int, int] = (1, 0),
        dlpack_device: object = None,
        version: tuple[int, int] | None = None,
        flags: int = 0,
        name: bytes | None = None,
        capsule: object = None,
    ) -> None:
        if data is None:
            data = bytearray(16)
        if isinstance(data, int):
            self._memory, address = None, data
        else:
            self._memory = (ctypes.c_char * max(len(data), 1)).from_buffer(data)
            address = ctypes.addressof(self._memory)
        self._shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self._strides = (ctypes.c_int64 * max(len(strides), 1))(*strides) if strides is not None else None
        self.managed = DLManagedTensorVersioned() if version is not None else DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = address
        t.device_type, t.device_id = device
        t.ndim = len(shape) if ndim is None else ndim
        t.dtype = DLDataType(*dtype)
        t.shape = ctypes.addressof(self._shape) if shape_ptr is None else shape_ptr
        if strides_ptr is not None:
            t.strides = strides_ptr
        elif self._strides is not None:
            t.strides = ctypes.addressof(self._strides)
        t.byte_offset = byte_offset
        if version is not None:
            self.managed.major, self.managed.minor = version
            self.managed.flags = flags
        self.device = device
        self.dlpack_device_answer = device if dlpack_device is None else dlpack_device
        self.name = name if name is not None else (b"dltensor_versioned" if version is not None else b"dltensor")
        self.capsule_answer = capsule

    def __dlpack__(self, stream: object = None, **_: object) -> object:
        if self.capsule_answer is not None:
            return self.capsule_answer
        # no deleter: the memory belongs to this object, which outlives the call
        return _api.PyCapsule_New(ctypes.addressof(self.managed), self.name, None)

    def __dlpack_device__(self) -> object:
        answer = self.dlpack_device_answer
        if isinstance(answer, BaseException):
            raise answer
        return answer() if callable(answer) else answer


class LyingCAI:
    """An object whose ``__cuda_array_interface__`` is the dict (or anything) it is given."""

    def __init__(self, interface: object) -> None:
        self._interface = interface

    @property
    def __cuda_array_interface__(self) -> object:
        if isinstance(self._interface, BaseException):
            raise self._interface
        return self._interface


def cai(ptr: int = 0x7F0000000000, shape: tuple = (4,), typestr: str = "<f4", **fields: object) -> dict:
    """A valid CAI v3 dict (a made-up device pointer), with ``fields`` replaced or added."""
    doc: dict = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3, "strides": None}
    doc.update(fields)
    return doc


class ExportsOneArrayNamesAnother(bytes):
    """Read-only bytes (a uint8 buffer) whose ``__array_interface__`` names another address: a consumer
    must read what the buffer export gives, never what the attribute beside it says."""

    def __new__(cls, exported: bytes, named_address: int) -> ExportsOneArrayNamesAnother:
        self = super().__new__(cls, exported)
        self.__array_interface__ = {
            "data": (named_address, True),
            "shape": (len(exported),),
            "typestr": "|u1",
            "version": 3,
            "strides": None,
        }
        return self
