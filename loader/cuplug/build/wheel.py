"""Backend wheels: assemble one from build_backend's output, repair it with auditwheel, check it.

A backend wheel (e.g. ``cuplug-cuda13``) holds a package of the same name
(``cuplug_cuda13``) with ``manifest.json`` and one directory per variant,
registers that package in the entry-point group ``cuplug.backends`` and
requires the ``cuplug`` versions whose loader speaks its ABI. It carries no
Python extension, so it is tagged ``py3-none``; its platform tag comes from
auditwheel's analysis of the libraries (``manylinux_2_17`` when linked against
the bullseye sysroot), never typed in.

``check_wheel`` is the gate every wheel passes before it leaves ``dist/``:
no libcuda or libcudart.so inside, no RPATH/RUNPATH that leaves the package,
a manylinux tag no newer than the glibc symbols need, and for backend
wheels a manifest whose sizes and digests match the files beside it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from cuplug.elfarch import host_arch, machine_of
from cuplug.manifest import ENTRY_POINT_GROUP

RAW_TAG = "py3-none-linux_x86_64"  # auditwheel turns it into the manylinux tag the libraries earn
TARGET_PLAT = "manylinux_2_17_x86_64"
WHEEL_ARCHS = ("x86_64", "aarch64")  # platform-tag suffixes == ELF machines (cuplug.elfarch)


def raw_tag(arch: str = "x86_64") -> str:
    return f"py3-none-linux_{arch}"


def target_plat(arch: str = "x86_64") -> str:
    return f"manylinux_2_17_{arch}"


FORBIDDEN = re.compile(r"(^|/)(libcuda\.so[^/]*|libcudart\.so[^/]*|libnvidia-[^/]*\.so[^/]*)$")
_REPRODUCIBLE_DATE = (2026, 1, 1, 0, 0, 0)


class WheelError(RuntimeError):
    """A wheel could not be built or failed a check; the message names the wheel and the check."""


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


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
    build_dir: Path, out_dir: Path, *, name: str, version: str, requires: str, summary: str = "", tag: str = RAW_TAG
) -> Path:
    """Writes ``<name>-<version>-<tag>.whl`` from ``build_dir/manifest.json`` and the files it names.

    ``requires`` is the Requires-Dist on cuplug, e.g. ``"cuplug==0.1.0"``.
    """
    manifest_path = build_dir / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise WheelError(f"{manifest_path}: {exc}; run build_backends first") from exc
    package = name.replace("-", "_")
    dist = f"{package}-{version}"
    files: dict[str, bytes] = {
        f"{package}/__init__.py": _import_guard(name, summary, requires).encode(),
        f"{package}/manifest.json": manifest_path.read_bytes(),
    }
    for artifact in manifest.get("artifacts", ()):
        path = build_dir / artifact["file"]
        if not path.is_file():
            raise WheelError(f"{manifest_path} names {artifact['file']}, which is not in {build_dir}")
        files[f"{package}/{artifact['file']}"] = path.read_bytes()
    files[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        f"Summary: {summary or name}\nRequires-Python: >=3.10\nRequires-Dist: {requires}\n"
    ).encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: cuplug.build.wheel\nRoot-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    files[f"{dist}.dist-info/entry_points.txt"] = f"[{ENTRY_POINT_GROUP}]\n{package} = {package}\n".encode()
    record_name = f"{dist}.dist-info/RECORD"
    record = [_record_line(n, data) for n, data in files.items()] + [f"{record_name},,"]
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


def repair_wheel(wheel: Path, out_dir: Path, run: Callable[..., object] | None = None, plat: str = TARGET_PLAT) -> Path:
    """``auditwheel repair`` with the driver excluded; returns the repaired wheel in out_dir.

    ``run`` executes the command (a nox session's ``session.run``); default: subprocess in this Python.
    SOURCE_DATE_EPOCH keeps the repaired wheel's timestamps reproducible.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.whl"))
    # auditwheel 6.8 offers --plat choices of this machine's arch only; for a cross-built wheel
    # `auto` reads the arch from its ELF files and names the oldest policy they satisfy, which
    # must then be `plat` (checked below).
    foreign = not plat.endswith(f"_{host_arch()}")
    cmd = ["auditwheel", "repair", "--plat", "auto" if foreign else plat, "--exclude", "libcuda.so*"]
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


def _rpaths(data: bytes) -> list[str]:
    """RPATH and RUNPATH entries of a shared object; ValueError when it is not a readable ELF."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    paths: list[str] = []
    try:
        sections = list(ELFFile(io.BytesIO(data)).iter_sections())
    except ELFError as exc:
        raise ValueError(f"not a readable ELF file ({exc})") from exc
    for section in sections:
        if isinstance(section, DynamicSection):
            for tag in section.iter_tags():
                if tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                    value = getattr(tag, "rpath" if tag.entry.d_tag == "DT_RPATH" else "runpath")  # pyelftools names it
                    paths.extend(value.split(":"))
    return paths


def _rpath_inside(member: str, rpath: str) -> bool:
    if not rpath.startswith("$ORIGIN"):
        return False
    parts = [*PurePosixPath(member).parent.parts, *PurePosixPath(rpath[len("$ORIGIN") :].lstrip("/")).parts]
    depth = 0
    for part in parts:
        depth += -1 if part == ".." else (0 if part in ("", ".") else 1)
        if depth < 0:
            return False
    return True


def wheel_tags(name: str) -> tuple[str, str, list[str]]:
    """(python tag, abi tag, platform tags) from a wheel file name (a PEP 825 variant label ignored)."""
    from .variants import split_label

    parts = split_label(name)[0][: -len(".whl")].split("-")
    return parts[-3], parts[-2], parts[-1].split(".")


def check_wheel(wheel: Path, max_glibc: tuple[int, int] = (2, 17)) -> list[str]:
    """Every problem found in one wheel (an empty list: the wheel may ship)."""
    problems: list[str] = []
    py, abi_tag, plats = wheel_tags(wheel.name)
    if py != "py3" or abi_tag != "none":
        problems.append(f"tag {py}-{abi_tag}: a wheel without a CPython extension must be py3-none")
    tag_archs = set()
    for plat in plats:
        m = re.match(r"manylinux_(\d+)_(\d+)_(x86_64|aarch64)$", plat) or re.match(
            r"manylinux2014_(x86_64|aarch64)$", plat
        )
        if m is None:
            problems.append(f"platform tag {plat} is not a manylinux tag (run auditwheel repair)")
            continue
        tag_archs.add(m.group(m.lastindex or 0))
        if len(m.groups()) == 3 and (int(m.group(1)), int(m.group(2))) > max_glibc:
            problems.append(f"platform tag {plat} is newer than manylinux_{max_glibc[0]}_{max_glibc[1]}")
    if len(tag_archs) > 1:
        problems.append(f"platform tags name several CPU architectures: {sorted(tag_archs)}")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        for member in names:
            if FORBIDDEN.search(member):
                problems.append(f"{member}: the driver and the shared CUDA runtime are never bundled")
            if member.endswith(".so") or ".so." in member:
                data = zf.read(member)
                arch = machine_of(data[:20])
                if tag_archs and arch not in tag_archs:
                    problems.append(f"{member}: an {arch} library in a wheel tagged for {sorted(tag_archs)}")
                try:
                    rpaths = _rpaths(data)
                except ValueError as exc:
                    problems.append(f"{member}: {exc}")
                    continue
                for rpath in rpaths:
                    if rpath and not _rpath_inside(member, rpath):
                        problems.append(f"{member}: RPATH/RUNPATH {rpath!r} points outside the package")
        for manifest_name in (n for n in names if n.endswith("/manifest.json") and n.count("/") == 1):
            base = manifest_name.rsplit("/", 1)[0]
            for art in json.loads(zf.read(manifest_name)).get("artifacts", ()):
                member = f"{base}/{art['file']}"
                if member not in names:
                    problems.append(f"{manifest_name} names {art['file']}, missing from the wheel")
                    continue
                data = zf.read(member)
                if len(data) != art["size"] or hashlib.sha256(data).hexdigest() != art["sha256"]:
                    problems.append(f"{member}: size/sha256 differ from {manifest_name} (changed after the build)")
    from .variants import check_variant  # a variant wheel: its label, variant.json and properties

    problems += check_variant(wheel)
    return problems


def check_wheels(wheels: Sequence[Path], log: Callable[[str], None] = print) -> None:
    """Raises WheelError naming every problem of every wheel; logs one line per good wheel."""
    failures = []
    for wheel in wheels:
        problems = check_wheel(wheel)
        if problems:
            failures.append(f"{wheel.name}:\n  " + "\n  ".join(problems))
        else:
            log(f"ok: {wheel.name} ({wheel.stat().st_size / 1e6:.2f} MB)")
    if failures:
        raise WheelError("wheel check failed:\n" + "\n".join(failures))
