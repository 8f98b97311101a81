"""Operand import: the buffer protocol, DLPack and ``__cuda_array_interface__``, read in place.

Everything a producer says is a claim until it is checked, and it is checked before it is used:
the number of dimensions before the shape array is read, every extent and the byte size with
Python integers (no overflow), the address range against the user address space, versions and
types of every field. A lie ends in an :class:`InvalidInputError` naming the operand and the field;
nothing reaches C that C could not use safely. The pointer of a buffer is the one its export gave
(``PyObject_GetBuffer`` of that very export), never an attribute of the object beside it.

What cannot be checked without reading the memory: that a producer owns the bytes it names. A
DLPack or CAI producer that names memory it does not own is believed, as every consumer of these
protocols believes it (docs/abi-v2.md, "Operands").
"""

from __future__ import annotations

import ctypes
import os

from ..contract import abi, dtypes
from ..contract.errors import InvalidInputError, cut, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeGuard

    # What a prepared call is keyed on: (dtype, shape, device); a backend's resident Tensor adds "resident".
    Spec = (
        tuple[dtypes.DType, tuple[int, ...], tuple[int, int]]
        | tuple[dtypes.DType, tuple[int, ...], tuple[int, int], str]
    )

# No 64-bit Linux maps user memory at or above 2^56 (x86-64 with 5-level paging ends there, aarch64 at
# 2^52), nor does CUDA's unified address space: an operand reaching past it is a lie, not memory.
ADDRESS_END = 1 << 56
CAI_VERSIONS = range(4)  # __cuda_array_interface__ versions 0..3


class Arg:
    """One tensor argument, checked: the first element's address, its device, dtype and shape, and what keeps
    its memory valid during the call. ``spec`` is what a prepared call (``plan.Plan``) is keyed on."""

    __slots__ = ("addr", "device", "dtype", "host", "keep", "nbytes", "obj", "shape", "spec", "stream")

    def __init__(
        self,
        addr: int,
        device: tuple[int, int],
        dt: dtypes.DType,
        shape: tuple[int, ...],
        keep: Any,
        obj: Any,
        nbytes: int,
    ) -> None:
        self.addr = addr
        self.device = device
        self.dtype = dt
        self.shape = shape
        self.host = device[0] in dtypes.HOST_DEVICES
        self.keep = keep
        self.obj = obj
        self.nbytes = nbytes
        self.spec: Spec = (dt, shape, device)
        self.stream: int | None = None  # a producer stream that the launch must wait for (CAI v3, resident)


def root(obj: Any) -> str:
    """The top package of the module that defined ``obj``'s type ("torch", "cupy"); "" when it names none."""
    module = getattr(type(obj), "__module__", None)
    return module.partition(".")[0] if isinstance(module, str) else ""


