"""cuplug: CUDA as an optional, installable, diagnosable runtime module.

``cuplug.load()`` returns the best backend for this machine (a CUDA variant
from an installed ``cuplug[cuda12]``/``cuplug[cuda13]`` extra, else the CPU
backend, with the reason in ``Backend.trace``). Importing cuplug opens no CUDA
library and imports no NumPy.
"""

from __future__ import annotations

from typing import Any

from .api import Backend, Buffer, Tensor
from .errors import (
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
from .loading import Trace, decide, load

__version__ = "0.1.0"
__all__ = [
    "ArtifactError",
    "Backend",
    "BackendClosedError",
    "BackendError",
    "BackendNotAvailable",
    "Buffer",
    "ConfigError",
    "CuplugError",
    "InvalidInputError",
    "OutOfMemoryError",
    "Tensor",
    "Trace",
    "UnknownOpError",
    "__version__",
    "explain",
    "load",
    "probe",
]


def probe(isolated: bool = False) -> dict[str, Any]:
    """Driver and device facts as a dict, loading no backend. ``isolated`` probes in a child process."""
    from . import driver

    return (driver.probe_isolated() if isolated else driver.probe()).to_json()


def explain(backend: str = "vector", device: int | None = None) -> Trace:
    """The decision trace without loading anything; ``str(explain())`` is the diagnostic table."""
    return decide(backend, device)
