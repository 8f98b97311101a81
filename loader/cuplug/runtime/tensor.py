"""Backend-owned memory: the resident ``Tensor`` (alias ``Buffer``), its lifetime and its exports (DLPack, CAI)."""

from __future__ import annotations

import _weakref
import ctypes

from ..contract import abi, dtypes
from ..contract.errors import BackendClosedError, BackendError, BufferError_, InvalidInputError, shown
from . import fastpath, operands, signature
from .instance import _Finalizer, _no_copy
from .operands import Arg
from .results import new_host
from .streams import CUDA_LEGACY_STREAM, c_stream

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Backend = Any  # (the module that defines it imports this one)

    from .instance import _Core


class _Device:
    """A consumer's ``dl_device`` in the shape ``operands.dlpack_device`` reads."""

    __slots__ = ("pair",)

    def __init__(self, pair: Any) -> None:
        self.pair = pair

    def __dlpack_device__(self) -> Any:
        return self.pair


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
        self._core: _Core = backend._core
        self._template: Any = None
        self._exported = False
        # None while its memory lives, else "freed" or "closed": a list the finalizer shares, so a tensor brought
        # back to life by a __del__ after the collector freed its memory still knows (the C dispatcher reads it too)
        self._life: list[str | None] = [None]
        self._desc: abi.CTensor | None = None
        self._as_arg: Arg | None = None
        # (address, dtype row, device type, device id, shape) for the C dispatcher, with _as_arg
        self._fast: tuple[int, int, int, int, tuple[int, ...]] | None = None
        self._finalizer: _Finalizer | None = None  # set by _own(): only Backend.empty() owns memory

    def _own(self) -> None:
        self._finalizer = _Finalizer(self, self._core.release, self.id, self._life)
        self._core.live[self.id] = _weakref.ref(self)

    @property
    def _dead(self) -> str | None:
        return self._life[0]

    @_dead.setter
    def _dead(self, why: str | None) -> None:
        self._life[0] = why

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
        handle: int = self.backend._live_handle()  # (Backend is Any here: see TYPE_CHECKING above)
        return handle

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

    def _arg(self, backend: Backend, name: str) -> Arg:
        if backend is not self.backend:
            raise InvalidInputError(f"{name}: a tensor of another backend instance; copy it through the host")
        self._handle()
        arg = self._as_arg
        if arg is None:  # a tensor's address, dtype and shape never change: one Arg for its life
            d = self._descriptor()
            addr = int(d.data or 0) + int(d.byte_offset)
            # (no reference back to the tensor: a cycle would keep its memory until the next gc)
            arg = Arg(addr, (d.device_type, d.device_id), self.dtype, self.shape, None, None, self.nbytes)
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
    def _host_copy(self, arg: Arg, step: str, name: str) -> None:
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

    def _upload_arg(self, src: Arg) -> None:
        self._host_copy(src, "upload", "source")

    def upload(self, x: Any) -> None:
        """Copies a host array of the same dtype and element count into this tensor."""
        src = self.backend._arg(x, "upload source", False, None)
        if not src.host:
            raise InvalidInputError("upload: the source must be a host array")
        self._upload_arg(src)

    def to_host(self, out: Any = None) -> Any:
        """Downloads into ``out`` (or a new host array like the source) and returns it."""
        result = out if out is not None else new_host(self._template, self.dtype, self.shape)
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
            waiter = c_stream(CUDA_LEGACY_STREAM if stream is None else stream)
            core = self._core
            if waiter != c_stream(core.stream):
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
            "stream": c_stream(self._core.stream),  # the instance stream, never 0: CAI v3 reserves it
        }

    def __repr__(self) -> str:
        return f"<cuplug.Tensor id={self.id:#x} {self.dtype.name}{list(self.shape)} on {self.backend.variant}>"


Buffer = Tensor