def is_int(value: object) -> TypeGuard[int]:
    """An integer that is not a bool (``True`` is no extent, no pointer and no stream)."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_index(value: object) -> int | None:
    """An integer (``operator.index``: NumPy's too) that is not a bool, or None."""
    if isinstance(value, bool):
        return None
    try:
        index: int = value.__index__()  # type: ignore[attr-defined]  # any object: AttributeError when it has none
        return index
    except (AttributeError, TypeError):
        return None


def c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    if strides is None or 0 in shape:  # an empty tensor has no layout to get wrong
        return True
    expect = 1
    for extent, stride in zip(reversed(shape), reversed(strides), strict=True):
        if extent != 1 and stride != expect:
            return False
        expect *= extent
    return True


def not_contiguous(name: str) -> InvalidInputError:
    return InvalidInputError(
        f"{name} is not C-contiguous; pass a contiguous copy (x.contiguous() in PyTorch, np.ascontiguousarray(x))"
    )


def extents(dims: Any, name: str, source: str) -> tuple[int, ...]:
    """A producer's shape: a sequence of at most MAX_NDIM non-negative integers (bools are not)."""
    try:
        shape = tuple(dims)
    except TypeError:
        raise InvalidInputError(f"{name}: {source} gives the shape {shown(dims)}, which is not a sequence") from None
    if len(shape) > abi.MAX_NDIM:
        raise InvalidInputError(f"{name}: {source} gives {len(shape)} dimensions; cuplug takes at most {abi.MAX_NDIM}")
    if not all(is_int(d) for d in shape):
        raise InvalidInputError(f"{name}: {source} gives the shape {shown(shape)}, whose extents are not all integers")
    if any(d < 0 for d in shape):
        raise InvalidInputError(f"{name}: {source} gives the shape {list(shape)}, with a negative extent")
    return shape


def byte_size(shape: tuple[int, ...], itemsize: int, name: str, source: str) -> int:
    """numel * itemsize in Python integers; a size no address space holds is refused."""
    n = itemsize
    for d in shape:
        n *= d
    if n >= ADDRESS_END:
        raise InvalidInputError(
            f"{name}: {source} claims {list(shape)} elements of {itemsize} bytes ({n} bytes), more than any "
            "address space holds: the producer's shape is wrong"
        )
    return n


def check_span(addr: int, nbytes: int, name: str, source: str) -> None:
    """The first element's address and the bytes after it: inside the user address space, never NULL when
    there is anything to read."""
    if not 0 <= addr < ADDRESS_END or addr + nbytes > ADDRESS_END:
        raise InvalidInputError(
            f"{name}: {source} names the address {addr:#x} (+{nbytes} bytes), outside any process's memory"
        )
    if addr == 0 and nbytes:
        raise InvalidInputError(f"{name}: {source} gives a NULL data pointer for {nbytes} bytes")


_libc = ctypes.CDLL(None, use_errno=True)
_msync = _libc.msync
_msync.argtypes, _msync.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
_MS_ASYNC = 1  # a no-op on Linux since 2.6.19 but for its check: ENOMEM where any page is unmapped
_ENOMEM = 12
_PAGE = os.sysconf("SC_PAGE_SIZE")


def check_mapped(addr: int, nbytes: int, name: str, source: str) -> None:
    """Host memory a producer names (a DLPack capsule's): every page of it mapped in this process, so a
    lying shape or pointer is an error here instead of a segfault in C. One system call, whatever the size
    (the kernel walks its mappings, not the pages)."""
    if nbytes == 0:
        return
    start = addr & ~(_PAGE - 1)
    if _msync(start, addr + nbytes - start, _MS_ASYNC) != 0 and ctypes.get_errno() == _ENOMEM:
        raise InvalidInputError(
            f"{name}: {source} names {nbytes} bytes at {addr:#x}, which are not (all) memory of this process: "
            "the producer's pointer, offset or shape is wrong"
        )


# ---- the buffer protocol


class _PyBuffer(ctypes.Structure):
    """CPython's Py_buffer (stable ABI since 3.11): what an export hands out, its pointer included."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes, _get_buffer.restype = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int], ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes, _release_buffer.restype = [ctypes.POINTER(_PyBuffer)], None
_PYBUF_SIMPLE, _PYBUF_WRITABLE = 0, 1


class _Export:
    """One buffer export of a memoryview (itself one export of the operand): its pointer is the bytes the
    operand exported, read-only or not. Released when the call has let go of the operand."""

    __slots__ = ("pb", "view")

    def __init__(self, view: memoryview, writable: bool) -> None:
        self.view = view
        pb = _PyBuffer()
        _get_buffer(view, ctypes.byref(pb), _PYBUF_WRITABLE if writable else _PYBUF_SIMPLE)  # raises on failure
        self.pb = pb

    @property
    def pointer(self) -> int:
        return int(self.pb.buf or 0)

    def __del__(self) -> None:
        pb = getattr(self, "pb", None)  # None: never exported (__init__ raised), or released already
        if pb is not None:
            del self.pb  # released once, whoever calls again
            if _release_buffer is not None:  # None: the interpreter is tearing the module down
                _release_buffer(ctypes.byref(pb))


def from_memoryview(obj: Any, name: str, writable: bool, view: memoryview | None = None) -> Arg:
    """A buffer-protocol operand (``view``: its export, if the caller has made it); TypeError (for the caller
    to word) when ``obj`` exports no buffer."""
    if view is None:
        view = memoryview(obj)
    dt = dtypes.BY_FORMAT.get(view.format)
    if dt is None or dt.itemsize != view.itemsize:
        raise InvalidInputError(f"{name}: buffer format {shown(view.format)} is not a dtype cuplug knows")
    if not view.c_contiguous:
        raise not_contiguous(name)
    if view.readonly and writable:
        raise InvalidInputError(f"{name}: output array is read-only")
    shape = tuple(view.shape or ()) if view.ndim else ()
    nbytes = view.nbytes
    if nbytes == 0:
        keep: Any = view
        ptr = 0
    elif not view.readonly:  # ctypes holds the view's own export: its address is the exported bytes
        keep = ctypes.c_char.from_buffer(view)
        ptr = ctypes.addressof(keep)
        check_span(ptr, nbytes, name, "its buffer")
    else:  # ctypes refuses read-only memory: the same export, through the C API (0.7 us more, measured)
        try:
            keep = _Export(view, writable)
        except BufferError as exc:  # the exporter refused a second look at its own bytes
            raise InvalidInputError(f"{name}: its buffer export failed: {exc}") from None
        ptr = keep.pointer
        check_span(ptr, nbytes, name, "its buffer")
    return Arg(ptr, (dtypes.DEVICE_CPU, 0), dt, shape, keep, obj, nbytes)


# ---- PyTorch tensors, read through their own accessors (its __dlpack__ costs microseconds a call)

_TORCH_DTYPES: dict[Any, dtypes.DType] = {}


def torch_dtypes(torch: Any) -> dict[Any, dtypes.DType]:
    """torch.float16 -> cuplug's float16, for every dtype both know (PyTorch spells them as NumPy does)."""
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({getattr(torch, d.name): d for d in dtypes.TABLE if hasattr(torch, d.name)})
    return _TORCH_DTYPES


class TorchReader:
    """PyTorch's own accessors, taken once from its C base class (``torch._C.TensorBase``): a value set on a tensor
    instance (``x.data_ptr = lambda: 0xdead``) or a patch of ``torch.Tensor`` never answers for PyTorch, and no
    Python code of anyone's runs while an operand is read (another operand's memory cannot be freed meanwhile).
    A stand-in module without that base class (tests) is read through plain attributes."""

    GETSETS = ("dtype", "layout", "is_nested", "requires_grad", "is_cuda", "is_cpu", "device", "shape")
    METHODS = ("is_neg", "is_conj", "is_contiguous", "get_device", "numel", "data_ptr")

    def __init__(self, torch: Any) -> None:
        c = getattr(torch, "_C", None)
        base = getattr(c, "TensorBase", None) or getattr(c, "_TensorBase", None)
        own = getattr(base, "__dict__", {})
        self.native = all(n in own for n in self.GETSETS + self.METHODS)
        self.getsets = {n: own[n] if self.native else _attr_reader(n) for n in self.GETSETS}
        self.methods = {n: own[n] if self.native else _method_reader(n) for n in self.METHODS}
        self.strided = getattr(torch, "strided", None)

    def get(self, t: Any, name: str) -> Any:
        d = self.getsets[name]
        return d.__get__(t, type(t)) if self.native else d(t)

    def call(self, t: Any, name: str) -> Any:
        return self.methods[name](t)


def _attr_reader(name: str) -> Any:
    return lambda t: getattr(t, name)


def _method_reader(name: str) -> Any:
    return lambda t: getattr(t, name)()


_TORCH_READER: dict[int, TorchReader] = {}


def torch_reader(torch: Any) -> TorchReader:
    """The reader of this torch module (made once per module object: a test's stand-in differs from the real)."""
    found = _TORCH_READER.get(id(torch))
    if found is None or found.strided is not getattr(torch, "strided", None):
        found = _TORCH_READER[id(torch)] = TorchReader(torch)
    return found


def from_torch(t: Any, name: str, writable: bool) -> Arg:
    """A ``torch.Tensor``: what its DLPack export would say (data_ptr() is the first element, storage offset
    included), with the refusals of that export: no sparse, mkldnn or nested layout, no lazily negated or
    conjugated view, no tensor that requires grad as an output; strided ones refused as everywhere. Every fact
    through PyTorch's own accessors (TorchReader), never the instance's."""
    import sys

    torch = sys.modules["torch"]
    r = torch_reader(torch)
    off = getattr(getattr(torch, "_C", None), "DisableTorchFunction", None)
    if r.native and off is not None:  # a TorchFunctionMode would answer (and run code) for PyTorch's accessors
        with off():
            return _from_torch(t, name, writable, r, torch)
    return _from_torch(t, name, writable, r, torch)


def _from_torch(t: Any, name: str, writable: bool, r: TorchReader, torch: Any) -> Arg:
    layout = r.get(t, "layout")
    if layout is not r.strided or r.get(t, "is_nested"):
        raise InvalidInputError(f"{name}: a PyTorch tensor of layout {layout}: pass a dense one (x.to_dense())")
    tdt = r.get(t, "dtype")
    dt = (_TORCH_DTYPES or torch_dtypes(torch)).get(tdt)
    if dt is None:
        raise InvalidInputError(
            f"{name}: PyTorch dtype {tdt} is not a dtype cuplug knows ({', '.join(dtypes.BY_NAME)})"
        )
    if r.call(t, "is_neg") or r.call(t, "is_conj"):
        raise InvalidInputError(f"{name}: a lazily negated/conjugated view; pass x.resolve_neg() / x.resolve_conj()")
    if writable and r.get(t, "requires_grad"):
        raise InvalidInputError(
            f"{name}: an out= tensor that requires grad; pass one under torch.no_grad() or detach()"
        )
    if not r.call(t, "is_contiguous"):
        raise not_contiguous(name)
    device = r.get(t, "device")
    if device.type == "cuda":
        where = (dtypes.DEVICE_CUDA, device.index or 0)
    elif device.type == "cpu":
        where = (dtypes.DEVICE_CPU, 0)
    else:
        raise InvalidInputError(f"{name} is on PyTorch device {device}, neither the host nor CUDA")
    shape = tuple(r.get(t, "shape"))
    nbytes = r.call(t, "numel") * dt.itemsize
    addr = r.call(t, "data_ptr")
    check_span(addr, nbytes, name, "the tensor")
    # the storage itself is kept for the call: another thread's x.set_(...) cannot free the bytes under it
    keep = (t, t.untyped_storage()) if r.native else t
    return Arg(addr, where, dt, shape, keep, t, nbytes)


# ---- DLPack


def dlpack_device(obj: Any, name: str) -> tuple[int, int]:
    """``__dlpack_device__()``, checked: a pair of integers."""
    try:
        dev = obj.__dlpack_device__()
    except Exception as exc:
        raise InvalidInputError(f"{name}: __dlpack_device__() failed: {type(exc).__name__}: {cut(str(exc))}") from None
    try:
        if isinstance(dev, (str, bytes)):
            raise TypeError
        dev_type, dev_id = dev
        dev_type, dev_id = dev_type.__index__(), dev_id.__index__()  # DLDeviceType is an IntEnum in some producers
    except (TypeError, ValueError, AttributeError):
        dev_type = dev_id = -1
    if not (0 <= dev_type < 1 << 31 and 0 <= dev_id < 1 << 31):
        raise InvalidInputError(f"{name}: __dlpack_device__() gave {shown(dev)}, not a (device type, device id) pair")
    return dev_type, dev_id


def from_dlpack_capsule(
    obj: Any, capsule: Any, name: str, writable: bool, device: tuple[int, int] | None = None
) -> Arg:
    """A DLPack operand; ``device``: what ``__dlpack_device__()`` said, which the capsule must repeat."""
    from . import dlpack  # capsules only when an operand has one: load() itself needs none

    imported = dlpack.Imported(capsule, name)
    t = imported.tensor
    if writable and imported.read_only:
        raise InvalidInputError(f"{name}: the producer marks this tensor read-only")
    dt = dtypes.BY_DLPACK.get((t.dtype.code, t.dtype.bits))
    if dt is None or t.dtype.lanes != 1:
        raise InvalidInputError(
            f"{name}: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes) is not a dtype "
            f"cuplug knows ({', '.join(dtypes.BY_NAME)})"
        )
    if t.device_type not in dtypes.HOST_DEVICES and t.device_type != dtypes.DEVICE_CUDA:
        raise InvalidInputError(f"{name}: DLPack device type {t.device_type} is neither the host nor CUDA")
    if device is not None and (t.device_type, t.device_id) != device:
        raise InvalidInputError(
            f"{name}: its capsule is on device {(t.device_type, t.device_id)}, __dlpack_device__() said {device}"
        )
    ndim = t.ndim
    if not 0 <= ndim <= abi.MAX_NDIM:  # before the shape array is read: its length is ndim, as claimed
        raise InvalidInputError(f"{name}: DLPack gives ndim {ndim}; cuplug takes 0 to {abi.MAX_NDIM} dimensions")
    if ndim and not t.shape:
        raise InvalidInputError(f"{name}: DLPack gives {ndim} dimensions and a NULL shape pointer")
    shape = extents([t.shape[i] for i in range(ndim)], name, "DLPack")
    nbytes = byte_size(shape, dt.itemsize, name, "DLPack")
    strides = tuple(t.strides[i] for i in range(ndim)) if t.strides else None
    if not c_contiguous(shape, strides):
        raise not_contiguous(name)
    base, offset = int(t.data or 0), int(t.byte_offset)
    if base == 0 and offset:
        raise InvalidInputError(f"{name}: DLPack gives a NULL data pointer with byte_offset {offset}")
    check_span(base + offset, nbytes, name, "DLPack")
    host = t.device_type in dtypes.HOST_DEVICES
    if host:
        check_mapped(base + offset, nbytes, name, "DLPack")
    return Arg(base + offset if base else 0, (t.device_type, t.device_id), dt, shape, imported, obj, nbytes)


# ---- __cuda_array_interface__


def _cai_field(cai: dict[str, Any], key: str, name: str, check: Any, want: str) -> Any:
    value = cai.get(key)
    if not check(value):
        raise InvalidInputError(f"{name}: __cuda_array_interface__ {key!r} is {shown(value)}; it must be {want}")
    return value


def from_cai(obj: Any, name: str, writable: bool, device: int) -> Arg:
    try:
        cai = obj.__cuda_array_interface__
    except Exception as exc:
        raise InvalidInputError(
            f"{name}: reading __cuda_array_interface__ failed: {type(exc).__name__}: {cut(str(exc))}"
        ) from None
    if not isinstance(cai, dict):
        raise InvalidInputError(f"{name}: __cuda_array_interface__ is a {type(cai).__name__}, not a dict")
    _cai_field(cai, "version", name, lambda v: is_int(v) and v in CAI_VERSIONS, "0, 1, 2 or 3")
    typestr = _cai_field(cai, "typestr", name, lambda v: isinstance(v, str), "a type string such as '<f4'")
    dt = dtypes.BY_TYPESTR.get(typestr)
    if dt is None:
        raise InvalidInputError(f"{name}: __cuda_array_interface__ typestr {shown(typestr)} is not supported")
    if cai.get("mask") is not None:
        raise InvalidInputError(f"{name}: masked arrays are not supported")
    data = _cai_field(
        cai,
        "data",
        name,
        lambda v: (
            isinstance(v, (tuple, list)) and len(v) == 2 and (v[0] is None or is_int(v[0])) and isinstance(v[1], bool)
        ),
        "a (pointer, read-only flag) pair",
    )
    ptr, read_only = int(data[0] or 0), data[1]
    if writable and read_only:
        raise InvalidInputError(f"{name}: the producer marks this array read-only")
    shape = extents(
        _cai_field(cai, "shape", name, lambda v: isinstance(v, (tuple, list)), "a tuple"),
        name,
        "__cuda_array_interface__",
    )
    nbytes = byte_size(shape, dt.itemsize, name, "__cuda_array_interface__")
    check_span(ptr, nbytes, name, "__cuda_array_interface__")
    strides = _cai_field(
        cai,
        "strides",
        name,
        lambda v: v is None or (isinstance(v, (tuple, list)) and all(is_int(s) for s in v)),
        "None or a tuple of integers",
    )
    if strides is not None and len(strides) != len(shape):
        raise InvalidInputError(
            f"{name}: __cuda_array_interface__ gives {len(strides)} strides for {len(shape)} dimensions"
        )
    if strides is not None and (
        any(s % dt.itemsize for s in strides) or not c_contiguous(shape, tuple(s // dt.itemsize for s in strides))
    ):
        raise not_contiguous(name)
    stream = _cai_field(cai, "stream", name, lambda v: v is None or is_int(v), "None or a stream handle")
    if stream is not None and stream < 0:
        raise InvalidInputError(f"{name}: __cuda_array_interface__ stream {stream} is no CUDA stream")
    # CAI names no device: the backend checks the pointer's device and context before any launch.
    arg = Arg(ptr, (dtypes.DEVICE_CUDA, device), dt, shape, (obj,), obj, nbytes)
    arg.stream = stream
    return arg
