"""The shipping gate: what a backend library and a wheel must be before they leave ``dist/``.

The rules are the tables below, one place each; ``check_linkage`` applies them to a
built library, ``check_wheel`` to a wheel (every wheel: cuplug's, the backends', the
variant wheels). The docs' table of them is generated from here.

- no driver (``libcuda``), no shared CUDA runtime, no ``libnvidia-*`` inside a wheel;
- a backend library needs only the C runtime and exports exactly the ABI;
- no library imports ``exit``, ``_exit``, ``_Exit``, ``quick_exit`` or ``abort`` (it would end the host process);
- no NEEDED on a CUDA library (cuBLAS, cuRAND, ...) that the wheel does not declare as a component
  (``components``: Requires-Dist on NVIDIA's wheel), and no RPATH/RUNPATH that leaves the package, except
  the one that finds a declared component's wheel in site-packages;
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

from . import components as _components
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


def check_linkage(so: Path, components: Sequence[_components.Component] = ()) -> None:
    """A backend library needs only what ALLOWED_NEEDED lists (and the sonames of the declared ``components``)
    and exports exactly the ABI."""
    dyn = run(["readelf", "-d", "-W", str(so)], f"readelf {so}")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    declared = {s for c in components for s in c.layout.sonames}
    bad = [n for n in needed if not needed_allowed(n) and n not in declared]
    if bad:
        cuda = [n for n in bad if _components.CUDA_LIBRARY_RE.match(n)]
        hint = f"; {undeclared_problem(cuda[0])}" if cuda else ""
        raise BuildError(
            f"{so} needs {bad}: a backend may link only {', '.join(ALLOWED_NEEDED)} "
            f"(the static CUDA runtime, never libcudart.so or libcuda.so){hint}"
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
        # (.dynsym is a SymbolTableSection, which pyelftools types as a Section; if not, AttributeError says so)
        symbols = list(dynsym.iter_symbols()) if dynsym is not None else []  # type: ignore[attr-defined]
    except (ELFError, AttributeError) as exc:
        raise ValueError(f"not a readable ELF file ({exc})") from exc
    return [s.name for s in symbols if s.name and s["st_shndx"] == "SHN_UNDEF"]


def undeclared_problem(soname: str) -> str:
    """What to do about a NEEDED on a CUDA library that is not a declared component."""
    offered = [c for c in _components.read_lock() if soname in c.layout.sonames]
    if offered:
        c = offered[-1]
        return (
            f"{soname} is cuplug's component {c.name!r}: declare it in the backend's project file "
            f'([tool.cuplug] components = ["{c.name}"]) and link it with cuplug_add_cuda_backend(... COMPONENTS '
            f"{c.name}), so the wheel requires {c.requires} and finds it through "
            f"RPATH {c.rpath()} (docs/build-kit.md)"
        )
    return f"{soname} is a CUDA library cuplug offers no component for: link its static archive or drop it"


def _needed(data: bytes) -> list[str]:
    """DT_NEEDED entries of a shared object; ValueError when it is not a readable ELF."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        sections = list(ELFFile(io.BytesIO(data)).iter_sections())
    except ELFError as exc:
        raise ValueError(f"not a readable ELF file ({exc})") from exc
    return [
        t.needed  # type: ignore[attr-defined]  # pyelftools sets it (setattr) on a DT_NEEDED tag only
        for s in sections
        if isinstance(s, DynamicSection)
        for t in s.iter_tags()
        if t.entry.d_tag == "DT_NEEDED"
    ]


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


def rpath_target(member: str, rpath: str) -> str:
    """The directory an $ORIGIN RPATH entry of ``member`` names, relative to the wheel's root ('' for the root)."""
    parts: list[str] = []
    for part in [*PurePosixPath(member).parent.parts, *PurePosixPath(rpath[len("$ORIGIN") :].lstrip("/")).parts]:
        if part == "..":
            if parts:
                parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


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


