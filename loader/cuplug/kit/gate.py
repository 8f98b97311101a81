"""The shipping gate: what a backend library and a wheel must be before they leave ``dist/``.

The rules are the tables below, one place each; ``check_linkage`` applies them to a
built library, ``check_wheel`` to a wheel (every wheel: cuplug's, the backends', the
variant wheels). The docs' table of them is generated from here.

- no driver (``libcuda``), no shared CUDA runtime, no ``libnvidia-*`` inside a wheel;
- a backend library needs only the C runtime and exports exactly the ABI;
- no library imports ``exit``, ``_exit``, ``_Exit``, ``quick_exit`` or ``abort`` (it would end the host process);
- no RPATH/RUNPATH that leaves the package;
- tags ``py3-none`` (no CPython extension), or ``cp311-abi3`` for a wheel whose extensions are all on the
  stable ABI (``*.abi3.so``), and manylinux no newer than the newest glibc symbol allows (2.17, the
  bullseye sysroot's floor), for one CPU architecture;
- a backend wheel's manifest matches its members (size and sha256), and a variant
  wheel's label, ``variant.json`` and properties match its manifest.
"""

from __future__ import annotations

import fnmatch
import io
import re
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from cuplug.contract import abi, manifest
from cuplug.contract.elfarch import machine_of

from .glibc import glibc_needs, glibc_problem
from .process import BuildError, run
from .rules import (
    ABI_TAG,
    ALLOWED_NEEDED,
    ARCHS,
    EXPORTED,
    EXTENSION_ABI_TAG,
    EXTENSION_PYTHON_TAG,
    EXTENSION_SUFFIX,
    FORBIDDEN_LIBRARIES,
    LEGACY_MANYLINUX,
    MAX_GLIBC,
    PROCESS_ENDING,
    PYTHON_TAG,
)
from .wheelfile import wheel_tags


def forbidden(member: str) -> bool:
    name = member.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in FORBIDDEN_LIBRARIES)


def needed_allowed(soname: str) -> bool:
    return any(fnmatch.fnmatchcase(soname, pattern) for pattern in ALLOWED_NEEDED)


def platform_tag(tag: str) -> tuple[tuple[int, int], str] | None:
    """'manylinux_2_17_x86_64' / 'manylinux2014_aarch64' -> ((2, 17), arch); None for any other tag."""
    for legacy, glibc in LEGACY_MANYLINUX.items():
        if tag.startswith(legacy + "_") and tag[len(legacy) + 1 :] in ARCHS:
            return glibc, tag[len(legacy) + 1 :]
    parts = tag.split("_", 3)
    if len(parts) == 4 and parts[0] == "manylinux" and parts[1].isdigit() and parts[2].isdigit() and parts[3] in ARCHS:
        return (int(parts[1]), int(parts[2])), parts[3]
    return None


def check_linkage(so: Path) -> None:
    """A backend library needs only what ALLOWED_NEEDED lists and exports exactly the ABI."""
    dyn = run(["readelf", "-d", "-W", str(so)], f"readelf {so}")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    bad = [n for n in needed if not needed_allowed(n)]
    if bad:
        raise BuildError(
            f"{so} needs {bad}: a backend may link only {', '.join(ALLOWED_NEEDED)} "
            "(the static CUDA runtime, never libcudart.so or libcuda.so)"
        )
    syms = run(["nm", "-D", "--defined-only", str(so)], f"nm {so}")
    exported = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    if exported != EXPORTED:
        raise BuildError(f"{so} exports {sorted(exported ^ EXPORTED)} beyond/short of the ABI")
    undefined = run(["nm", "-D", "--undefined-only", str(so)], f"nm {so}")
    ending = process_ending([line.split()[-1] for line in undefined.splitlines() if line.strip()])
    if ending:
        raise BuildError(f"{so}: {ending_problem(ending)}")


def process_ending(imported: Sequence[str]) -> list[str]:
    """The process-ending calls (PROCESS_ENDING) among a library's undefined dynamic symbols ('exit@GLIBC_2.2.5')."""
    return sorted({name.split("@", 1)[0] for name in imported} & set(PROCESS_ENDING))


