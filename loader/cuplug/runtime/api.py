"""The Python face of a loaded backend: ``Backend`` and its resident ``Tensor`` (alias ``Buffer``).

It knows only the C ABI v2 (``library.BackendLibrary``), never CUDA. Operands are read
without a copy: cuplug Tensors, anything with ``__dlpack__`` (PyTorch, CuPy, JAX,
NumPy), ``__cuda_array_interface__`` (CuPy, Numba) or the buffer protocol
(NumPy, ``array.array``, memoryview). Every call is checked against the op's
signature (``Backend.ops``) before it reaches C, and outputs are allocated from it.

Streams: ``stream=None`` runs on the instance's stream, ordered after the
producer's work by the DLPack handshake (``x.__dlpack__(stream=ours)``), and the
producer framework's current stream (PyTorch, CuPy) then waits for ours, so the
caller goes on without a synchronize. A given ``stream`` (an integer handle,
``torch.cuda.Stream``, a CuPy stream, anything with ``__cuda_stream__``) is used
as it is: the producers are ordered before it by the same handshake, and what
follows on it is ordered by CUDA itself.

Lifetimes: a Tensor's memory lives while the Tensor object or a DLPack consumer
of it does, even after ``Backend.close()``; the instance is destroyed when the
Backend is closed (or unreachable) and its last exported tensor has gone.
"""

from __future__ import annotations

import _thread
import _weakref
import atexit
import ctypes
import os
import sys
from _weakrefset import WeakSet

from ..contract import abi, dtypes, jsontext
from ..contract.errors import (
    BackendClosedError,
    BackendError,
    BufferError_,
    InvalidInputError,
    OutOfMemoryError,
    UnknownOpError,
    cut,
    shown,
)
from . import fastpath, operands, plan, signature

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from .library import BackendLibrary

_NO_STREAM = ctypes.c_uint64(0)  # call_fast's stream argument for "the instance's stream"
_CUDA_LEGACY_STREAM = 1  # cudaStreamLegacy: what a framework's "stream 0" means to the C side (0 = instance)


def _c_stream(handle: int) -> int:
    return _CUDA_LEGACY_STREAM if handle == 0 else handle


def stream_handle(stream: Any) -> int:
    """The cudaStream_t behind ``stream`` as an integer (0 = the legacy default stream)."""
    if isinstance(stream, bool):
        raise InvalidInputError(f"stream must be a CUDA stream or its handle, got {stream!r}")
    handle = stream if isinstance(stream, int) else _object_stream_handle(stream)
    if handle < 0:  # an address: a negative one is no stream, whoever gives it
        raise InvalidInputError(f"stream handle must be >= 0, got {handle}")
    if handle >= operands.ADDRESS_END:  # a cudaStream_t is an address (or 1, 2): ctypes would wrap 2^64 to 0
        raise InvalidInputError(f"stream handle {handle:#x} is no address of this process, so no CUDA stream")
    return handle


def _object_stream_handle(stream: Any) -> int:
    try:
        proto = getattr(stream, "__cuda_stream__", None)
    except Exception as exc:  # a property that raises
        raise InvalidInputError(
            f"stream: reading __cuda_stream__ raised {type(exc).__name__}: {cut(str(exc))}"
        ) from exc
    if proto is not None:
        try:
            _version, handle = proto() if callable(proto) else proto
            found = operands.as_index(handle)
        except Exception as exc:
            raise InvalidInputError(
                f"stream: __cuda_stream__ gave no (version, handle) pair: {type(exc).__name__}: {cut(str(exc))}"
            ) from exc
        if found is None:
            raise InvalidInputError(f"stream: __cuda_stream__ gave the handle {shown(handle)}, not an integer")
        return found
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy.cuda.Stream, cuda.core Stream
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise InvalidInputError(
        f"stream: expected an int handle, a torch.cuda.Stream, a CuPy stream or an object with __cuda_stream__, "
        f"got {type(stream).__name__}"
    )


def _framework_stream(obj: Any, device: int) -> int | None:
    """The current stream of the framework that made ``obj`` (PyTorch, CuPy), or None."""
    root = _root(obj)
    mod = sys.modules.get(root)
    try:
        if root == "torch" and mod is not None:
            raw = getattr(getattr(mod, "_C", None), "_cuda_getCurrentRawStream", None)  # 0.2 us; current_stream()
            if raw is not None:  # makes a Stream object first
                try:
                    return int(raw(device))
                except Exception:  # (a build without CUDA says so here; current_stream() below decides)
                    pass
            return int(mod.cuda.current_stream(device).cuda_stream)
        if root == "cupy" and mod is not None:
            return int(mod.cuda.get_current_stream().ptr)
    except Exception:  # a framework that cannot say: the caller orders by hand (documented)
        return None
    return None


def _framework_empty(inputs: tuple, out_specs: list[Any]) -> tuple[list[Any], str, Any] | None:
    """Device outputs from the allocator of the first device input's framework: ``torch.empty`` on its device
    (PyTorch's caching allocator, stream-ordered on the current stream), ``cupy.empty`` (CuPy's pool); None
    for any other producer (the backend's own memory then). With the framework's name and that input."""
    for x in inputs:
        root = _root(x)
        mod = sys.modules.get(root)
        if mod is None:
            continue
        if root == "torch" and isinstance(x, getattr(mod, "Tensor", ())) and x.is_cuda:
            return [mod.empty(shape, dtype=getattr(mod, dt.name), device=x.device) for dt, shape in out_specs], root, x
        if root == "cupy" and isinstance(x, getattr(mod, "ndarray", ())) and all(dt.typestr for dt, _ in out_specs):
            with mod.cuda.Device(x.device.id):
                return [mod.empty(shape, dtype=dt.name) for dt, shape in out_specs], root, x
    return None


def _root(obj: Any) -> str:
    """The top package of the module that defined ``obj``'s type ("torch", "cupy"); "" when it names none."""
    module = getattr(type(obj), "__module__", None)
    return module.partition(".")[0] if isinstance(module, str) else ""


