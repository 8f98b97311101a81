"""ctypes binding of the backend C ABI v2 (backends/include/cuplug/backend.h).

The library is opened by absolute path with RTLD_NOW | RTLD_LOCAL: every
unresolved symbol fails at load, and nothing leaks into the global namespace.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from . import reasons
from .errors import ArtifactError

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
_SIGNATURES: dict[str, tuple[object, list[object]]] = {
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
SYMBOLS = tuple(_SIGNATURES)
MAX_PING_BYTES = 16 << 20  # a description beyond this is a broken backend, not a big op table


def _read_text(fn: object, *args: object) -> str:
    buf = ctypes.create_string_buffer(4096)
    need = fn(*args, buf, len(buf))  # type: ignore[operator]
    if need >= len(buf):
        buf = ctypes.create_string_buffer(need + 1)
        fn(*args, buf, len(buf))  # type: ignore[operator]
    return buf.value.decode("utf-8", "replace")


class BackendLibrary:
    """One dlopened backend file with typed entry points."""

    # Bound from _SIGNATURES in __init__ (ctypes functions: status codes and ids in, ints out).
    abi_version: Any
    call: Any
    stream_wait: Any
    alloc: Any
    upload: Any
    download: Any
    tensor: Any
    sync: Any
    free: Any
    destroy: Any

    def __init__(self, path: Path) -> None:
        if not path.is_absolute():
            raise ArtifactError(f"refusing to load {path}: not an absolute path", reasons.LOAD_FAILED)
        self.path = path
        try:
            self.lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise ArtifactError(f"dlopen({path}) failed: {exc}", reasons.LOAD_FAILED) from exc
        # The version first: a v1 library lacks v2 entry points, and "abi-mismatch, v1 vs v2" is the
        # reason an operator can act on, not "missing symbols".
        if hasattr(self.lib, "cuplug_backend_abi_version"):
            version_fn = self.lib.cuplug_backend_abi_version
            version_fn.restype, version_fn.argtypes = ctypes.c_int, []
            version = version_fn()
            if version != ABI_VERSION:
                raise ArtifactError(
                    f"{path.name} implements backend ABI v{version}, this cuplug needs v{ABI_VERSION}",
                    reasons.ABI_MISMATCH,
                )
        missing = [name for name in SYMBOLS if not hasattr(self.lib, name)]
        if missing:
            raise ArtifactError(f"{path.name} lacks ABI symbols: {', '.join(missing)}", reasons.LOAD_FAILED)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
            short = name.removeprefix("cuplug_backend_")
            if not hasattr(type(self), short):  # create/ping/last_error are wrapped below
                setattr(self, short, fn)

    def create(self, device_pref: str | None) -> int:
        """Returns a non-NULL handle or raises ArtifactError(load-failed) with the backend's reason."""
        handle = self.lib.cuplug_backend_create(device_pref.encode() if device_pref else None)
        if not handle:
            why = _read_text(self.lib.cuplug_backend_last_create_error)
            raise ArtifactError(f"cuplug_backend_create failed: {why or 'no reason given'}", reasons.LOAD_FAILED)
        return int(handle)

    def last_error(self, handle: int) -> str:
        return _read_text(self.lib.cuplug_backend_last_error, handle)

    def ping(self, handle: int) -> tuple[int, str]:
        """Runs the smoke kernel; returns (status, JSON text or error text). A description longer than
        the buffer is asked for again with the length the backend needs, so nothing is cut."""
        size = 1 << 16
        for _ in range(3):
            buf = ctypes.create_string_buffer(size)
            rc = self.lib.cuplug_backend_ping(handle, buf, len(buf))
            if rc < 0:
                return rc, self.last_error(handle)
            if rc < len(buf):
                return OK, buf.value.decode("utf-8", "replace")
            if rc > MAX_PING_BYTES:
                return E_INVALID_ARGUMENT, f"ping: the backend's description is {rc} bytes (limit {MAX_PING_BYTES})"
            size = rc + 1
        return E_INVALID_ARGUMENT, "ping: the backend's description kept growing"
