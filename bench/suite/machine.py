"""The machine a record was measured on: host, CPU, cores, Python, GPU and driver, package versions, the source.

Read without importing any GPU library: nvidia-smi for the GPU, importlib.metadata for the versions.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "cuplug",
    "cuplug-cuda12",
    "cuplug-cuda13",
    "numpy",
    "torch",
    "cupy-cuda12x",
    "cupy-cuda13x",
    "cupy",
    "jax",
    "jaxlib",
    "pytest",
    "pytest-benchmark",
    "matplotlib",
)
ENV_KEPT = ("CUPLUG_", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS")


def _run(cmd: list[str]) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


def _versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def gpu() -> dict[str, Any] | None:
    """nvidia-smi's view (None without one); ``processes`` empty means no other process holds the device."""
    row = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pstate", "--format=csv,noheader"])
    if row is None:
        return None
    apps = _run(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"])
    return {"devices": row.splitlines(), "processes": (apps or "").splitlines()}


def source() -> dict[str, Any]:
    """The checkout's commit and whether its tree differs (absent where the tree was copied without .git)."""
    commit = _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    if commit is None:
        return {"commit": None}
    dirty = _run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "changed_files": len(dirty.splitlines()) if dirty else 0}


def machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "gpu": gpu(),
        "packages": _versions(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_KEPT)},
        "source": source(),
    }
