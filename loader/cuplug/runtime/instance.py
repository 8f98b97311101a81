"""The C instance behind a Backend and its tensors: its handle and lock (``_Core``), when it is destroyed, what a
fork leaves of it, and the finalizers that free what nobody holds any more."""

from __future__ import annotations

import _thread
import _weakref
import atexit
import ctypes
import os
from _weakrefset import WeakSet

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Tensor = Any  # (the module that defines it imports this one)

    from .library import BackendLibrary


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

    def release(self, buffer_id: int, life: list[str | None] | None = None) -> None:
        """A tensor has gone (its last holder let go): free it, and the instance if it was the last. ``life``: the
        tensor's own record of it, marked "freed" first (a __del__ elsewhere may bring the tensor back)."""
        with self.lock:
            if life is not None:
                life[0] = life[0] or "freed"
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