def _torch_exact(torch: Any) -> tuple[type, ...]:
    """torch.Tensor and torch.nn.Parameter: the types whose accessors are PyTorch's own (read each time: a test's
    stand-in module may sit in sys.modules before the real one)."""
    found = (getattr(torch, "Tensor", None), getattr(getattr(torch, "nn", None), "Parameter", None))
    return tuple(t for t in found if isinstance(t, type))


_NDARRAY: list[type | None] = [None]


def _ndarray() -> type | None:
    """numpy.ndarray once NumPy is imported (by anyone; cuplug never imports it itself), then remembered."""
    nd = getattr(sys.modules.get("numpy"), "ndarray", None)
    _NDARRAY[0] = nd
    return nd


def _has(obj: Any, protocol: str) -> bool:
    """Whether ``obj`` offers ``protocol``; a property that raises anything but AttributeError offers it
    (broken): the importer then names what it raised, instead of hasattr() letting it out."""
    try:
        getattr(obj, protocol)
    except AttributeError:
        return False
    except Exception:
        return True
    return True


def _capsule(obj: Any, name: str, stream: int | None = None) -> Any:
    """``obj.__dlpack__()`` (with ``stream`` for a device producer); whatever the producer raises becomes an
    InvalidInputError naming the operand, with the producer's exception as its cause."""
    try:
        try:
            return obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
        except TypeError:
            if stream is None:
                raise
            return obj.__dlpack__()  # a producer from before the stream keyword
    except Exception as exc:
        raise InvalidInputError(f"{name}: its __dlpack__() failed: {type(exc).__name__}: {cut(str(exc))}") from exc


# ---- the instance behind a Backend and its tensors


class _Core:
    """The C handle, its lock and its live tensors; destroyed when closed and no tensor is left."""

    __slots__ = (
        "__weakref__",
        "closed",
        "cuda",
        "device",
        "forked_from",
        "handle",
        "lib",
        "live",
        "lock",
        "c_handle",
        "on_destroy",
        "pid",
        "stream",
    )

    def __init__(self, lib: BackendLibrary, handle: int, cuda: str | None, device: int, stream: int) -> None:
        self.lib = lib
        self.handle: int | None = handle
        self.lock = _thread.RLock()  # RLock: a finalizer may run inside a locked section of this thread
        self.closed = False
        self.live: dict[int, _weakref.ReferenceType[Tensor]] = {}
        self.cuda = cuda
        self.pid = os.getpid()
        self.forked_from: int | None = None
        self.device = device
        self.stream = stream
        self.on_destroy: list[Any] = []  # called just before the instance is destroyed (cuplug.jax's handler)
        self.c_handle = ctypes.c_void_p(handle)  # the handle as call_fast takes it (run() checks it is live)

    def usable(self) -> bool:
        return self.handle is not None and self.forked_from is None

    def release(self, buffer_id: int) -> None:
        """A tensor has gone (its last holder let go): free it, and the instance if it was the last."""
        with self.lock:
            self.live.pop(buffer_id, None)
            if self.usable():
                self.lib.free(self.handle, buffer_id)
            self._destroy_if_done()

    def close(self) -> None:
        """No new work; free every tensor never exported; destroy once the exported ones have gone."""
        with self.lock:
            self.closed = True
            for buffer_id, ref in list(self.live.items()):
                t = ref()
                if t is None or not t._exported:
                    if t is not None:
                        t._dead = "closed"
                        if t._finalizer is not None:
                            t._finalizer.detach()
                    self.live.pop(buffer_id, None)
                    if self.usable():
                        self.lib.free(self.handle, buffer_id)
            self._destroy_if_done()

    def _destroy_if_done(self) -> None:
        if self.closed and not self.live and self.handle is not None:
            handle, self.handle = self.handle, None
            for forget in self.on_destroy:  # whoever may still call the instance learns it is gone first
                forget()
            self.on_destroy.clear()
            if self.forked_from is None:  # in a forked child the context is not ours to destroy
                self.lib.destroy(handle)


_cores: WeakSet[_Core] = WeakSet()
_finalizers: set[_Finalizer] = set()  # a finalizer lives here until it runs or is detached
_exiting = [False]


class _Finalizer:
    """What cuplug uses of ``weakref.finalize``: ``func(*args)`` once, when ``obj`` is collected or the
    finalizer is called, unless detached; never during interpreter exit (the process ends; the driver
    frees the context). On ``_weakref`` alone: ``import weakref`` costs 0.95 ms of ``load()``'s 20 on
    the 2-core CPU machine (fresh processes, median of 41, against a bare interpreter)."""

    __slots__ = ("_args", "_func", "_ref")

    def __init__(self, obj: object, func: Any, *args: Any) -> None:
        self._func, self._args = func, args
        self._ref = _weakref.ref(obj, self._collected)
        _finalizers.add(self)

    def _collected(self, _ref: object) -> None:
        if not _exiting[0]:
            self()

    def __call__(self) -> Any:
        try:
            _finalizers.remove(self)  # atomic: exactly one caller gets past it
        except KeyError:
            return None
        func, args = self._func, self._args
        self._func, self._args = None, ()  # what it closed is let go now, not whenever gc finds this object
        return func(*args)

    def detach(self) -> bool:
        try:
            _finalizers.remove(self)
        except KeyError:
            return False
        self._func, self._args = None, ()
        return True


atexit.register(lambda: _exiting.__setitem__(0, True))


def _after_fork_in_child() -> None:
    # A CUDA context does not survive fork(): the child's CUDA instances refuse work with a clear
    # error; every lock is new, since another parent thread may have held it at the fork.
    for core in list(_cores):
        core.lock = _thread.RLock()
        if core.cuda is not None:
            core.forked_from = core.pid


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _no_copy(self: Any, *args: Any) -> Any:
    raise TypeError(
        f"a cuplug {type(self).__name__} owns a live backend instance and cannot be copied or pickled; "
        "load another with cuplug.load()"
    )


