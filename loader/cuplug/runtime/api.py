"""The Python face of a loaded backend: ``Backend`` and its resident ``Tensor`` (alias ``Buffer``).

It knows only the C ABI v2 (``library.BackendLibrary``), never CUDA. Operands are read
without a copy: cuplug Tensors, anything with ``__dlpack__`` (PyTorch, CuPy, JAX,
NumPy), ``__cuda_array_interface__`` (CuPy, Numba) or the buffer protocol
(NumPy, ``array.array``, memoryview). Every call is checked against the op's
signature (``Backend.ops``) before it reaches C, and outputs are allocated from it.

Its parts, one job each: operand import (``arguments`` picks the importer, ``operands`` checks every
field), streams (``streams``), the prepared call (``plan``) and its C repetition (``fastpath``), results
(``results``), the instance and its lifetime (``instance``), resident tensors (``tensor``).

Lifetimes: a Tensor's memory lives while the Tensor object or a DLPack consumer
of it does, even after ``Backend.close()``; the instance is destroyed when the
Backend is closed (or unreachable) and its last exported tensor has gone.
"""

from __future__ import annotations

import ctypes

from ..contract import abi, dtypes, jsontext
from ..contract.errors import (
    BackendClosedError,
    BackendError,
    BufferError_,
    InvalidInputError,
    OutOfMemoryError,
    UnknownOpError,
    shown,
)
from . import arguments, fastpath, operands, plan, signature
from .instance import _Core, _cores, _Finalizer, _no_copy
from .operands import Arg
from .operands import root as producer
from .results import HostKind, framework_empty, host_bytes, host_result, refuse_overlap, scalar
from .streams import NO_STREAM, c_stream, framework_stream, stream_handle
from .tensor import Buffer, Tensor

__all__ = ["Backend", "Buffer", "Tensor", "stream_handle"]
_refuse_overlap = refuse_overlap  # (the names tests and bench/dispatch_parts.py knew)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from .library import BackendLibrary


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
        self._plans: dict[tuple[Any, ...], plan.Plan] = {}
        fast = fastpath.dispatcher(self, Backend.run, Tensor)
        if fast is not None:  # run() repeated in C once learned; Backend.run(b, ...) is the whole path
            self.run = fast  # type: ignore[method-assign]  # this instance's run() is the C dispatcher

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
    def _arg(self, obj: Any, name: str, writable: bool, handshake: int | None) -> Arg:
        return arguments.read(self, obj, name, writable, handshake)

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
        out_args: list[Arg] = []
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
            refuse_overlap(sig, args, out_args)
            made_by = "out"
        elif p.host and not resident:
            # made like the caller's own array, not like a resident tensor beside it (CPU backend)
            like = next((x for x in inputs if not isinstance(x, Tensor)), None)
            results = [
                host_result(like, dt, shape, bool(o.shape_rule.get("scalar")))
                for (dt, shape), o in zip(p.out_specs, sig.outputs, strict=True)
            ]
            # array.array holds a flat copy of any shape: the plan's descriptor carries the op's shape.
            out_args = [self._arg(r, f"{op}: out", True, None) for r in results]
            made_by = "host"
        else:
            made = framework_empty(inputs, p.out_specs)  # the caller's allocator, on its stream
            if made is not None:
                results, made_by, like = made
                out_args = [self._arg(r, f"{op}: out", True, launch) for r in results]
            else:
                made_by = "backend"
                owned = [self.empty(shape, dt) for dt, shape in p.out_specs]
                results = list(owned)
                out_args = [t._arg(self, f"{op}: out") for t in owned]
        c_launch = c_stream(launch) if launch is not None else 0
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
                        self._check(core.lib.stream_wait(handle, c_launch, c_stream(a.stream)), f"{op}: stream order")
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
                    ctypes.c_uint64(c_launch) if c_launch else NO_STREAM,
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
                scalar(r) if o.shape_rule.get("scalar") else r for r, o in zip(results, sig.outputs, strict=True)
            ]
        fast = self.__dict__.get("run")  # the C dispatcher (fastpath.py): it repeats this call from now on
        if fast is not None:
            fastpath.learn(fast, sig, p, op, inputs, out, stream, given, made_by, like)
        return results[0] if len(results) == 1 else tuple(results)

    def _plan(
        self,
        sig: signature.OpSignature,
        args: list[Arg],
        out_args: list[Arg] | None,
        inputs: tuple[Any, ...],
        attrs: dict[str, Any],
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

    def _framework_launch(self, inputs: tuple[Any, ...], out: Any) -> int | None:
        """The current stream of the first PyTorch CUDA tensor or CuPy array among the operands, or None."""
        outs = (out if isinstance(out, (tuple, list)) else (out,)) if out is not None else ()
        for x in (*inputs, *outs):
            root = producer(x)
            if root == "cupy" or (root == "torch" and getattr(x, "is_cuda", True)):
                found = framework_stream(x, self.device_index)
                if found is not None:
                    return found
        return None

    def _check_room(self, sig: signature.OpSignature, out_specs: list[Any], on_host: bool) -> None:
        """Outputs about to be allocated fit the memory they are allocated in, checked before anything is:
        an output sized by a huge attribute (or a lying input's shape) is an OutOfMemoryError naming it."""
        room = host_bytes() if on_host or self._device_bytes is None else self._device_bytes
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
        t._template = HostKind.of(x)
        t._upload_arg(src)
        return t

    def sync(self) -> None:
        """Waits for the work queued on the instance's stream."""
        with self._core.lock:
            self._check(self._core.lib.sync(self._live_handle()), "sync")
