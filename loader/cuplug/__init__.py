"""cuplug: CUDA as an optional, installable, diagnosable runtime module.

``cuplug.load()`` returns the best backend for this machine (a CUDA variant from an
installed CUDA extra such as ``cuplug[cuda13]``, else the CPU backend, with the reason in
``Backend.trace``). Importing cuplug opens no CUDA library, imports no NumPy, and loads
nothing but this file: every name below is imported on first use (PEP 562), so an
application pays only for what it calls.

The package, by layer (each imports only the ones above it):

- ``cuplug.contract``: the C ABI, the CUDA compatibility facts, reason/exit codes, the manifest;
- ``cuplug.runtime``: policy, driver probe, discovery, selection, verification, the Backend;
- ``cuplug.tools``: the ``cuplug`` command (probe, doctor, inspect, warmup, new-backend);
- ``cuplug.kit``: the build kit (toolchains, variants, wheels and their gate).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # what the lazy names below are, for type checkers
    from typing import Any

    from .contract.errors import (  # noqa: F401
        ArtifactError,
        BackendClosedError,
        BackendError,
        BackendNotAvailable,
        ConfigError,
        CuplugError,
        InvalidInputError,
        OutOfMemoryError,
        UnknownOpError,
    )
    from .runtime.api import Backend, Buffer, Tensor  # noqa: F401
    from .runtime.hostbuf import HostTensor  # noqa: F401
    from .runtime.loading import explain, load  # noqa: F401
    from .runtime.trace import Trace  # noqa: F401

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY = {
    "load": "runtime.loading",
    "explain": "runtime.loading",
    "decide": "runtime.loading",  # explain()'s first name
    "Backend": "runtime.api",
    "Buffer": "runtime.api",
    "Tensor": "runtime.api",
    "HostTensor": "runtime.hostbuf",
    "Trace": "runtime.trace",
    **dict.fromkeys(
        (
            "ArtifactError",
            "BackendClosedError",
            "BackendError",
            "BackendNotAvailable",
            "ConfigError",
            "CuplugError",
            "InvalidInputError",
            "OutOfMemoryError",
            "UnknownOpError",
        ),
        "contract.errors",
    ),
}
__all__ = [*sorted(n for n in _LAZY if n != "decide"), "__version__", "probe"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cuplug' has no attribute {name!r}")
    value = getattr(__import__(f"{__name__}.{module}", fromlist=[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def probe(isolated: bool = False) -> dict[str, Any]:
    """Driver and device facts as a dict, loading no backend. ``isolated`` probes in a child process."""
    from .runtime import driver

    return (driver.probe_isolated() if isolated else driver.probe()).to_json()
