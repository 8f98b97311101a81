"""The Python face of a loaded backend: ``Backend`` and resident ``Buffer``.

It knows only the C ABI (through ``abi.BackendLibrary``), never CUDA. Operands
are any C-contiguous float32 buffer (NumPy arrays, ``array.array('f')``,
memoryviews); NumPy is used only if the caller already imported it.
"""

from __future__ import annotations

import array
import ctypes
import json
import os
import sys
import threading
import weakref
from typing import Any

from . import abi
from .errors import (
    BackendClosedError,
    BackendError,
    BufferError_,
    InvalidInputError,
    OutOfMemoryError,
    UnknownOpError,
)

# op -> (number of array operands, result is one element): what a backend's ping JSON
# declares under "ops" (cuplug_ops.h); this is the reference backend's table, used
# only for a backend built before ops were declared.
VECTOR_OPS = {"add": (2, False), "scale_add": (1, False), "sum": (1, True)}


def _ops_of(info: dict[str, Any]) -> dict[str, tuple[int, bool]]:
    declared = info.get("ops")
    if not isinstance(declared, dict):
        return dict(VECTOR_OPS)
    return {name: (int(spec.get("inputs", 1)), spec.get("out") == "1") for name, spec in declared.items()}


_FLOAT_FORMATS = {"f", "<f", "=f", "@f"}

# A CUDA context does not survive fork(): in the child, every CUDA backend of the
# parent is marked so that its use is a clear error instead of a hang, and its
# lock is replaced (another parent thread may have held it at the fork).
_cuda_backends: weakref.WeakSet[Backend] = weakref.WeakSet()


def _mark_forked() -> None:
    for backend in list(_cuda_backends):
        backend._forked_from = backend._pid
        backend._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_forked)


class _Operand:
    """A host array pinned for the duration of one call: pointer + element count."""

    def __init__(self, obj: Any, name: str, writable: bool = False) -> None:
        try:
            view = memoryview(obj)
        except TypeError as exc:
            raise InvalidInputError(f"{name}: expected a float32 buffer, got {type(obj).__name__}") from exc
        if view.format not in _FLOAT_FORMATS or view.itemsize != 4:
            raise InvalidInputError(f"{name}: expected float32 elements, got format {view.format!r}")
        if not view.c_contiguous:
            raise InvalidInputError(f"{name}: array is not C-contiguous; pass a contiguous copy")
        self.n = view.nbytes // 4
        if self.n == 0:
            raise InvalidInputError(f"{name}: array is empty (n = 0)")
        self.view = view.cast("B")
        if view.readonly:
            if writable:
                raise InvalidInputError(f"{name}: output array is read-only")
            self._keep: Any = ctypes.create_string_buffer(bytes(self.view), view.nbytes)
        else:
            self._keep = (ctypes.c_char * view.nbytes).from_buffer(self.view)
        self.ptr = ctypes.addressof(self._keep)

    def release(self) -> None:
        self._keep = None
        self.view.release()


