"""The C ABI v2's types in ctypes: ``cuplug_dtype``, ``cuplug_tensor`` (DLPack's DLTensor), ``cuplug_attr``.

Reached as ``abi.CTensor`` etc.; made on first use, since creating ctypes classes costs more than a
whole CPU ``load()`` can spare (see ``abi.SIGNATURES``).
"""

from __future__ import annotations

import ctypes


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


# The type names of abi.SIGNATURES.
ABI_TYPES: dict[str, object] = {
    "int": ctypes.c_int,
    "handle": ctypes.c_void_p,
    "str": ctypes.c_char_p,
    "i64": ctypes.c_longlong,
    "u64": ctypes.c_uint64,
    "tensor*": ctypes.POINTER(CTensor),
    "attr*": ctypes.POINTER(CAttr),
    "dtype": CDtype,
    "i64*": ctypes.POINTER(ctypes.c_int64),
}
