"""ctypes binding of the backend C ABI (backends/include/cuplug/backend.h).

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

ABI_VERSION = 1

# Status codes of backend.h.
OK = 0
E_INVALID_ARGUMENT = -1
E_UNKNOWN_OP = -2
E_BAD_BUFFER = -3
E_OUT_OF_MEMORY = -4
E_DEVICE = -5
E_NO_KERNEL_IMAGE = -6
E_BUFFER_TOO_SMALL = -7

_P = ctypes.c_void_p
_F = ctypes.POINTER(ctypes.c_float)
_LL = ctypes.c_longlong
_S = ctypes.c_char_p
_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "cuplug_backend_abi_version": (ctypes.c_int, []),
    "cuplug_backend_create": (_P, [_S]),
    "cuplug_backend_last_create_error": (ctypes.c_int, [_S, ctypes.c_int]),
    "cuplug_backend_ping": (ctypes.c_int, [_P, _S, ctypes.c_int]),
    "cuplug_backend_run": (ctypes.c_int, [_P, _S, _P, _P, ctypes.c_float, ctypes.c_float, _P, _LL]),
    "cuplug_backend_alloc": (_LL, [_P, _LL]),
    "cuplug_backend_upload": (ctypes.c_int, [_P, _LL, _P, _LL]),
    "cuplug_backend_download": (ctypes.c_int, [_P, _LL, _P, _LL]),
    "cuplug_backend_run_resident": (ctypes.c_int, [_P, _S, _LL, _LL, _LL, ctypes.c_float, ctypes.c_float, _LL]),
    "cuplug_backend_sync": (ctypes.c_int, [_P]),
    "cuplug_backend_free": (ctypes.c_int, [_P, _LL]),
    "cuplug_backend_last_error": (ctypes.c_int, [_P, _S, ctypes.c_int]),
    "cuplug_backend_destroy": (None, [_P]),
}
SYMBOLS = tuple(_SIGNATURES)


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
    run: Any
    alloc: Any
    upload: Any
    download: Any
    run_resident: Any
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
        version = self.abi_version()
        if version != ABI_VERSION:
            raise ArtifactError(
                f"{path.name} implements backend ABI v{version}, this cuplug needs v{ABI_VERSION}",
                reasons.ABI_MISMATCH,
            )

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
        """Runs the smoke kernel; returns (status, JSON text or error text)."""
        buf = ctypes.create_string_buffer(8192)
        rc = self.lib.cuplug_backend_ping(handle, buf, len(buf))
        if rc < 0:
            return rc, self.last_error(handle)
        return OK, buf.value.decode("utf-8", "replace")
