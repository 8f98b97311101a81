"""Running the build's external tools: one way to run a command, one way to hide a system CUDA.

Every failure is a :class:`BuildError` (or the subclass a caller names) that names the
step, the command and the end of its output.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path


class BuildError(RuntimeError):
    """A build step or one of its checks failed; the message names the step and the check."""


def run(
    cmd: list[str],
    step: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    error: type[BuildError] = BuildError,
) -> str:
    """stdout of ``cmd``; ``error`` naming ``step`` when it cannot start or exits non-zero."""
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise error(f"{step}: `{cmd[0]}` is not installed ({exc})") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-3000:]
        raise error(f"{step} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return proc.stdout


def without_system_cuda(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ) with no system CUDA visible: no /usr/local/cuda or nvcc on PATH,
    no CUDA_HOME/CUDA_PATH/CUDACXX. Every build names its own toolchain explicitly."""
    env = dict(os.environ if base is None else base)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if "cuda" not in p.lower()]
    return {**env, "PATH": os.pathsep.join(path), "CUDA_HOME": "", "CUDA_PATH": "", "CUDACXX": ""}
