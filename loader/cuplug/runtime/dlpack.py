"""DLPack and ``__cuda_array_interface__`` without a copy, through ctypes alone.

Import: a producer's capsule (``"dltensor"`` or ``"dltensor_versioned"``) is read
in place; its DLTensor is cuplug_tensor field for field, so the descriptor goes to
C as it is. The capsule is never renamed: the producer's deleter runs when the
capsule goes, after the call that used it.

Export: a backend-owned tensor becomes a capsule whose manager context holds the
Python tensor object, so the memory stays alive until the consumer calls the
deleter (or drops an unconsumed capsule), whatever happens to the Backend.

Why not NVIDIA's ``cuda.core`` (``StridedMemoryView``): measured in the README
("DLPack reader"); in short, its import alone costs more than cuplug's whole
decision, and this reader is a few dozen lines over a struct the ABI already has.
"""

from __future__ import annotations

import _thread
import ctypes
import os

from ..contract import abi
from ..contract.errors import InvalidInputError, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FLAG_READ_ONLY = 1  # bit 0 of DLPack 1.0's flags: a versioned tensor that must not be written

_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"
_CONSUMED = (b"used_dltensor", b"used_dltensor_versioned")  # the names a consumer gives a capsule it took
DLPACK_MAJOR = 1  # a versioned capsule of another major has another layout: refused, never read
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", abi.CTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", abi.CTensor),
    ]


# Two views of the capsule API: one over Python objects, one over raw pointers (a capsule destructor
# gets its capsule while it is being freed, and must not turn it back into an object).
_obj_api = ctypes.PyDLL(None)
_raw_api = ctypes.PyDLL(None)
_obj_api.PyCapsule_IsValid.restype = ctypes.c_int
_obj_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_obj_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_obj_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_obj_api.PyCapsule_New.restype = ctypes.py_object
_obj_api.PyCapsule_GetName.restype = ctypes.c_char_p
_obj_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_obj_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_raw_api.PyCapsule_IsValid.restype = ctypes.c_int
_raw_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_raw_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_raw_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


class Imported:
    """A producer's tensor, read in place: ``tensor`` (the DLTensor, a view into the producer's memory),
    ``read_only``; valid while this object (which holds the capsule) lives. Anything but a live DLPack
    capsule of a layout this reader knows is an InvalidInputError naming ``name``; the tensor's own
    fields are checked by ``operands``."""

    __slots__ = ("capsule", "read_only", "tensor")

    def __init__(self, capsule: Any, name: str = "operand") -> None:
        self.capsule = capsule
        if type(capsule).__name__ != "PyCapsule":  # PyCapsule_IsValid would take any object and say no
            raise InvalidInputError(f"{name}: __dlpack__() returned a {type(capsule).__name__}, not a DLPack capsule")
        if _obj_api.PyCapsule_IsValid(capsule, _VERSIONED):
            managed = DLManagedTensorVersioned.from_address(_obj_api.PyCapsule_GetPointer(capsule, _VERSIONED))
            version = (managed.version.major, managed.version.minor)
            if version[0] != DLPACK_MAJOR:  # another major has another layout: no field of it is read
                raise InvalidInputError(
                    f"{name}: its DLPack capsule is version {version[0]}.{version[1]}; cuplug reads {DLPACK_MAJOR}.x"
                )
            self.tensor = managed.dl_tensor
            self.read_only = bool(managed.flags & FLAG_READ_ONLY)
        elif _obj_api.PyCapsule_IsValid(capsule, _LEGACY):
            self.tensor = DLManagedTensor.from_address(_obj_api.PyCapsule_GetPointer(capsule, _LEGACY)).dl_tensor
            self.read_only = False
        else:
            label = _obj_api.PyCapsule_GetName(capsule)
            if label in _CONSUMED:
                raise InvalidInputError(f"{name}: its DLPack capsule was already consumed ({label.decode()!r})")
            raise InvalidInputError(
                f"{name}: __dlpack__() returned a capsule named {shown(label)}, not 'dltensor' or 'dltensor_versioned'"
            )


# ---- export
_exports: dict[int, tuple[Any, Any, Any]] = {}  # manager_ctx -> (managed struct, shape array, owner)
_exports_lock = _thread.RLock()


def _release(ctx: int) -> None:
    with _exports_lock:
        entry = _exports.pop(ctx, None)
    # Dropped outside the lock: the owner's finalizer (and any collection it triggers, which may release
    # another capsule) must not run while this thread holds the lock.
    del entry


def _renew_lock_in_child() -> None:
    global _exports_lock
    _exports_lock = _thread.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)


def _release_legacy(ptr: int) -> None:
    _release(DLManagedTensor.from_address(ptr).manager_ctx)


def _release_versioned(ptr: int) -> None:
    _release(DLManagedTensorVersioned.from_address(ptr).manager_ctx)


def _release_unconsumed(capsule: int) -> None:
    # Still carrying its own name: no consumer took it, so its tensor is ours to release.
    for name, release in ((_LEGACY, _release_legacy), (_VERSIONED, _release_versioned)):
        if _raw_api.PyCapsule_IsValid(capsule, name):
            release(_raw_api.PyCapsule_GetPointer(capsule, name))
            return


# C function pointers the consumer (or the capsule's destructor) calls; kept alive with the module.
_delete_legacy = _DELETER(_release_legacy)
_delete_versioned = _DELETER(_release_versioned)
_capsule_gone = _DELETER(_release_unconsumed)


def export(
    owner: Any,
    data: int,
    device: tuple[int, int],
    dtype: abi.CDtype,
    shape: tuple[int, ...],
    versioned: bool,
    read_only: bool = False,
) -> Any:
    """A capsule over ``data`` that keeps ``owner`` alive until the consumer's deleter call."""
    ndim = len(shape)
    shape_array = (ctypes.c_int64 * max(ndim, 1))(*shape)
    managed: Any = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    t = managed.dl_tensor
    t.data, t.device_type, t.device_id, t.ndim = data, device[0], device[1], ndim
    t.dtype = dtype
    t.shape = ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64))
    t.strides = None
    t.byte_offset = 0
    ctx = ctypes.addressof(managed)
    managed.manager_ctx = ctx
    if versioned:
        managed.version.major, managed.version.minor = 1, 0
        managed.flags = FLAG_READ_ONLY if read_only else 0
        managed.deleter = ctypes.cast(_delete_versioned, ctypes.c_void_p)
    else:
        managed.deleter = ctypes.cast(_delete_legacy, ctypes.c_void_p)
    with _exports_lock:
        _exports[ctx] = (managed, shape_array, owner)
    return _obj_api.PyCapsule_New(
        ctx, _VERSIONED if versioned else _LEGACY, ctypes.cast(_capsule_gone, ctypes.c_void_p)
    )


def wants_versioned(max_version: Any) -> bool:
    """A consumer's ``max_version``: None (a legacy capsule) or a (major, minor) pair of integers; a
    versioned capsule when it reaches 1.0. Anything else is the consumer's mistake, said in words."""
    if max_version is None:
        return False
    if (
        not isinstance(max_version, tuple)
        or len(max_version) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in max_version)
    ):
        raise InvalidInputError(
            f"__dlpack__: max_version must be None or a (major, minor) pair, got {shown(max_version)}"
        )
    return max_version >= (1, 0)


def live_exports() -> int:
    """How many exported tensors a consumer still holds (for tests and leak checks)."""
    with _exports_lock:
        return len(_exports)
