"""``cuplug new-backend NAME``: a new backend project, copied from the `scan` example.

The example (examples/scan, shipped as cuplug/data/template) is a complete
project: a CUDA .cu and a CPU .c behind one op table, CMake lists that find
cuplug, a pyproject, a short noxfile and tests. The copy renames the backend
(``scan`` -> NAME) and its Python package (``scankit`` -> PACKAGE); it then
builds and passes its tests as it is, and its author replaces the prefix sum.
"""

from __future__ import annotations

import keyword
import re
import shutil
import sys
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


# Names a generated project must never take: cuplug's own (and its template's), and what pip/Python use.
RESERVED = {"vector", "scan", "scankit", "test", "tests", "build", "dist", "setuptools", "pip", "wheel", "site"}


def _why_reserved(what: str, value: str) -> str | None:
    if not NAME_RE.fullmatch(value):
        return f"{what} {value!r}: use lowercase letters, digits and '_', starting with a letter (at most 31)"
    if keyword.iskeyword(value) or keyword.issoftkeyword(value):
        return f"{what} {value!r} is a Python keyword: the generated code could not import it"
    if value.startswith("cuplug"):
        return f"{what} {value!r}: names starting with 'cuplug' belong to cuplug and its backend packages"
    if value == "vector":
        return "'vector' is cuplug's own backend; pick another name"
    if value in RESERVED:
        return f"{what} {value!r} is reserved (cuplug's template or a packaging tool uses it)"
    if value in getattr(sys, "stdlib_module_names", ()) or value in sys.builtin_module_names:
        return f"{what} {value!r} is a module of Python's standard library: the package would shadow it"
    return None


def _installed_clash(name: str, package: str) -> str | None:
    """A project whose distributions (PACKAGE, PACKAGE-cudaNN for each CUDA major) or backend name already exist here."""
    from cuplug.contract import distributions, manifest

    from .toolchain import INSTALLERS  # the CUDA majors the template builds: one backend distribution each

    installed = distributions.Installed(list(sys.path))
    for dist in (package, *(f"{package}_{major}" for major in sorted(INSTALLERS))):
        if distributions.normalize(dist) in installed.dists:
            return (
                f"a distribution named {dist.replace('_', '-')!r} is already installed; its files would be overwritten"
            )
    for d, ep in installed.entry_points(manifest.CPU_ENTRY_POINT_GROUP):
        if ep.name == name:
            return f"backend name {name!r} is already registered by the installed distribution {d.name!r}"
    return None


def create(name: str, dest: Path, package: str | None = None) -> list[Path]:
    """Writes the project into ``dest`` (which must not exist or be an empty directory); returns the files."""
    package = package or name
    for what, value in (("backend name", name), ("package name", package)):
        why = _why_reserved(what, value)
        if why:
            raise ScaffoldError(why)
    why = _installed_clash(name, package)
    if why:
        raise ScaffoldError(why)
    if dest.exists() and not dest.is_dir():
        raise ScaffoldError(f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
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