def _library_problems(
    member: str,
    data: bytes,
    archs: set[str],
    declared: Sequence[_components.Component] = (),
    tops: set[str] | None = None,
) -> list[str]:
    problems = []
    arch = machine_of(data[:20])
    if archs and arch not in archs:
        problems.append(f"{member}: an {arch} library in a wheel tagged for {sorted(archs)}")
    try:
        rpaths = _rpaths(data)
        needed = _needed(data)
    except ValueError as exc:
        return [*problems, f"{member}: {exc}"]
    sonames = {s for c in declared for s in c.layout.sonames}
    problems += [
        f"{member}: needs {n}, a CUDA library the wheel does not declare; {undeclared_problem(n)}"
        for n in needed
        if _components.CUDA_LIBRARY_RE.match(n) and n not in sonames
    ]
    # The one RPATH allowed out of the package: the site-packages directory of a declared component's wheel.
    component_rpaths = {_components.rpath_for(member, c) for c in declared}
    for r in rpaths:
        if not r or r in component_rpaths:
            continue
        # Inside the wheel's root (site-packages) and into a directory the wheel itself holds: another
        # distribution's directory (nvidia/...) only for a declared component.
        top = rpath_target(member, r).split("/", 1)[0]
        if not rpath_inside(member, r) or (tops is not None and top and top not in tops):
            declared_note = f" (a declared component's would be {sorted(component_rpaths)})" if component_rpaths else ""
            problems.append(f"{member}: RPATH/RUNPATH {r!r} points outside the package{declared_note}")
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


def declared_components(zf: zipfile.ZipFile) -> list[_components.Component]:
    """The components a wheel declares: Requires-Dist on a locked component's NVIDIA wheel, of the CUDA major
    its manifest names (any major without a manifest)."""
    names = zf.namelist()
    metadata = next((n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
    if metadata is None:
        return []
    major = None
    for n in names:
        if n.endswith(f"/{manifest.FILE_NAME}") and n.count("/") == 1:
            try:
                major = manifest.parse(zf.read(n), n).cuda or None
            except manifest.ManifestError:
                pass  # _manifest_problems names it
    return _components.wheel_components(zf.read(metadata).decode(errors="replace"), major)


def check_wheel(wheel: Path) -> list[str]:
    """Every problem found in one wheel (an empty list: the wheel may ship)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        problems, archs = _tag_problems(wheel.name, [n for n in names if is_extension(n)])
        declared = declared_components(zf)
        for member in names:
            if forbidden(member):
                problems.append(f"{member}: the driver and the shared CUDA runtime are never bundled")
            if member.endswith(".so") or ".so." in member:
                tops = {n.split("/", 1)[0] for n in names}
                problems += _library_problems(member, zf.read(member), archs, declared, tops)
                if any(member.rsplit("/", 1)[-1] in c.layout.sonames for c in declared):
                    problems.append(f"{member}: a declared component's library is required, never bundled")
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
            with zipfile.ZipFile(wheel) as zf:
                declared = declared_components(zf)
            used = "".join(f"; component {c.name}: requires {c.requires}, RPATH {c.rpath()}" for c in declared)
            log(f"ok: {wheel.name} ({wheel.stat().st_size / 1e6:.2f} MB{used})")
    if failures:
        raise BuildError("wheel check failed:\n" + "\n".join(failures))


def rules_table() -> list[tuple[str, str]]:
    """(rule, what it allows or refuses), for the docs: generated from the tables above."""
    return [
        ("forbidden in a wheel", ", ".join(FORBIDDEN_LIBRARIES)),
        ("a backend library may need (NEEDED)", ", ".join(ALLOWED_NEEDED)),
        ("a backend library exports", f"exactly the {len(EXPORTED)} ABI v{abi.ABI_VERSION} entry points"),
        (
            "a CUDA library (NEEDED)",
            "only a declared component's ("
            + ", ".join(
                f"{n}: {', '.join(sorted({s for c in _components.read_lock() if c.name == n for s in c.layout.sonames}))}"
                for n in _components.NAMES
            )
            + "), with Requires-Dist on its NVIDIA wheel",
        ),
        (
            "RPATH/RUNPATH",
            "only $ORIGIN-relative, never above the wheel's root; or a declared component's wheel in site-packages",
        ),
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