# ---- operands: see operands.py (every field a producer gives is bounded before use)

_Arg = operands.Arg


class Backend:
    """A live backend instance. Thread-safe; use as a context manager or call ``close()``."""

    def __init__(
        self, library: BackendLibrary, handle: int, info: dict[str, Any], cuda: str | None = None, trace: Any = None
    ) -> None:
        self._info = info
        self.variant: str = info.get("variant", "unknown")
        self.name: str = str(info.get("backend", ""))
        self.ops = signature.parse(info.get("ops", {}))
        self.cuda = cuda
        self.trace = trace
        self._path = library.path  # the real file (never the sealed copy it was mapped from)
        device = info.get("device") or {}
        self.device_type = dtypes.DEVICE_CUDA if device.get("type", "cuda" if cuda else "cpu") == "cuda" else 1
        self.device_index = int(device.get("index") or 0)
        total = device.get("memory_total")
        self._device_bytes = total if operands.is_int(total) and total > 0 else None  # None: the host's
        self._core = _Core(library, handle, cuda, self.device_index, int(info.get("stream") or 0))
        _cores.add(self._core)
        self._finalizer = _Finalizer(self, _Core.close, self._core)
        self._plans: dict[tuple, plan.Plan] = {}
        fast = fastpath.dispatcher(self, Backend.run, Tensor)
        if fast is not None:  # run() repeated in C once learned; Backend.run(b, ...) is the whole path
            self.run = fast

    __copy__ = __deepcopy__ = __reduce_ex__ = __reduce__ = _no_copy

    @property
    def path(self) -> Path:
        """The backend library's file (``pathlib.Path``, imported on first use: load() does not need it)."""
        from pathlib import Path

        return Path(self._path)

    # ---- lifecycle
    def close(self) -> None:
        """Closes the instance: no new work; its tensors are freed, except exported ones (freed when their
        consumer lets go). Closing twice is an error."""
        core = self._core
        with core.lock:
            if core.closed:
                raise BackendClosedError("Backend.close(): this backend is already closed")
            self._finalizer.detach()
            core.close()

    @property
    def closed(self) -> bool:
        return self._core.closed

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._core.closed:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<cuplug.Backend {self.name}/{self.variant} {state}>"

    def _live_handle(self) -> int:
        core = self._core
        if core.closed or core.handle is None:
            raise BackendClosedError("this backend is closed; call cuplug.load() for a new one")
        if core.forked_from is not None:
            raise BackendError(
                f"this {self.cuda} backend was created in process {core.forked_from}; a CUDA "
                "context does not survive fork(): load in the child after the fork, or start "
                "workers with the 'spawn' method",
                abi.E_DEVICE,
            )
        return core.handle

    def _check(self, rc: int, what: str) -> None:
        if rc == abi.OK:
            return
        if rc > 0:  # never success: backend.h defines 0 and negative statuses only (an unknown negative is an error)
            raise BackendError(
                f"{what}: the backend returned status {rc}, which the ABI does not define (0 or a negative status); "
                f"its results are not trusted (a bug of the {self.name} backend: report it to its authors)",
                rc,
            )
        text = self._core.lib.last_error(self._core.handle or 0) or f"error {rc}"
        msg = text if text.startswith(f"{what}:") else f"{what}: {text}"
        if rc == abi.E_BAD_BUFFER:
            raise BufferError_(msg, rc)
        if rc == abi.E_OUT_OF_MEMORY:
            raise OutOfMemoryError(msg, rc)
        if rc == abi.E_UNKNOWN_OP:
            raise UnknownOpError(msg)
        if rc in (abi.E_INVALID_ARGUMENT, abi.E_BUFFER_TOO_SMALL, abi.E_WRONG_DEVICE):
            raise InvalidInputError(msg)
        raise BackendError(msg, rc)

    # ---- facts
    def info(self) -> dict[str, Any]:
        """A fresh ping: backend, variant, versions, device, memory, temperature, targets, op signatures."""
        with self._core.lock:
            rc, text = self._core.lib.ping(self._live_handle())
            if rc < 0:
                raise BackendError(f"ping: {text}", rc)
        info: dict[str, Any] = jsontext.loads(text)
        for key in ("sass", "ptx"):
            if isinstance(info.get(key), str):
                info[key] = [t for t in info[key].split(",") if t]
        return info

    @property
    def stream(self) -> int:
        """The instance stream's handle (0 on the CPU)."""
        return self._core.stream

    # ---- operands
    def _arg(self, obj: Any, name: str, writable: bool, handshake: int | None) -> _Arg:
        kind = type(obj)
        if kind is Tensor:
            return obj._arg(self, name)
        if kind is _NDARRAY[0] or (_NDARRAY[0] is None and kind is _ndarray()):  # NumPy, the host's usual array:
            try:  # its buffer export, no DLPack round trip
                view: memoryview | None = memoryview(obj)
            except (TypeError, ValueError):  # datetime64 and the like: no buffer format; DLPack says why
                view = None
            if view is not None and view.format in dtypes.BY_FORMAT:  # else (ml_dtypes' bfloat16): DLPack names it
                return operands.from_memoryview(obj, name, writable, view)
        torch = sys.modules.get("torch")
        if torch is not None and kind in _torch_exact(torch):  # its own accessors (torch's __dlpack__ costs
            # microseconds a call); a subclass, whose accessors may be anyone's, goes through DLPack
            if obj.layout is not torch.strided or obj.is_nested:
                raise InvalidInputError(
                    f"{name}: a PyTorch tensor of layout {obj.layout}: pass a dense one (x.to_dense())"
                )
            arg = operands.from_torch(obj, name, writable)
            if not arg.host:
                self._on_this_device(arg.device[1], name)
            return arg
        if writable and _root(obj) in ("jax", "jaxlib"):
            raise InvalidInputError(
                f"{name}: JAX arrays are immutable, so out= cannot write one; take the result "
                "(jnp.asarray(result) shares its memory), or call the op inside jax.jit through cuplug.jax"
            )
        if isinstance(obj, Tensor):
            return obj._arg(self, name)
        masked = getattr(sys.modules.get("numpy.ma"), "MaskedArray", None)
        if masked is not None and isinstance(obj, masked):  # its buffer is the data without the mask
            raise InvalidInputError(
                f"{name}: a NumPy masked array: its mask would be ignored; pass x.filled(value) or x.data"
            )
        if _has(obj, "__dlpack__") and _has(obj, "__dlpack_device__"):
            dev_type, dev_id = operands.dlpack_device(obj, name)
            if dev_type in dtypes.HOST_DEVICES:
                try:  # the buffer protocol where the host array has it: no capsule, read-only arrays too
                    view = memoryview(obj)
                except (TypeError, ValueError):
                    view = None
                if view is not None and view.format in dtypes.BY_FORMAT:
                    return operands.from_memoryview(obj, name, writable, view)
                return operands.from_dlpack_capsule(obj, _capsule(obj, name), name, writable, (dev_type, dev_id))
            if dev_type != dtypes.DEVICE_CUDA:
                raise InvalidInputError(f"{name}: DLPack device type {dev_type} is neither the host nor CUDA")
            self._on_this_device(dev_id, name)
            capsule = _capsule(obj, name, _c_stream(handshake or 0))
            return operands.from_dlpack_capsule(obj, capsule, name, writable, (dev_type, dev_id))
        if _has(obj, "__cuda_array_interface__"):
            if self.device_type != dtypes.DEVICE_CUDA:
                raise self._cuda_on_cpu(name, None)
            return operands.from_cai(obj, name, writable, self.device_index)
        try:
            view = memoryview(obj)
        except (TypeError, ValueError):  # no buffer (TypeError), or one of no format (ValueError: datetime64)
            raise InvalidInputError(
                f"{name}: expected an array (the buffer protocol, __dlpack__ or __cuda_array_interface__), "
                f"got {type(obj).__name__}"
            ) from None
        return operands.from_memoryview(obj, name, writable, view)

    def _on_this_device(self, dev_id: int, name: str) -> None:
        """A CUDA operand on cuda:``dev_id``: this must be a CUDA backend of that device."""
        if self.device_type != dtypes.DEVICE_CUDA:
            raise self._cuda_on_cpu(name, dev_id)
        if dev_id != self.device_index:
            raise InvalidInputError(
                f"{name} is on cuda:{dev_id}, this backend on cuda:{self.device_index}: move it "
                f"(x.to('cuda:{self.device_index}')) or load a backend for that device (cuplug.load(device={dev_id}))"
            )

    def _cuda_on_cpu(self, name: str, dev_id: int | None) -> InvalidInputError:
        where = f"cuda:{dev_id}" if dev_id is not None else "a CUDA device"
        why = ""
        code = getattr(self.trace, "decision_code", None)
        if code == "forced":
            why = " (forced by CUPLUG_BACKEND)"
        elif code:
            why = f" (CUDA could not serve: {code}: {self.trace.decision_reason})"
        return InvalidInputError(
            f"{name} is on {where}, but this is the CPU backend{why}: pass a host array (x.cpu()) or fix the CUDA "
            "install (`cuplug doctor` says why)"
        )

    # ---- work
    def run(self, op: str, *inputs: Any, out: Any = None, stream: Any = None, **attrs: Any) -> Any:
        """``run("add", x, y)``, ``run("scale_add", x, alpha=2, beta=1)``, ``run("sum", x)``.

        Host inputs give host results of the caller's kind (NumPy for NumPy, PyTorch for PyTorch CPU
        tensors, ``array.array`` otherwise); a scalar result of host or resident inputs is a Python number.
        Device inputs give device results from the caller's own allocator: PyTorch tensors for PyTorch
        inputs (its caching allocator), CuPy arrays for CuPy inputs (its pool), backend-owned Tensors
        otherwise (JAX, CAI producers, cuplug Tensors), which export ``__dlpack__`` and
        ``__cuda_array_interface__``. ``out=`` (one array, or a tuple for several outputs) writes into the
        caller's arrays and returns them. Several outputs come back as a tuple.

        ``stream=None``: PyTorch and CuPy inputs run on their framework's current stream (ordered with the
        caller's work by CUDA itself, capturable in a CUDA graph); others on the instance's stream.
        """
        sig = self.ops.get(op) if type(op) is str else None  # (a list as the name: no TypeError from the lookup)
        if sig is None:
            listed = ", ".join(self.ops) or "none"
            raise UnknownOpError(f"unknown op {shown(op)}; this {self.name} backend has {listed}")
        self._live_handle()
        given = attrs  # as the caller gave them (what the fast path converts again on each call)
        if attrs:  # each given value read once: a value answering differently twice cannot mislead a plan
            by_name = sig.attr_by_name
            if any(n not in by_name for n in attrs):
                sig.attr_values(attrs)  # raises, naming the unknown ones
            attrs = {n: by_name[n].value_of(v, op) for n, v in attrs.items()}
        if stream is not None:
            launch: int | None = stream_handle(stream)
        elif self.device_type == dtypes.DEVICE_CUDA:
            launch = self._framework_launch(inputs, out)  # None: the instance's stream
        else:
            launch = None
        handshake = launch if launch is not None else self._core.stream
        labels = sig.input_labels
        if len(inputs) <= len(labels):
            args = [self._arg(x, label, False, handshake) for x, label in zip(inputs, labels, strict=False)]
        else:  # more inputs than declared: refused by the plan, named by index
            args = [self._arg(x, f"{op}: {i}", False, handshake) for i, x in enumerate(inputs)]
        out_args: list[_Arg] = []
        if out is not None:
            outs_given = list(out) if isinstance(out, (tuple, list)) else [out]
            if len(outs_given) != len(sig.outputs):
                raise InvalidInputError(f"{op} has {len(sig.outputs)} output(s), out= gave {len(outs_given)}")
            out_args = [self._arg(o, sig.output_labels[i], True, handshake) for i, o in enumerate(outs_given)]
        p = self._plan(sig, args, out_args if out is not None else None, inputs, attrs)
        resident = p.resident
        owned: list[Tensor] = []
        like = None  # what the outputs were made like, and by whom (the fast path repeats it: fastpath.learn)
        if out is not None:
            results = outs_given
            _refuse_overlap(sig, args, out_args)
            made_by = "out"
        elif p.host and not resident:
            # made like the caller's own array, not like a resident tensor beside it (CPU backend)
            like = next((x for x in inputs if not isinstance(x, Tensor)), None)
            results = [
                _host_result(like, dt, shape, bool(o.shape_rule.get("scalar")))
                for (dt, shape), o in zip(p.out_specs, sig.outputs, strict=True)
            ]
            # array.array holds a flat copy of any shape: the plan's descriptor carries the op's shape.
            out_args = [self._arg(r, f"{op}: out", True, None) for r in results]
            made_by = "host"
        else:
            made = _framework_empty(inputs, p.out_specs)  # the caller's allocator, on its stream
            if made is not None:
                results, made_by, like = made
                out_args = [self._arg(r, f"{op}: out", True, launch) for r in results]
            else:
                made_by = "backend"
                owned = [self.empty(shape, dt) for dt, shape in p.out_specs]
                results = list(owned)
                out_args = [t._arg(self, f"{op}: out") for t in owned]
        c_launch = _c_stream(launch) if launch is not None else 0
        core = self._core
        try:
            with core.lock:
                handle = self._live_handle()
                if p.tensors:
                    for x in (*inputs, *(results if out is not None else ())):
                        if isinstance(x, Tensor) and x._dead:  # freed by another thread since it was read
                            x._handle()  # raises, naming how it went
                on = launch if launch is not None else core.stream
                for a in (*args, *out_args):
                    if a.stream is not None and a.stream != on:  # a producer stream (resident, CAI v3) first
                        self._check(core.lib.stream_wait(handle, c_launch, _c_stream(a.stream)), f"{op}: stream order")
                p.fill(args, out_args, attrs, op)
                rc = core.lib.call_fast(
                    core.c_handle,
                    p.c_op,
                    p.c_in,
                    len(args),
                    p.c_out,
                    len(out_args),
                    p.c_attrs,
                    p.n_attrs,
                    ctypes.c_uint64(c_launch) if c_launch else _NO_STREAM,
                )
                if rc:
                    self._check(rc, op)
                if launch is not None and core.stream and owned:
                    # Resident results written on the caller's stream: the instance stream waits for it now,
                    # so a tensor's writer is always the instance stream (a caller's stream may be destroyed
                    # before the tensor is read or exported; the instance stream lives as long as the tensor).
                    self._check(core.lib.stream_wait(handle, 0, c_launch), f"{op}: stream order")
        except BaseException:
            for t in owned:  # a failed call frees what it allocated
                t.free()
            raise
        finally:
            del args, out_args
        if owned:
            template = getattr(inputs[0], "_template", None) if inputs else None
            for t in owned:
                t._template = template
        if (p.host or resident) and out is None:
            results = [
                _scalar(r) if o.shape_rule.get("scalar") else r for r, o in zip(results, sig.outputs, strict=True)
            ]
        fast = self.__dict__.get("run")  # the C dispatcher (fastpath.py): it repeats this call from now on
        if fast is not None:
            fastpath.learn(fast, sig, p, op, inputs, out, stream, given, made_by, like)
        return results[0] if len(results) == 1 else tuple(results)

    def _plan(
        self, sig: signature.OpSignature, args: list[_Arg], out_args: list[_Arg] | None, inputs: tuple, attrs: dict
    ) -> plan.Plan:
        """The prepared call for these operands' specs and the attributes given (plan.py): made on the first call
        of its key, with every check that depends on nothing else; found again after that."""
        given = tuple(attrs)  # converted by run(): the values are what C receives
        sized = tuple((n, attrs[n]) for n in given if n in sig.shape_attrs)  # they key the plan by value
        key = (
            sig.name,
            given,
            sized,
            *[a.spec for a in args],
            None,
            *([] if out_args is None else [a.spec for a in out_args]),
        )
        found = self._plans.get(key)
        if found is not None:
            return found
        specs = [(a.dtype, a.shape) for a in args]
        attr_values = sig.attr_values(attrs)
        sig.check_inputs(specs, attr_values)
        out_specs = sig.output_specs(specs, attr_values)
        host = all(a.host for a in args) if args else True
        if args and any(a.host for a in args) != host:
            raise InvalidInputError(
                f"{sig.name}: a mix of host and device inputs; move them to one side (x.cuda() / x.cpu()) first"
            )
        resident = bool(args) and all(len(a.spec) == 4 for a in args)
        if out_args is not None:
            for i, (a, (dt, shape)) in enumerate(zip(out_args, out_specs, strict=True)):
                if a.dtype is not dt or a.shape != shape:
                    raise InvalidInputError(
                        f"{sig.name}: out has {signature.numel(a.shape)} elements ({a.dtype.name}{list(a.shape)}); "
                        f"{sig.outputs[i].name} must be {dt.name}{list(shape)}"
                    )
                if a.host != host:
                    raise InvalidInputError(
                        f"{sig.name}: out {sig.outputs[i].name} must be on the same side as the inputs"
                    )
            out_devices = [a.device for a in out_args]
        else:
            on_host = host and not resident
            self._check_room(sig, out_specs, on_host)
            here = (dtypes.DEVICE_CPU, 0) if on_host else (self.device_type, self.device_index)
            out_devices = [here] * len(out_specs)
        per_call = tuple(n for n in given if n not in dict(sized))
        made = plan.Plan(sig, [a.spec for a in args], out_specs, out_devices, attr_values, per_call, host)
        made.resident = resident
        made.given = given
        made.tensors = any(len(a.spec) == 4 for a in (*args, *(out_args or ())))
        # an allocated resident output: the device its backend's descriptor names is written per call
        made.out_devices_per_call = out_args is None and not (host and not resident)
        if len(self._plans) >= plan.MAX_PLANS:
            self._plans.clear()
        self._plans[key] = made
        return made

    def _framework_launch(self, inputs: tuple, out: Any) -> int | None:
        """The current stream of the first PyTorch CUDA tensor or CuPy array among the operands, or None."""
        outs = (out if isinstance(out, (tuple, list)) else (out,)) if out is not None else ()
        for x in (*inputs, *outs):
            root = _root(x)
            if root == "cupy" or (root == "torch" and getattr(x, "is_cuda", True)):
                found = _framework_stream(x, self.device_index)
                if found is not None:
                    return found
        return None

    def _check_room(self, sig: signature.OpSignature, out_specs: list[Any], on_host: bool) -> None:
        """Outputs about to be allocated fit the memory they are allocated in, checked before anything is:
        an output sized by a huge attribute (or a lying input's shape) is an OutOfMemoryError naming it."""
        room = _host_bytes() if on_host or self._device_bytes is None else self._device_bytes
        for (dt, shape), o in zip(out_specs, sig.outputs, strict=True):
            need = dt.itemsize * signature.numel(shape)  # Python integers: never an overflow
            if need > room:
                where = "this machine's memory" if on_host or self._device_bytes is None else "the device's memory"
                raise OutOfMemoryError(
                    f"{sig.name}: output {o.name} would be {dt.name}{list(shape)} ({need} bytes), more than {where} "
                    f"({room} bytes); pass smaller inputs or attributes, or out= arrays of your own",
                    abi.E_OUT_OF_MEMORY,
                )

    # ---- resident tensors
    def empty(self, shape: int | tuple[int, ...] | list[int], dtype: Any = "float32") -> Tensor:
        """A resident tensor (device memory on CUDA) of ``shape`` and ``dtype``; contents undefined."""
        if isinstance(shape, int) and not isinstance(shape, bool) and shape <= 0:  # a length, as in ABI v1
            raise InvalidInputError(f"buffer length must be a positive int, got {shape!r}")
        dims: tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise InvalidInputError(f"shape must be non-negative ints, got {shape!r}")
        try:
            dt = dtypes.from_name(dtype)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        c_shape = (ctypes.c_int64 * max(len(dims), 1))(*dims)
        core = self._core
        with core.lock:
            rc = core.lib.alloc(self._live_handle(), abi.CDtype(dt.code, dt.bits, 1), len(dims), c_shape)
            if rc < 0:
                self._check(rc, "alloc")
            if rc == 0:
                raise BackendError("alloc: the backend returned 0, which is no tensor id (a bug of the backend)", rc)
            t = Tensor(self, int(rc), dims, dt)
            t._own()
        return t

    def buffer(self, x: Any) -> Tensor:
        """Copies a host array into a new resident tensor of the same dtype and shape."""
        src = self._arg(x, "buffer source", False, None)
        if not src.host:
            raise InvalidInputError("buffer(): the source must be a host array; device arrays are used in place")
        t = self.empty(src.shape if src.shape else (), src.dtype)
        t._template = _HostKind.of(x)
        t._upload_arg(src)
        return t

    def sync(self) -> None:
        """Waits for the work queued on the instance's stream."""
        with self._core.lock:
            self._check(self._core.lib.sync(self._live_handle()), "sync")


