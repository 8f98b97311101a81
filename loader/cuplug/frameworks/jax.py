"""A backend's ops as JAX FFI targets: ``cuplug.jax.register(backend)`` gives one function per op that
``jax.jit`` compiles into an XLA custom call, run on XLA's buffers (and, on CUDA, XLA's stream) without
a host round trip.

Each call is ``jax.ffi.ffi_call`` to cuplug's one typed XLA FFI handler (``xla_ffi.cc``), which calls the
backend's ``cuplug_backend_call`` on the instance that ``backend`` holds; the result shapes and dtypes
come from the op's shape rules, checked at trace time (a bad call fails while tracing, naming the op and
the operand). The handler is compiled once per jaxlib version and source, on first use, with the C++
compiler (``$CXX``, else ``c++``) against the headers jaxlib ships (``jax.ffi.include_dir()``), into the
user cache (``~/.cache/cuplug/xla-ffi``); without a compiler, ``register`` says so.

JAX arrays are immutable: outputs are always new buffers (``run(out=...)`` refuses a JAX array).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import secrets
import subprocess
from pathlib import Path

from ..contract import dtypes
from ..contract.errors import ConfigError, InvalidInputError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..runtime.api import Backend
    from ..runtime.signature import OpSignature

SOURCE = Path(__file__).with_name("xla_ffi.cc")
_registered: dict[str, Any] = {}  # platform -> the handler library (kept loaded)


def _cache_dir() -> Path:
    from ..contract.cache import cache_root

    return Path(cache_root()) / "xla-ffi"


def handler_library(jax: Any) -> Path:
    """The compiled handler for this jaxlib and this source: built once, then found in the cache."""
    import jaxlib

    include = jax.ffi.include_dir()
    digest = hashlib.sha256(SOURCE.read_bytes() + jaxlib.__version__.encode()).hexdigest()[:16]
    lib = _cache_dir() / f"libcuplug_xla-{jaxlib.__version__}-{digest}.so"
    if lib.is_file():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX", "c++")
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-w", f"-I{include}", str(SOURCE), "-o", str(tmp)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        raise ConfigError(
            f"cuplug.jax: building the XLA FFI handler needs a C++ compiler ({cxx!r} not found; set CXX or install g++)"
        ) from None
    if proc.returncode != 0:
        raise ConfigError(f"cuplug.jax: compiling {SOURCE.name} failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    os.replace(tmp, lib)  # atomic: a concurrent first use sees a whole library or none
    return lib


def _targets(jax: Any, cuda: bool) -> str:
    """Registers cuplug's handler with XLA for the platform (once per process); the target's name."""
    platform = "CUDA" if cuda else "cpu"
    name = f"cuplug_call_{platform.lower()}"
    if platform not in _registered:
        lib = ctypes.CDLL(str(handler_library(jax)))
        symbol = lib.cuplug_xla_call_cuda if cuda else lib.cuplug_xla_call_host
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform=platform)
        _registered[platform] = lib
    return name


def register(backend: Backend, prefix: str = "") -> Any:
    """``ops.<op>(*arrays, **attrs)`` for every op of ``backend``, usable inside ``jax.jit``; returns a namespace
    of them. They call the instance ``backend`` holds: once it is closed, a compiled call of them is an error
    (the handler's table of open instances), never a use of freed memory."""
    import types
    from typing import cast

    import jax

    cuda = backend.device_type == dtypes.DEVICE_CUDA
    target = _targets(jax, cuda)
    handler = _registered["CUDA" if cuda else "cpu"]
    handler.cuplug_xla_track.argtypes, handler.cuplug_xla_track.restype = [ctypes.c_int64, ctypes.c_int64], None
    token = secrets.randbits(62)  # names this registration in the handler's table of open instances
    core = backend._core
    handler.cuplug_xla_track(token, backend._live_handle())
    core.on_destroy.append(lambda: handler.cuplug_xla_track(token, 0))  # before the instance goes
    lib = backend._core.lib.lib
    # the addresses of two symbols ctypes has found (a missing one raises): never NULL, so never None
    fn = cast(int, ctypes.cast(lib.cuplug_backend_call, ctypes.c_void_p).value)
    last_error = cast(int, ctypes.cast(lib.cuplug_backend_last_error, ctypes.c_void_p).value)
    ops = types.SimpleNamespace()
    for name, sig in backend.ops.items():
        setattr(ops, prefix + name, _op(jax, backend, sig, target, fn, last_error, token))
    return ops


def _op(jax: Any, backend: Backend, sig: OpSignature, target: str, fn: int, last_error: int, token: int) -> Any:
    import numpy as np

    jnp = jax.numpy
    kinds = "".join("i" if a.kind == "int64" else "f" for a in sig.attrs)
    names = ",".join(a.name for a in sig.attrs)

    def op(*xs: Any, **attrs: Any) -> Any:
        specs = []
        for i, x in enumerate(xs):
            label = f"{sig.name}: {sig.inputs[i].name if i < len(sig.inputs) else i}"
            if not (hasattr(x, "shape") and hasattr(x, "dtype")):
                raise InvalidInputError(f"{label}: expected a JAX array (jnp.asarray(x)), got {type(x).__name__}")
            try:
                dt = dtypes.from_name(str(x.dtype))  # a tracer's dtype is known while tracing
            except ValueError:
                raise InvalidInputError(
                    f"{label}: dtype {x.dtype} is not a dtype cuplug knows ({', '.join(dtypes.BY_NAME)})"
                ) from None
            specs.append((dt, tuple(x.shape)))
        values = sig.attr_values(attrs)
        sig.check_inputs(specs, values)
        out_specs = sig.output_specs(specs, values)
        result_types = [
            jax.ShapeDtypeStruct(shape, jnp.bfloat16 if dt.name == "bfloat16" else np.dtype(dt.name))
            for dt, shape in out_specs
        ]
        handle = backend._live_handle()
        call = jax.ffi.ffi_call(target, result_types if len(result_types) > 1 else result_types[0])
        return call(
            *xs,
            fn=np.int64(fn),
            last_error=np.int64(last_error),
            handle=np.int64(handle),
            token=np.int64(token),
            op=sig.name,
            attr_names=names,
            attr_kinds=kinds,
            attr_ints=np.array([v for _, k, v in values if k == "int64"] or [0], dtype=np.int64),
            attr_floats=np.array([v for _, k, v in values if k == "float64"] or [0.0], dtype=np.float64),
        )

    op.__name__ = op.__qualname__ = sig.name
    op.__doc__ = f"{sig!r}, through XLA's FFI (cuplug.jax)"
    return op
