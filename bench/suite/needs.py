"""What a scenario may need, checked by the runner without importing it (no CUDA in the runner's process).

Each check answers None (present) or why the scenario is skipped and what to do. A scenario's own process
checks the rest (e.g. that PyTorch was built with CUDA) and raises suite.scenario.Skip.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable


def has_gpu() -> bool:
    """An NVIDIA driver and device nodes: asked of nvidia-smi's presence only, nothing is initialised."""
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidiactl")


def _module(name: str, install: str) -> Callable[[], str | None]:
    return lambda: None if importlib.util.find_spec(name) is not None else f"needs {install} (not importable here)"


NEEDS: dict[str, Callable[[], str | None]] = {
    "gpu": lambda: None if has_gpu() else "needs an NVIDIA GPU (no nvidia-smi or /dev/nvidiactl on this machine)",
    "numpy": _module("numpy", "NumPy: pip install numpy"),
    "torch": _module("torch", "PyTorch: pip install torch"),
    "cupy": _module("cupy", "CuPy: pip install cupy-cuda12x or cupy-cuda13x"),
    "pytest-benchmark": _module("pytest_benchmark", "pytest-benchmark: pip install pytest-benchmark==5.3.1"),
    "cc": lambda: None if shutil.which("cc") else "needs a C compiler (cc) to build tests/fake_cuda/fake_libcuda.c",
}


def missing(needs: tuple[str, ...]) -> str | None:
    """The first unmet need's reason, or None."""
    for need in needs:
        reason = NEEDS[need]()
        if reason:
            return reason
    return None
