#!/usr/bin/env python3
"""Runs nox from a private, pinned tools venv; needs only Python 3 (stdlib).

    python3 ci/nox.py -s main      # build everything, install it, run `cuplug probe`
    python3 ci/nox.py -s tests     # the test suite

The venv lives in the user cache (``~/.cache/cuplug/tools-<hash>``), keyed by
ci/requirements-tools.txt, so reruns start at once. On Debian without the
python3-venv package (no ensurepip) it creates the venv ``--without-pip`` and
bootstraps pip from PyPI's pinned pip wheel, checked by sha256.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import urllib.request
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-tools.txt"
PIP_URL = (
    "https://files.pythonhosted.org/packages/44/3c/d717024885424591d5376220b5e836c2d5293ce2011523c9de23ff7bf068/"
    "pip-25.3-py3-none-any.whl"
)
PIP_SHA256 = "9655943313a94722b7774661c21049070f6bbb0a1516bf02f7c8d5d9201514cd"


def cache_dir() -> Path:
    """The tools venv in cuplug's cache (the build kit's cache_root: the stdlib only, no install needed)."""
    sys.path.insert(0, str(HERE.parent / "loader"))
    from cuplug.kit.toolchain import cache_root

    key = hashlib.sha256(REQUIREMENTS.read_bytes() + sys.version.encode()).hexdigest()[:12]
    return cache_root() / f"tools-{key}"


def ensure_pip(env_dir: Path) -> None:
    python = env_dir / "bin" / "python"
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return
    url = PIP_URL
    wheel = env_dir / Path(url).name
    print(f"ci/nox.py: no ensurepip here; fetching {wheel.name}", flush=True)
    data = urllib.request.urlopen(url, timeout=120).read()
    if hashlib.sha256(data).hexdigest() != PIP_SHA256:
        sys.exit(f"ci/nox.py: {wheel.name} sha256 mismatch; retry, or install python3-venv")
    wheel.write_bytes(data)
    subprocess.run([python, str(wheel / "pip"), "install", "-q", str(wheel)], check=True)


def main() -> int:
    env_dir = cache_dir()
    marker = env_dir / ".complete"
    if not marker.exists():
        print(f"ci/nox.py: creating the tools venv {env_dir}", flush=True)
        try:
            venv.create(env_dir, with_pip=True, clear=True)
        except (subprocess.CalledProcessError, OSError):
            venv.create(env_dir, with_pip=False, clear=True)
        ensure_pip(env_dir)
        subprocess.run(
            [
                env_dir / "bin" / "python",
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-r",
                str(REQUIREMENTS),
            ],
            check=True,
        )
        marker.touch()
    os.chdir(HERE.parent)
    nox = env_dir / "bin" / "nox"
    os.execv(nox, [str(nox), *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