def _new_like(template: Any, n: int) -> Any:
    """An output array of the caller's kind: NumPy if the input was NumPy."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(template, np.ndarray):
        return np.empty(template.shape if template.size == n else (n,), dtype=np.float32)
    return array.array("f", bytes(4 * n))


class Backend:
    """A live backend instance. Thread-safe; use as a context manager or call ``close()``."""

    def __init__(
        self, library: abi.BackendLibrary, handle: int, info: dict[str, Any], cuda: str | None = None, trace: Any = None
    ) -> None:
        self._lib = library
        self._handle: int | None = handle
        self._lock = threading.Lock()
        self._info = info
        self.variant: str = info.get("variant", "unknown")
        self.ops = _ops_of(info)  # op -> (operand count, returns one element)
        self.cuda = cuda
        self.trace = trace
        self.path = library.path
        self._pid = os.getpid()
        self._forked_from: int | None = None
        if cuda is not None:
            _cuda_backends.add(self)

    # ---- lifecycle
    def close(self) -> None:
        """Destroys the instance and frees its buffers. Closing twice is an error."""
        with self._lock:
            if self._handle is None:
                raise BackendClosedError("Backend.close(): this backend is already closed")
            handle, self._handle = self._handle, None
            if self._forked_from is None:  # in a forked child the context is not ours to destroy
                self._lib.destroy(handle)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<cuplug.Backend {self._info.get('backend')}/{self.variant} {state}>"

    def _live_handle(self) -> int:
        if self._handle is None:
            raise BackendClosedError("this backend is closed; call cuplug.load() for a new one")
        if self._forked_from is not None:
            raise BackendError(
                f"this {self.cuda} backend was created in process {self._forked_from}; a CUDA "
                "context does not survive fork(): load in the child after the fork, or start "
                "workers with the 'spawn' method",
                abi.E_DEVICE,
            )
        return self._handle

    def _check(self, rc: int, what: str) -> None:
        if rc >= 0:
            return
        msg = f"{what}: {self._lib.last_error(self._live_handle()) or 'error ' + str(rc)}"
        if rc == abi.E_BAD_BUFFER:
            raise BufferError_(msg, rc)
        if rc == abi.E_OUT_OF_MEMORY:
            raise OutOfMemoryError(msg, rc)
        if rc == abi.E_UNKNOWN_OP:
            raise UnknownOpError(msg)
        if rc in (abi.E_INVALID_ARGUMENT, abi.E_BUFFER_TOO_SMALL):
            raise InvalidInputError(msg)
        raise BackendError(msg, rc)

    # ---- facts
    def info(self) -> dict[str, Any]:
        """A fresh ping: backend, variant, versions, device, memory, temperature, targets."""
        with self._lock:
            rc, text = self._lib.ping(self._live_handle())
            if rc < 0:
                raise BackendError(f"ping: {text}", rc)
        info: dict[str, Any] = json.loads(text)
        for key in ("sass", "ptx"):
            if isinstance(info.get(key), str):
                info[key] = [t for t in info[key].split(",") if t]
        return info

    # ---- work
    def run(self, op: str, *operands: Any, out: Any = None, alpha: float = 1.0, beta: float = 0.0) -> Any:
        """``run("add", x, y)``, ``run("scale_add", x, alpha=2, beta=1)``, ``run("sum", x)``.

        Host arrays give a host result (same kind as ``x``; a float for ``sum``).
        ``Buffer`` operands run resident and give a ``Buffer`` (a float for ``sum``).
        """
        if op not in self.ops:
            raise UnknownOpError(
                f"unknown op {op!r}; this {self._info.get('backend', '')} backend has {', '.join(self.ops)}"
            )
        count, scalar = self.ops[op]
        if len(operands) != count:
            raise InvalidInputError(f"{op} takes {count} array operand(s), got {len(operands)}")
        if any(isinstance(o, Buffer) for o in operands):
            return self._run_resident(op, operands, out, alpha, beta, scalar)
        inputs = [_Operand(o, f"operand {i}") for i, o in enumerate(operands)]
        try:
            n = inputs[0].n
            for extra in inputs[1:]:
                if extra.n != n:
                    raise InvalidInputError(f"{op}: operand lengths differ ({n} vs {extra.n})")
            result = array.array("f", [0.0]) if scalar else (out if out is not None else _new_like(operands[0], n))
            dst = _Operand(result, "out", writable=True)
            try:
                if not scalar and dst.n != n:
                    raise InvalidInputError(f"{op}: out has {dst.n} elements, inputs have {n}")
                y = inputs[1].ptr if len(inputs) > 1 else None
                with self._lock:
                    rc = self._lib.run(
                        self._live_handle(), op.encode(), inputs[0].ptr, y, float(alpha), float(beta), dst.ptr, n
                    )
                    self._check(rc, op)
            finally:
                dst.release()
        finally:
            for operand in inputs:
                operand.release()
        return float(result[0]) if scalar else result

    def _run_resident(
        self, op: str, operands: tuple[Any, ...], out: Any, alpha: float, beta: float, scalar: bool
    ) -> Any:
        if not all(isinstance(o, Buffer) and o.backend is self for o in operands):
            raise InvalidInputError(f"{op}: mix of host arrays and buffers, or buffers of another backend")
        n = operands[0].n
        if any(o.n != n for o in operands):
            raise InvalidInputError(f"{op}: buffer lengths differ")
        target = out if out is not None else self.empty(1 if scalar else n)
        target._template = target._template if out is not None else operands[0]._template
        in2 = operands[1].id if len(operands) > 1 else 0
        with self._lock:
            rc = self._lib.run_resident(
                self._live_handle(), op.encode(), operands[0].id, in2, target.id, float(alpha), float(beta), n
            )
            self._check(rc, op)
        if scalar:
            value = target.to_host()[0]
            if out is None:
                target.free()
            return float(value)
        return target

    # ---- resident buffers
    def empty(self, n: int) -> Buffer:
        """A resident buffer of n float32 elements (contents undefined)."""
        if not isinstance(n, int) or n <= 0:
            raise InvalidInputError(f"buffer length must be a positive int, got {n!r}")
        with self._lock:
            rc = self._lib.alloc(self._live_handle(), n)
            self._check(rc, "alloc")
        return Buffer(self, int(rc), n)

    def buffer(self, x: Any) -> Buffer:
        """Copies a host float32 array into a new resident buffer."""
        src = _Operand(x, "buffer source")
        try:
            buf = self.empty(src.n)
            buf._template = x
            buf.upload(x)
        finally:
            src.release()
        return buf

    def sync(self) -> None:
        with self._lock:
            self._check(self._lib.sync(self._live_handle()), "sync")


class Buffer:
    """Backend-owned float32 storage (device memory on CUDA). Free it, or let close() do it."""

    def __init__(self, backend: Backend, buffer_id: int, n: int) -> None:
        self.backend = backend
        self.id = buffer_id
        self.n = n
        self._template: Any = None

    def upload(self, x: Any) -> None:
        src = _Operand(x, "upload source")
        try:
            if src.n != self.n:
                raise InvalidInputError(f"upload: source has {src.n} elements, buffer has {self.n}")
            b = self.backend
            with b._lock:
                b._check(b._lib.upload(b._live_handle(), self.id, src.ptr, self.n), "upload")
        finally:
            src.release()

    def to_host(self, out: Any = None) -> Any:
        """Downloads into ``out`` (or a new array like the source) and returns it."""
        result = out if out is not None else _new_like(self._template, self.n)
        dst = _Operand(result, "out", writable=True)
        try:
            if dst.n != self.n:
                raise InvalidInputError(f"download: out has {dst.n} elements, buffer has {self.n}")
            b = self.backend
            with b._lock:
                b._check(b._lib.download(b._live_handle(), self.id, dst.ptr, self.n), "download")
        finally:
            dst.release()
        return result

    def free(self) -> None:
        b = self.backend
        with b._lock:
            b._check(b._lib.free(b._live_handle(), self.id), "free")

    def __repr__(self) -> str:
        return f"<cuplug.Buffer id={self.id:#x} n={self.n} on {self.backend.variant}>"
