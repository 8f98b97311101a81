"""A backend library, dlopened and bound to the C ABI v2 (``contract.abi``).

The library is opened by absolute path with RTLD_NOW | RTLD_LOCAL: every
unresolved symbol fails at load, and nothing leaks into the global namespace.
Every failure is an :class:`ArtifactError` with its reason code.
"""

from __future__ import annotations

import ctypes
import os

from ..contract import abi, jsontext, reasons
from ..contract.abi import ABI_VERSION, E_INVALID_ARGUMENT, OK, SIGNATURES, SYMBOLS
from ..contract.errors import ArtifactError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_PING_BYTES = 16 << 20  # a description beyond this is a broken backend, not a big op table
MAX_PING_JSON = 1 << 20  # what the loader parses of it


# The C types of the entry points that need no struct: bound when the library is opened.
_PLAIN_TYPES: dict[str, object] = {
    "int": ctypes.c_int,
    "handle": ctypes.c_void_p,
    "str": ctypes.c_char_p,
    "i64": ctypes.c_longlong,
    "u64": ctypes.c_uint64,
}


def _plain(name: str) -> bool:
    restype, argtypes = SIGNATURES[name]
    return all(t is None or t in _PLAIN_TYPES for t in (restype, *argtypes))


MAX_ERROR_BYTES = 64 << 10  # an error message beyond this is a broken backend: cut, never allocated


def _read_text(fn: object, *args: object) -> str:
    """A backend's message: the length it reports is a claim, bounded before anything is allocated for it."""
    buf = ctypes.create_string_buffer(4096)
    need = fn(*args, buf, len(buf))  # type: ignore[operator]
    if need > MAX_ERROR_BYTES:
        text = buf.value.decode("utf-8", "replace")
        return f"{text} [the backend claims a {need}-byte message; cut at {len(text)} bytes]"
    if need >= len(buf):
        buf = ctypes.create_string_buffer(need + 1)
        fn(*args, buf, len(buf))  # type: ignore[operator]
    return buf.value.decode("utf-8", "replace")


class BackendLibrary:
    """One dlopened backend file with typed entry points."""

    # Bound from SIGNATURES in __init__ (ctypes functions: status codes and ids in, ints out).
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

    def __init__(self, path: str) -> None:
        if not os.path.isabs(path):
            raise ArtifactError(f"refusing to load {path}: not an absolute path", reasons.LOAD_FAILED)
        self.path = path
        try:
            self.lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
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
                    f"{os.path.basename(path)} implements backend ABI v{version}, this cuplug needs v{ABI_VERSION}",
                    reasons.ABI_MISMATCH,
                )
        missing = [name for name in SYMBOLS if not hasattr(self.lib, name)]
        if missing:
            raise ArtifactError(
                f"{os.path.basename(path)} lacks ABI symbols: {', '.join(missing)}", reasons.LOAD_FAILED
            )
        for name in SIGNATURES:  # what needs no tensor types now; call/alloc/tensor at their first use
            if _plain(name):
                self._bind(name)

    def _bind(self, name: str) -> Any:
        restype, argtypes = SIGNATURES[name]
        types = _PLAIN_TYPES if _plain(name) else abi.ABI_TYPES
        fn = getattr(self.lib, name)
        fn.restype = types[restype] if restype else None
        fn.argtypes = [types[t] for t in argtypes]
        short = name.removeprefix("cuplug_backend_")
        if not hasattr(type(self), short):  # create/ping/last_error are wrapped below
            setattr(self, short, fn)
        return fn

    def __getattr__(self, short: str) -> Any:
        """An entry point that takes tensors (call, alloc, tensor), bound when it is first used."""
        name = "cuplug_backend_" + short
        if name not in SIGNATURES or "lib" not in self.__dict__:  # not an entry point, or no library (yet)
            raise AttributeError(short)
        return self._bind(name)

    @property
    def call_fast(self) -> Any:
        """cuplug_backend_call without argument types: a prepared call (plan.py) hands it ctypes objects of the
        right types already, and ctypes then converts nothing (0.8 us a call against 1.6 with argtypes,
        measured on the 2-core CPU machine)."""
        fn = self.__dict__.get("_call_fast")
        if fn is None:
            fn = self.lib["cuplug_backend_call"]  # a function object of its own: call's argtypes stay
            fn.restype = ctypes.c_int
            self.__dict__["_call_fast"] = fn
        return fn

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


LTO_IMAGE_VARIABLE = "CUPLUG_LTO_IMAGE"  # read by backends/common/cuplug_lto_image.cpp during dlopen


def parse_ping(text: str) -> dict[str, Any]:
    """The ping answer as a JSON object; ValueError (or RecursionError) for anything else."""
    if len(text) > MAX_PING_JSON:
        raise ValueError(f"{len(text)} bytes")
    info = jsontext.loads(text)
    if not isinstance(info, dict):
        raise ValueError(f"a JSON {type(info).__name__}, not an object")
    return info


def _shown(message: str, load_path: str, real_path: str) -> str:
    """Messages name the real file, never the /proc/self/fd/N (or private copy) it was mapped from."""
    message = message.replace(load_path, real_path)
    load_name = os.path.basename(load_path)
    if message.startswith(load_name + " "):
        message = os.path.basename(real_path) + message[len(load_name) :]
    return message


def open_backend(
    load_path: str, real_path: str, device: str | None, lto: tuple[str, int] | None = None
) -> tuple[BackendLibrary, int, dict[str, Any]]:
    """dlopen of the verified bytes at ``load_path`` (never the real path again), then create and ping.

    ``real_path`` is what messages and ``Backend.path`` show. ``lto``: an LTO variant's image linked for this
    GPU (runtime/jitlink.py) and its SM: the image is named in CUPLUG_LTO_IMAGE while the library's constructors
    run (the loader's lock is held), and the ping must say that SM's image is the one registered. Every failure
    is an ArtifactError.
    """
    # The variable is cuplug's to set: a value left in the environment never reaches a library loaded as built.
    inherited = os.environ.pop(LTO_IMAGE_VARIABLE, None)
    try:
        if lto is not None:
            os.environ[LTO_IMAGE_VARIABLE] = lto[0]
        lib = BackendLibrary(load_path)
    except ArtifactError as exc:
        raise ArtifactError(_shown(str(exc), load_path, real_path), exc.code) from None
    finally:
        os.environ.pop(LTO_IMAGE_VARIABLE, None)
        if inherited is not None:
            os.environ[LTO_IMAGE_VARIABLE] = inherited
    lib.path = real_path
    handle = lib.create(device)
    try:
        rc, text = lib.ping(handle)
        if rc != OK:
            code = reasons.KERNEL_IMAGE_MISSING if rc == abi.E_NO_KERNEL_IMAGE else reasons.LOAD_FAILED
            raise ArtifactError(f"ping: {text}", code)
        try:
            info = parse_ping(text)
        except (ValueError, RecursionError) as exc:
            raise ArtifactError(f"ping returned no usable JSON object: {exc}", reasons.LOAD_FAILED) from None
        if lto is not None and info.get("lto_linked") != f"sm_{lto[1]}":
            raise ArtifactError(
                f"the image linked for sm_{lto[1]} was not registered (the ping says {info.get('lto_linked')}): "
                "the library was loaded into this process before (for another GPU), or is no LTO variant",
                reasons.LOAD_FAILED,
            )
    except BaseException:
        lib.destroy(handle)
        raise
    return lib, handle, info