class _Device:
    """A consumer's ``dl_device`` in the shape ``operands.dlpack_device`` reads."""

    __slots__ = ("pair",)

    def __init__(self, pair: Any) -> None:
        self.pair = pair

    def __dlpack_device__(self) -> Any:
        return self.pair


def _host_bytes() -> int:
    """The machine's physical memory: no host result cuplug allocates can be larger."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return operands.ADDRESS_END


def _refuse_overlap(sig: signature.OpSignature, args: list[_Arg], out_args: list[_Arg]) -> None:
    """An out= array may not share memory with an input or another output: the op would read what it has
    already written. The one exception: an elementwise op writing exactly over an input of its own dtype
    and shape (in place, element i read before it is written), as ``run("add", x, y, out=x)``."""
    for k, o in enumerate(out_args):
        lo, hi = o.addr, o.addr + o.nbytes
        if lo == hi:
            continue
        for j, a in enumerate((*args, *out_args)):
            if j == len(args) + k or not a.nbytes or a.addr >= hi or lo >= a.addr + a.nbytes:
                continue
            is_input = j < len(args)
            if (
                is_input
                and sig.elementwise
                and (a.addr, a.nbytes, a.dtype, a.shape) == (lo, o.nbytes, o.dtype, o.shape)
            ):
                continue
            if is_input:
                label = sig.inputs[j].name if j < len(sig.inputs) else str(j)
            else:
                label = sig.outputs[j - len(args)].name
            kind = "input" if is_input else "output"
            how = "partly overlaps" if (a.addr, a.nbytes) != (lo, o.nbytes) else "is the same memory as"
            why = (
                " (only an elementwise op may write exactly over one of its inputs)"
                if is_input and not sig.elementwise
                else ""
            )
            raise InvalidInputError(
                f"{sig.name}: out {sig.outputs[k].name} {how} {kind} {label}{why}; pass an out= array of its own memory"
            )


class _HostKind:
    """What a host result is made like: the caller's framework and dtype, never the caller's array
    (a resident tensor made from a host array must not keep that array alive)."""

    __slots__ = ("dtype", "root")

    def __init__(self, root: str, dtype: Any) -> None:
        self.root, self.dtype = root, dtype

    @staticmethod
    def of(obj: Any) -> _HostKind | None:
        if obj is None or isinstance(obj, _HostKind):
            return obj
        return _HostKind(_root(obj), getattr(obj, "dtype", None))


def _new_host(template: Any, dt: dtypes.DType, shape: tuple[int, ...]) -> Any:
    """A host output of the caller's kind: NumPy for NumPy, PyTorch for PyTorch, else ``array.array``."""
    kind = _HostKind.of(template)
    root = kind.root if kind is not None else ""
    np = sys.modules.get("numpy")
    if root == "torch" and "torch" in sys.modules:
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, dt.name))
    if np is not None and (root == "numpy" or not dt.array_code):
        if dt.name == "bfloat16":
            tdt = kind.dtype if kind is not None else None
            # a framework's bfloat16 (ml_dtypes) makes the array; cuplug's own dtype (a HostBuffer's) cannot
            if getattr(tdt, "name", "") != "bfloat16" or isinstance(tdt, dtypes.DType):
                raise InvalidInputError("a bfloat16 host result needs a bfloat16 NumPy input (ml_dtypes) or out=")
            return np.empty(shape, dtype=tdt)
        return np.empty(shape, dtype=dt.name)
    if not dt.array_code:
        raise InvalidInputError(
            f"a {dt.name} host result needs NumPy or PyTorch (array.array has no {dt.name}); pass out="
        )
    import array  # here: importing it costs 2.8 ms (it registers with collections.abc), load() needs none

    return array.array(dt.array_code, bytes(dt.itemsize * max(signature.numel(shape), 1 if shape == () else 0)))


