"""``cuplug new-backend NAME``: a new backend project, copied from the `scan` example.

The example (examples/scan, shipped as cuplug/data/template) is a complete
project: a CUDA .cu and a CPU .c behind one op table, CMake lists that find
cuplug, a pyproject, a short noxfile and tests. The copy renames the backend
(``scan`` -> NAME) and its Python package (``scankit`` -> PACKAGE); it then
builds and passes its tests as it is, and its author replaces the prefix sum.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .resources import template_dir

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,30}$")
SKIP = {"build", "dist", ".nox", "__pycache__"}
# "scan" as a name, not inside a word ("scanned", "Scans" stay); "scankit" first.
_BACKEND_WORD = re.compile(r"(?<![A-Za-z])scan(?![a-z])")


class ScaffoldError(ValueError):
    pass


def _rename(text: str, name: str, package: str) -> str:
    return _BACKEND_WORD.sub(name, text.replace("scankit", package))


def create(name: str, dest: Path, package: str | None = None) -> list[Path]:
    """Writes the project into ``dest`` (which must not exist or be empty); returns the files."""
    package = package or name
    for what, value in (("backend name", name), ("package name", package)):
        if not NAME_RE.match(value):
            raise ScaffoldError(f"{what} {value!r}: use lowercase letters, digits and '_', starting with a letter")
    if name == "vector":
        raise ScaffoldError("'vector' is cuplug's own backend; pick another name")
    if dest.exists() and any(dest.iterdir()):
        raise ScaffoldError(f"{dest} exists and is not empty")
    source = template_dir()
    if not (source / "pyproject.toml").is_file():
        raise ScaffoldError(f"the template is missing at {source}; reinstall cuplug")
    written = []
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if path.is_dir() or SKIP & set(rel.parts):
            continue
        target = dest / _rename(str(rel), name, package)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_rename(path.read_text(), name, package))
        shutil.copymode(path, target)
        written.append(target)
    return written
