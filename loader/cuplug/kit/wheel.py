"""Backend wheels: assemble one from build_backend's output, repair it with auditwheel, check it.

A backend wheel (e.g. ``cuplug-cuda13``) holds a package of the same name
(``cuplug_cuda13``) with ``manifest.json`` and one directory per variant,
registers that package in the entry-point group ``cuplug.backends`` and
requires the ``cuplug`` versions whose loader speaks its ABI. It carries no
Python extension, so it is tagged ``py3-none``; its platform tag comes from
auditwheel's analysis of the libraries (``manylinux_2_17`` when linked against
the bullseye sysroot), never typed in.

Every wheel then passes the shipping gate (``gate.check_wheel``) before it leaves ``dist/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from cuplug.contract import manifest
from cuplug.contract.elfarch import host_arch

from .process import BuildError
from .rules import ABI_TAG, DRIVER_LIBRARY, MAX_GLIBC, PYTHON_TAG
from .wheelfile import record_line, wheel_tags


def raw_tag(arch: str = "x86_64") -> str:
    """The tag a wheel is built with; auditwheel turns it into the manylinux tag the libraries earn."""
    return f"{PYTHON_TAG}-{ABI_TAG}-linux_{arch}"


def target_plat(arch: str = "x86_64") -> str:
    return f"manylinux_{MAX_GLIBC[0]}_{MAX_GLIBC[1]}_{arch}"


RAW_TAG = raw_tag()
TARGET_PLAT = target_plat()
_REPRODUCIBLE_DATE = (2026, 1, 1, 0, 0, 0)


class WheelError(BuildError):
    """A wheel could not be built or failed a check; the message names the wheel and the check."""


def _import_guard(name: str, summary: str | None, requires: str) -> str:
    """The package's __init__.py: importing it explains what to do instead."""
    message = (
        f"{name} holds backend libraries, not a Python module: install cuplug and call "
        f"cuplug.load() (pip install '{requires}')"
    )
    return (
        f'"""{summary or name}: backend libraries for the cuplug loader, used through cuplug.load()."""\n'
        f"raise ImportError({message!r})\n"
    )


def build_backend_wheel(
    build_dir: Path,
    out_dir: Path,
    *,
    name: str,
    version: str,
    requires: str | Sequence[str],
    summary: str = "",
    tag: str = RAW_TAG,
) -> Path:
    """Writes ``<name>-<version>-<tag>.whl`` from ``build_dir/manifest.json`` and the files it names.

    ``requires`` is the Requires-Dist on cuplug, e.g. ``"cuplug==0.1.0"``, or a list of them (cuplug first, then
    the NVIDIA wheels of the components the build declared: ``components.json``).
    """
    reqs = [requires] if isinstance(requires, str) else list(requires)
    manifest_path = build_dir / manifest.FILE_NAME
    try:
        artifacts = manifest.read_strict(build_dir)
    except manifest.ManifestError as exc:
        raise WheelError(f"{exc}; run build_backends first") from exc
    package = name.replace("-", "_")
    dist = f"{package}-{version}"
    files: dict[str, bytes] = {
        f"{package}/__init__.py": _import_guard(name, summary, reqs[0]).encode(),
        f"{package}/manifest.json": manifest_path.read_bytes(),
    }
    for artifact in artifacts:
        path = build_dir / artifact.file
        if not path.is_file():
            raise WheelError(f"{manifest_path} names {artifact.file}, which is not in {build_dir}")
        files[f"{package}/{artifact.file}"] = path.read_bytes()
    files[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        f"Summary: {summary or name}\nRequires-Python: >=3.11\n" + "".join(f"Requires-Dist: {r}\n" for r in reqs)
    ).encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: cuplug.kit.wheel\nRoot-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    files[f"{dist}.dist-info/entry_points.txt"] = f"[{manifest.ENTRY_POINT_GROUP}]\n{package} = {package}\n".encode()
    record_name = f"{dist}.dist-info/RECORD"
    record = [record_line(n, data) for n, data in files.items()] + [f"{record_name},,"]
    files[record_name] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for n, data in files.items():
            info = zipfile.ZipInfo(n, date_time=_REPRODUCIBLE_DATE)
            info.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return wheel


def _refuse_new_glibc(wheel: Path) -> None:
    """Every library of the wheel imports glibc symbols of manylinux_2_17's floor only; else a WheelError naming
    each file, symbol and version, and the fix (gate.glibc_problem)."""
    from .glibc import glibc_needs, glibc_problem

    problems = []
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if member.endswith(".so") or ".so." in member:
                try:
                    needs = glibc_needs(zf.read(member))
                except ValueError:
                    continue  # not an ELF file: auditwheel says what it makes of it
                if needs:
                    problems.append(glibc_problem(member, needs))
    if problems:
        raise WheelError(f"{wheel.name} cannot be manylinux_2_17:\n  " + "\n  ".join(problems))


def repair_wheel(
    wheel: Path,
    out_dir: Path,
    run: Callable[..., object] | None = None,
    plat: str = TARGET_PLAT,
    exclude: Sequence[str] = (),
) -> Path:
    """``auditwheel repair`` with the driver excluded; returns the repaired wheel in out_dir.

    ``exclude``: further sonames left out (a declared component's libraries: required, found through RPATH).
    ``run`` executes the command (a nox session's ``session.run``); default: subprocess in this Python.
    SOURCE_DATE_EPOCH keeps the repaired wheel's timestamps reproducible.
    """
    _refuse_new_glibc(wheel)  # before auditwheel, whose text names neither the file nor the symbol
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.whl"))
    # auditwheel 6.8 offers --plat choices of this machine's arch only; for a cross-built wheel
    # `auto` reads the arch from its ELF files and names the oldest policy they satisfy, which
    # must then be `plat` (checked below).
    foreign = not plat.endswith(f"_{host_arch()}")
    cmd = ["auditwheel", "repair", "--plat", "auto" if foreign else plat, "--exclude", DRIVER_LIBRARY]
    for soname in exclude:
        cmd += ["--exclude", soname]
    cmd += ["-w", str(out_dir), str(wheel)]
    env = {"SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "1767225600")}
    if run is None:
        subprocess.run([sys.executable, "-m", *cmd], check=True, env={**os.environ, **env})
    else:
        run(*cmd, env=env)
    prefix = wheel.name.split("-")[0] + "-"
    made = sorted(p for p in set(out_dir.glob("*.whl")) - before if p.name.startswith(prefix))
    if not made:  # rerun into a dir that already held it
        made = sorted(p for p in out_dir.glob(f"{prefix}*manylinux*.whl"))
    if not made:
        raise WheelError(f"auditwheel repair of {wheel.name} wrote nothing into {out_dir}")
    if plat not in wheel_tags(made[-1].name)[2]:
        raise WheelError(f"auditwheel repair of {wheel.name} gave {made[-1].name}, not a {plat} wheel")
    return made[-1]