def ending_problem(ending: list[str]) -> str:
    return (
        f"imports {', '.join(ending)}: a call of it ends the Python process that loaded the backend, with no "
        "message; return a status instead (an exit()-style error macro becomes `return cuplug_op_fail(c, ...)`, "
        "or `return CUPLUG_E_DEVICE` for a CUDA error; docs/abi-v2.md)"
    )


def _undefined_symbols(data: bytes) -> list[str]:
    """The names a shared object imports (undefined entries of .dynsym); ValueError when it is not a readable ELF."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        dynsym = ELFFile(io.BytesIO(data)).get_section_by_name(".dynsym")
        symbols = list(dynsym.iter_symbols()) if dynsym is not None else []
    except (ELFError, AttributeError) as exc:
        raise ValueError(f"not a readable ELF file ({exc})") from exc
    return [s.name for s in symbols if s.name and s["st_shndx"] == "SHN_UNDEF"]


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


def rpath_inside(member: str, rpath: str) -> bool:
    """An RPATH entry of ``member`` that stays inside the wheel: $ORIGIN-relative, never above the root."""
    if not rpath.startswith("$ORIGIN"):
        return False
    # PurePosixPath drops empty and "." parts: what is left is a directory name or ".."
    parts = [*PurePosixPath(member).parent.parts, *PurePosixPath(rpath[len("$ORIGIN") :].lstrip("/")).parts]
    depth = 0
    for part in parts:
        depth += -1 if part == ".." else 1
        if depth < 0:
            return False
    return True


def is_extension(member: str) -> bool:
    """A CPython extension module: ``name.abi3.so`` or ``name.cpython-311-x86_64-linux-gnu.so``."""
    name = member.rsplit("/", 1)[-1]
    return name.endswith(EXTENSION_SUFFIX) or (name.endswith(".so") and ".cpython-" in name)


def _tag_problems(name: str, extensions: Sequence[str] = ()) -> tuple[list[str], set[str]]:
    problems: list[str] = []
    py, abi_tag, plats = wheel_tags(name)
    if extensions:
        bound = [e for e in extensions if not e.endswith(EXTENSION_SUFFIX)]
        if bound:
            problems.append(
                f"{', '.join(bound)}: a CPython extension of one Python version; build it on the stable ABI "
                f"(Py_LIMITED_API, a {EXTENSION_SUFFIX} file) so one wheel serves every CPython"
            )
        if (py, abi_tag) != (EXTENSION_PYTHON_TAG, EXTENSION_ABI_TAG):
            problems.append(
                f"tag {py}-{abi_tag}: a wheel with a stable-ABI extension must be "
                f'{EXTENSION_PYTHON_TAG}-{EXTENSION_ABI_TAG} (scikit-build-core: wheel.py-api = "{EXTENSION_PYTHON_TAG}")'
            )
    elif (py, abi_tag) != (PYTHON_TAG, ABI_TAG):
        problems.append(f"tag {py}-{abi_tag}: a wheel without a CPython extension must be {PYTHON_TAG}-{ABI_TAG}")
    archs = set()
    for plat in plats:
        parsed = platform_tag(plat)
        if parsed is None:
            problems.append(f"platform tag {plat} is not a manylinux tag (run auditwheel repair)")
            continue
        glibc, arch = parsed
        archs.add(arch)
        if glibc > MAX_GLIBC:
            problems.append(f"platform tag {plat} is newer than manylinux_{MAX_GLIBC[0]}_{MAX_GLIBC[1]}")
    if len(archs) > 1:
        problems.append(f"platform tags name several CPU architectures: {sorted(archs)}")
    return problems, archs


def _library_problems(member: str, data: bytes, archs: set[str]) -> list[str]:
    problems = []
    arch = machine_of(data[:20])
    if archs and arch not in archs:
        problems.append(f"{member}: an {arch} library in a wheel tagged for {sorted(archs)}")
    try:
        rpaths = _rpaths(data)
    except ValueError as exc:
        return [*problems, f"{member}: {exc}"]
    problems += [
        f"{member}: RPATH/RUNPATH {r!r} points outside the package" for r in rpaths if r and not rpath_inside(member, r)
    ]
    try:
        ending = process_ending(_undefined_symbols(data))
    except ValueError as exc:
        return [*problems, f"{member}: {exc}"]
    if ending:
        problems.append(f"{member}: {ending_problem(ending)}")
    try:
        needs = glibc_needs(data)
    except ValueError as exc:
        return [*problems, f"{member}: {exc}"]
    needs = [(s, v) for s, v in needs if s not in PROCESS_ENDING]  # (refused above, whatever their version)
    if needs:
        problems.append(glibc_problem(member, needs))
    return problems


def _manifest_problems(zf: zipfile.ZipFile, names: list[str], manifest_name: str) -> list[str]:
    base = manifest_name.rsplit("/", 1)[0]
    try:
        found = manifest.parse(zf.read(manifest_name), manifest_name)
    except manifest.ManifestError as exc:
        return [f"{manifest_name}: {exc}"]
    problems = [f"{manifest_name}: {why}" for why in found.problems]
    for art in found.artifacts:
        member = f"{base}/{art.file}"
        if member not in names:
            problems.append(f"{manifest_name} names {art.file}, missing from the wheel")
            continue
        data = zf.read(member)
        if manifest.mismatch(art, len(data), manifest.sha256_hex(data)):
            problems.append(f"{member}: size/sha256 differ from {manifest_name} (changed after the build)")
    return problems


def check_wheel(wheel: Path) -> list[str]:
    """Every problem found in one wheel (an empty list: the wheel may ship)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        problems, archs = _tag_problems(wheel.name, [n for n in names if is_extension(n)])
        for member in names:
            if forbidden(member):
                problems.append(f"{member}: the driver and the shared CUDA runtime are never bundled")
            if member.endswith(".so") or ".so." in member:
                problems += _library_problems(member, zf.read(member), archs)
        for name in names:
            if name.endswith(f"/{manifest.FILE_NAME}") and name.count("/") == 1:
                problems += _manifest_problems(zf, names, name)
    from .variants import check_variant  # a variant wheel: its label, variant.json and properties

    return problems + check_variant(wheel)