def _host_result(template: Any, dt: dtypes.DType, shape: tuple[int, ...], scalar: bool) -> Any:
    """A host output; a scalar one of a dtype array.array lacks (float16, bfloat16) in cuplug's own host
    memory, so ``run("sum", x)`` answers a Python number without NumPy."""
    if scalar and not dt.array_code:
        from .hostbuf import HostBuffer

        return HostBuffer(dt, shape)
    return _new_host(template, dt, shape)


def _scalar(result: Any) -> Any:
    """The one element of a host or resident scalar result, as a Python number."""
    from .hostbuf import HostBuffer

    if isinstance(result, Tensor):  # through cuplug's own host memory: float16/bfloat16 need no NumPy
        host = HostBuffer(result.dtype, result.shape)
        result.to_host(out=host)
        result.free()
        result = host
    if isinstance(result, HostBuffer):
        value = result.values()[0]
        return value if result.dtype.is_float else int(value)
    return result.item() if hasattr(result, "item") else result[0]  # NumPy/PyTorch, or array.array


class Tensor:
    """Backend-owned memory of one dtype and shape (device memory on CUDA). ``Buffer`` is its old name.

    Exports ``__dlpack__``/``__dlpack_device__`` and ``__cuda_array_interface__`` (CUDA), so
    ``torch.from_dlpack(t)``, ``cupy.asarray(t)``, ``jax.dlpack.from_dlpack(t)`` and ``np.from_dlpack(t)``
    (CPU) share its memory. Free it, or let it go: its memory is released when nothing holds it.
    """

    def __init__(self, backend: Backend, buffer_id: int, shape: int | tuple[int, ...], dtype: Any = "float32") -> None:
        self.backend = backend
        self.id = buffer_id
        self.shape: tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        self.dtype: dtypes.DType = dtypes.from_name(dtype)
        self._core = backend._core
        self._template: Any = None
        self._exported = False
        self._dead: str | None = None
        self._desc: abi.CTensor | None = None
        self._as_arg: _Arg | None = None
        self._fast: tuple | None = None  # (address, dtype row, device, shape) for the C dispatcher, with _as_arg
        self._finalizer: _Finalizer | None = None  # set by _own(): only Backend.empty() owns memory

    def _own(self) -> None:
        self._finalizer = _Finalizer(self, self._core.release, self.id)
        self._core.live[self.id] = _weakref.ref(self)

    __copy__ = __deepcopy__ = __reduce_ex__ = __reduce__ = _no_copy

    @property
    def n(self) -> int:
        return signature.numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.n * self.dtype.itemsize

    @property
    def device(self) -> tuple[int, int]:
        return (self.backend.device_type, self.backend.device_index)

    def _handle(self) -> int:
        """The C handle this tensor's memory lives in; refuses a freed tensor, or one its closed Backend
        freed. An exported tensor outlives close(): it can still be read and exported again."""
        if self._dead == "closed":
            raise BackendClosedError("this tensor's backend is closed")
        if self._dead:
            raise BufferError_(f"tensor {self.id:#x} was freed: it is not a live buffer", abi.E_BAD_BUFFER)
        core = self._core
        if core.closed and core.handle is not None and core.forked_from is None and self._exported:
            return core.handle
        return self.backend._live_handle()

    def _descriptor(self) -> abi.CTensor:
        if self._desc is None:
            desc = abi.CTensor()
            core = self._core
            with core.lock:
                self.backend._check(core.lib.tensor(self._handle(), self.id, ctypes.byref(desc)), "tensor")
            self._check_descriptor(desc)
            self._desc = desc
        return self._desc

    def _check_descriptor(self, desc: abi.CTensor) -> None:
        """What the backend says of its own tensor is what was allocated (ndim read before the shape array)."""
        said = (desc.dtype.code, desc.dtype.bits, desc.dtype.lanes, desc.ndim)
        same = said == (self.dtype.code, self.dtype.bits, 1, len(self.shape)) and (bool(desc.shape) or not self.shape)
        if same:
            same = tuple(desc.shape[i] for i in range(desc.ndim)) == self.shape and not desc.strides
        if same and self.nbytes:
            try:
                operands.check_span(int(desc.data or 0) + int(desc.byte_offset), self.nbytes, "tensor", "the backend")
            except InvalidInputError:
                same = False
        if not same:
            raise BackendError(
                f"tensor: the backend describes tensor {self.id:#x} otherwise than it was allocated "
                f"({self.dtype.name}{list(self.shape)}); a bug of the {self.backend.name} backend",
                abi.E_INVALID_ARGUMENT,
            )

    def _arg(self, backend: Backend, name: str) -> _Arg:
        if backend is not self.backend:
            raise InvalidInputError(f"{name}: a tensor of another backend instance; copy it through the host")
        self._handle()
        arg = self._as_arg
        if arg is None:  # a tensor's address, dtype and shape never change: one Arg for its life
            d = self._descriptor()
            addr = int(d.data or 0) + int(d.byte_offset)
            # (no reference back to the tensor: a cycle would keep its memory until the next gc)
            arg = _Arg(addr, (d.device_type, d.device_id), self.dtype, self.shape, None, None, self.nbytes)
            arg.host = self.backend.device_type != dtypes.DEVICE_CUDA  # the backend's side, whatever C calls it
            arg.stream = self._core.stream  # every write of a tensor is ordered on the instance stream (run())
            arg.spec = (*arg.spec, "resident")  # a plan knows its resident operands from its key
            self._as_arg = arg
            self._fast = (addr, fastpath.ROW[self.dtype], *arg.device, self.shape)
        return arg

    @property
    def data_ptr(self) -> int:
        """The address of the first element (a device pointer on CUDA)."""
        self._handle()  # never the address of freed memory
        return int(self._descriptor().data or 0)

    # ---- host copies
    def _host_copy(self, arg: _Arg, step: str, name: str) -> None:
        """Copies between this tensor and a host array of the same dtype and element count (``step``:
        upload or download, the C entry point and the message's first word)."""
        if arg.dtype is not self.dtype or signature.numel(arg.shape) != self.n:
            raise InvalidInputError(
                f"{step}: {name} has {signature.numel(arg.shape)} elements of {arg.dtype.name}{list(arg.shape)}, "
                f"tensor has {self.n} of {self.dtype.name}{list(self.shape)}"
            )
        core = self._core
        with core.lock:
            copy = core.lib.upload if step == "upload" else core.lib.download
            self.backend._check(copy(self._handle(), self.id, arg.addr, self.nbytes), step)

    def _upload_arg(self, src: _Arg) -> None:
        self._host_copy(src, "upload", "source")

    def upload(self, x: Any) -> None:
        """Copies a host array of the same dtype and element count into this tensor."""
        src = self.backend._arg(x, "upload source", False, None)
        if not src.host:
            raise InvalidInputError("upload: the source must be a host array")
        self._upload_arg(src)

    def to_host(self, out: Any = None) -> Any:
        """Downloads into ``out`` (or a new host array like the source) and returns it."""
        result = out if out is not None else _new_host(self._template, self.dtype, self.shape)
        dst = self.backend._arg(result, "out", True, None)
        if not dst.host:
            raise InvalidInputError("to_host: out must be a host array")
        self._host_copy(dst, "download", "out")
        return result

    def free(self) -> None:
        """Frees the memory now (an exported tensor: when its consumers let go). Later use is an error."""
        core = self._core
        with core.lock:
            if self._dead == "closed":
                raise BackendClosedError("this tensor's backend is closed")
            self._handle()
            if self._finalizer is None:
                raise BufferError_(
                    f"this Tensor object does not own buffer {self.id:#x}: it is not a live buffer of it"
                )
            self._dead = "freed"
            if not self._exported:
                self._finalizer()  # frees now, exactly once

    # ---- export
    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(
        self, *, stream: Any = None, max_version: tuple[int, int] | None = None, dl_device: Any = None, copy: Any = None
    ) -> Any:
        from . import dlpack

        versioned = dlpack.wants_versioned(max_version)  # every argument checked before anything is done
        if copy:
            raise BufferError("cuplug tensors export without a copy only (copy=True is not supported)")
        if dl_device is not None and operands.dlpack_device(_Device(dl_device), "__dlpack__ dl_device") != self.device:
            raise BufferError(f"cuplug cannot export to device {shown(dl_device)}; this tensor is on {self.device}")
        if stream is not None:
            given, stream = stream, operands.as_index(stream)
            if stream is None:
                raise InvalidInputError(f"__dlpack__: stream must be None or an integer, got {shown(given)}")
        desc = self._descriptor()
        self._handle()
        if stream is not None and stream < -1:
            raise BufferError(f"stream {stream} is no CUDA stream (DLPack: None, -1, 1, 2 or a stream handle)")
        if self.backend.device_type == dtypes.DEVICE_CUDA and stream != -1:
            # The consumer's stream (None: the legacy default stream) waits for the work that wrote us.
            # Every write of a tensor is ordered on the instance stream (run()), so that is what it waits for.
            waiter = _c_stream(_CUDA_LEGACY_STREAM if stream is None else stream)
            core = self._core
            if waiter != _c_stream(core.stream):
                with core.lock:
                    self.backend._check(core.lib.stream_wait(self._handle(), waiter, 0), "__dlpack__")
        self._exported = True
        return dlpack.export(self, int(desc.data or 0), self.device, desc.dtype, self.shape, versioned)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self.backend.device_type != dtypes.DEVICE_CUDA:
            raise AttributeError("a CPU tensor has no __cuda_array_interface__ (use __dlpack__ or to_host())")
        if not self.dtype.typestr:
            raise AttributeError(f"__cuda_array_interface__ has no {self.dtype.name}; use __dlpack__")
        self._handle()  # never the address of freed memory
        desc = self._descriptor()
        self._exported = True
        return {
            "shape": self.shape,
            "typestr": self.dtype.typestr,
            "data": (int(desc.data or 0), False),
            "strides": None,
            "version": 3,
            "stream": _c_stream(self._core.stream),  # the instance stream, never 0: CAI v3 reserves it
        }

    def __repr__(self) -> str:
        return f"<cuplug.Tensor id={self.id:#x} {self.dtype.name}{list(self.shape)} on {self.backend.variant}>"


Buffer = Tensor
