"""The backend C ABI v2 (backends/include/cuplug/backend.h) as data: version, status codes, types,
entry points and their signatures.

The runtime binds a loaded library with these (``runtime.library``); the build kit
checks that a built library exports exactly :data:`SYMBOLS`.
"""

from __future__ import annotations

import ctypes

ABI_VERSION = 2

# Status codes of backend.h.
OK = 0
E_INVALID_ARGUMENT = -1
E_UNKNOWN_OP = -2
E_BAD_BUFFER = -3
E_OUT_OF_MEMORY = -4
E_DEVICE = -5
E_NO_KERNEL_IMAGE = -6
E_BUFFER_TOO_SMALL = -7
E_WRONG_DEVICE = -8

ATTR_INT64, ATTR_FLOAT64 = 0, 1


class CDtype(ctypes.Structure):
    """DLDataType / cuplug_dtype."""

    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class CTensor(ctypes.Structure):
    """DLTensor / cuplug_tensor, field for field."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("dtype", CDtype),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _AttrValue(ctypes.Union):
    _fields_ = [("i", ctypes.c_int64), ("f", ctypes.c_double)]


class CAttr(ctypes.Structure):
    """cuplug_attr: a named int64 or float64."""

    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int32), ("value", _AttrValue)]


_P = ctypes.c_void_p
_LL = ctypes.c_longlong
_S = ctypes.c_char_p
_I = ctypes.c_int
_U64 = ctypes.c_uint64
_TP = ctypes.POINTER(CTensor)
SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "cuplug_backend_abi_version": (_I, []),
    "cuplug_backend_create": (_P, [_S]),
    "cuplug_backend_last_create_error": (_I, [_S, _I]),
    "cuplug_backend_ping": (_I, [_P, _S, _I]),
    "cuplug_backend_call": (_I, [_P, _S, _TP, _I, _TP, _I, ctypes.POINTER(CAttr), _I, _U64]),
    "cuplug_backend_stream_wait": (_I, [_P, _U64, _U64]),
    "cuplug_backend_alloc": (_LL, [_P, CDtype, _I, ctypes.POINTER(ctypes.c_int64)]),
    "cuplug_backend_upload": (_I, [_P, _LL, _P, _LL]),
    "cuplug_backend_download": (_I, [_P, _LL, _P, _LL]),
    "cuplug_backend_tensor": (_I, [_P, _LL, _TP]),
    "cuplug_backend_free": (_I, [_P, _LL]),
    "cuplug_backend_sync": (_I, [_P]),
    "cuplug_backend_last_error": (_I, [_P, _S, _I]),
    "cuplug_backend_destroy": (None, [_P]),
}
SYMBOLS = tuple(SIGNATURES)