def check_wheels(wheels: Sequence[Path], log: Callable[[str], None] = print) -> None:
    """Raises BuildError naming every problem of every wheel; logs one line per good wheel."""
    failures = []
    for wheel in wheels:
        problems = check_wheel(wheel)
        if problems:
            failures.append(f"{wheel.name}:\n  " + "\n  ".join(problems))
        else:
            log(f"ok: {wheel.name} ({wheel.stat().st_size / 1e6:.2f} MB)")
    if failures:
        raise BuildError("wheel check failed:\n" + "\n".join(failures))


def rules_table() -> list[tuple[str, str]]:
    """(rule, what it allows or refuses), for the docs: generated from the tables above."""
    return [
        ("forbidden in a wheel", ", ".join(FORBIDDEN_LIBRARIES)),
        ("a backend library may need (NEEDED)", ", ".join(ALLOWED_NEEDED)),
        ("a backend library exports", f"exactly the {len(EXPORTED)} ABI v{abi.ABI_VERSION} entry points"),
        ("RPATH/RUNPATH", "only $ORIGIN-relative, never above the wheel's root"),
        ("a library may not import", f"{', '.join(PROCESS_ENDING)} (they end the host process; return a status)"),
        (
            "wheel tags",
            f"{PYTHON_TAG}-{ABI_TAG}-manylinux_X_Y_<arch>, X.Y <= {MAX_GLIBC[0]}.{MAX_GLIBC[1]}, one of {', '.join(ARCHS)}",
        ),
        (
            "a wheel with a CPython extension",
            f"only stable-ABI ones (*{EXTENSION_SUFFIX}), tagged {EXTENSION_PYTHON_TAG}-{EXTENSION_ABI_TAG}",
        ),
        ("backend manifest", "every entry's file in the wheel, with the manifest's size and sha256"),
    ]
