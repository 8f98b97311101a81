"""Optional toolchain components: cuBLAS (with cuBLASLt) and cuRAND, declared per backend.

A backend names the NVIDIA libraries it calls in its project file::

    [tool.cuplug]
    components = ["cublas"]

and passes ``COMPONENTS cublas`` to ``cuplug_add_cuda_backend()``. ``python -m cuplug.kit variants`` then
installs each declared component for the major it builds (NVIDIA's PyPI wheel, pinned by exact version and
sha256 in ``toolchains/components.txt``, into ``<cache>/components/<major>-<dist>-<version>-<digest>``), hands
its headers and libraries to CMake, allows the build check the component's sonames and writes
``components.json`` into the build directory. ``python -m cuplug.kit wheel`` reads that file: the backend
wheel gets ``Requires-Dist`` on the NVIDIA wheel (``>=`` the pinned version, ``<`` the next major: the
soname's ABI), auditwheel leaves the libraries out, and each artifact finds them at run time through an
RPATH relative to site-packages (``$ORIGIN/../../nvidia/cu13/lib``), as PyTorch does. The gate
(``gate.check_wheel``) refuses a NEEDED on any CUDA library the wheel does not declare that way.

Why linked dynamically and not statically (docs/toolchains.md, measured): CUDA 13 has no static cuBLAS on
PyPI at all, and CUDA 12.4's ``libcublas_static.a`` (172 MB) + ``libcublasLt_static.a`` (704 MB) make a
one-``cublasSgemm`` library of 107 MB (68 MB gzipped) per variant, carrying cuBLAS's own SASS for sm_50 to
sm_90 whatever the variant declares, which the device-code check refuses.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath

from .process import BuildError
from .resources import toolchains_dir

Log = Callable[[str], None]
LOCK_NAME = "components.txt"
FILE_NAME = "components.json"  # beside manifest.json in a build directory


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a component's wheel puts its files under site-packages, and what it provides."""

    prefix: str  # "nvidia/cu13": include/ and lib/ below it
    sonames: tuple[str, ...]  # the shared libraries a backend may link (and then NEEDs)
    header: str  # one header that must be there after the install


# (component, major) -> layout. cuBLASLt comes in cuBLAS's wheel: the component "cublas" is both.
LAYOUTS: dict[tuple[str, str], Layout] = {
    ("cublas", "cuda12"): Layout("nvidia/cublas", ("libcublas.so.12", "libcublasLt.so.12"), "cublas_v2.h"),
    ("curand", "cuda12"): Layout("nvidia/curand", ("libcurand.so.10",), "curand.h"),
    ("cublas", "cuda13"): Layout("nvidia/cu13", ("libcublas.so.13", "libcublasLt.so.13"), "cublas_v2.h"),
    ("curand", "cuda13"): Layout("nvidia/cu13", ("libcurand.so.10",), "curand.h"),
}
NAMES = tuple(sorted({c for c, _ in LAYOUTS}))
# Shared libraries of the CUDA toolkit by soname: a NEEDED on one of these is a CUDA library dependency,
# allowed only for a declared component (the driver, libcuda, is refused as a file and never linked).
CUDA_LIBRARY_RE = re.compile(
    r"^lib(cublas|cublasLt|curand|cufft|cufftw|cusparse|cusparseLt|cusolver|cusolverMg|nvrtc|nvrtc-builtins|"
    r"nvJitLink|nvjpeg|npp\w*|nvToolsExt|cupti|cufile|nvblas|nvfatbin|cudart)\.so(\.\d+)*$"
)
# A backend library sits at <package>/<variant>/lib.so in its wheel: two levels below site-packages.
ARTIFACT_DEPTH = 2


@dataclasses.dataclass(frozen=True)
class Component:
    """One pinned component wheel of one CUDA major."""

    name: str
    major: str
    dist: str
    version: str
    sha256: str

    @property
    def layout(self) -> Layout:
        return LAYOUTS[(self.name, self.major)]

    @property
    def requires(self) -> str:
        """The backend wheel's Requires-Dist: this version or a newer one of the same soname (major)."""
        return f"{self.dist}>={self.version},<{int(self.version.split('.')[0]) + 1}"

    def rpath(self, depth: int = ARTIFACT_DEPTH) -> str:
        """The RPATH of an artifact ``depth`` directories below site-packages."""
        return f"$ORIGIN/{'../' * depth}{self.layout.prefix}/lib"


def read_lock(path: Path | None = None) -> list[Component]:
    path = path or toolchains_dir() / LOCK_NAME
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            major, name, dist, version, sha = line.split()
            if (name, major) not in LAYOUTS:
                raise BuildError(f"{path}: row {name} {major} has no layout in cuplug.kit.components.LAYOUTS")
            rows.append(Component(name, major, dist, version, sha))
    return rows


def pinned(name: str, major: str) -> Component:
    """The locked component ``name`` of ``major``; a BuildError naming the known ones otherwise."""
    lock = read_lock()
    for c in lock:
        if (c.name, c.major) == (name, major):
            return c
    known = sorted({c.name for c in lock if c.major == major})
    raise BuildError(
        f"unknown toolchain component {name!r} for {major}; cuplug offers {', '.join(known)} "
        f"(cuBLASLt is part of 'cublas'; docs/toolchains.md)"
    )


def project_file(source: Path) -> Path | None:
    """The backend's project file: the first pyproject.toml in ``source`` or a directory above it."""
    for d in (source.resolve(), *source.resolve().parents):
        if (d / "pyproject.toml").is_file():
            return d / "pyproject.toml"
    return None


def declared(project: Path | None) -> list[str]:
    """``[tool.cuplug] components`` of a project file (none without the file or the key), checked."""
    if project is None:
        return []
    try:
        doc = tomllib.loads(project.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BuildError(f"{project}: cannot read [tool.cuplug] ({exc})") from exc
    names = doc.get("tool", {}).get("cuplug", {}).get("components", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BuildError(f'{project}: [tool.cuplug] components must be a list of names, e.g. ["cublas"]')
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise BuildError(
            f"{project}: [tool.cuplug] components names {', '.join(unknown)}; cuplug offers {', '.join(NAMES)} "
            "(cuBLASLt is part of 'cublas')"
        )
    return sorted(set(names))


@dataclasses.dataclass(frozen=True)
class Installed:
    component: Component
    site: Path  # the --target directory: site/<layout.prefix>/{include,lib}

    @property
    def include_dir(self) -> Path:
        return self.site / self.component.layout.prefix / "include"

    @property
    def lib_dir(self) -> Path:
        return self.site / self.component.layout.prefix / "lib"


def install(name: str, major: str, log: Log = print, python: str = sys.executable) -> Installed:
    """Installs (or reuses) one pinned component wheel into the user cache."""
    from . import toolchain  # its cache root, pinned pip install and .complete convention

    c = pinned(name, major)
    dest = toolchain.cache_root() / "components" / f"{major}-{c.dist}-{c.version}-{c.sha256[:12]}"
    got = Installed(c, dest / "site")
    if toolchain._reusable(f"{major}/{name}", dest, log):
        return got
    toolchain._fresh_dir(dest)
    req = dest / "requirements.txt"
    req.write_text(f"{c.dist}=={c.version} --hash=sha256:{c.sha256}\n")
    log(f"{major}/{name}: pip install of {c.dist}=={c.version} (pinned by sha256)")
    toolchain.pip_install_locked(
        python, got.site, req, f"pip install of the {name} component for {major} (retry; check that PyPI is reachable)"
    )
    missing = [s for s in c.layout.sonames if not (got.lib_dir / s).is_file()]
    if not (got.include_dir / c.layout.header).is_file():
        missing.append(f"include/{c.layout.header}")
    if missing:
        raise BuildError(f"{major}/{name}: {c.dist}=={c.version} lacks {', '.join(missing)} under {got.site}")
    (dest / ".complete").write_text(req.read_text())
    log(f"{major}/{name}: {c.dist} {c.version} ready at {got.site}")
    return got


def cmake_args(installed: Sequence[Installed]) -> list[str]:
    """What cuplug.cmake needs to make the ``cuplug::<name>`` targets of the declared components."""
    args = [f"-DCUPLUG_COMPONENTS={';'.join(i.component.name for i in installed)}"]
    for i in installed:
        n = i.component.name
        args += [
            f"-DCUPLUG_COMPONENT_{n}_INCLUDE_DIR={i.include_dir}",
            f"-DCUPLUG_COMPONENT_{n}_LIBRARY_DIR={i.lib_dir}",
            f"-DCUPLUG_COMPONENT_{n}_LIBRARIES={';'.join(i.component.layout.sonames)}",
            f"-DCUPLUG_COMPONENT_{n}_RPATH={i.component.rpath()}",
        ]
    return args


def record(build_dir: Path, major: str, installed: Iterable[Installed]) -> Path:
    """``components.json`` in the build directory: what the wheel must require (always written, maybe empty)."""
    doc = {
        "cuda": major,
        "components": [
            {
                "name": i.component.name,
                "dist": i.component.dist,
                "version": i.component.version,
                "requires": i.component.requires,
                "sonames": list(i.component.layout.sonames),
                "rpath": i.component.rpath(),
            }
            for i in installed
        ],
    }
    path = build_dir / FILE_NAME
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def recorded(build_dir: Path) -> list[dict]:
    """The components a build directory was built with (an older build without the file: none)."""
    path = build_dir / FILE_NAME
    if not path.is_file():
        return []
    return json.loads(path.read_text())["components"]


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(metadata: str) -> set[str]:
    """The distribution names of a METADATA's Requires-Dist lines (normalized)."""
    names = set()
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split(":", 1)[1])
            if m:
                names.add(_dist_key(m.group(1)))
    return names


def wheel_components(metadata: str, major: str | None) -> list[Component]:
    """The components a wheel declares: the locked ones (of its major, if known) whose wheel it requires."""
    required = requirement_names(metadata)
    return [c for c in read_lock() if _dist_key(c.dist) in required and (major is None or c.major == major)]


def rpath_for(member: str, component: Component) -> str:
    """The RPATH that finds ``component`` from ``member``, a library at that path in the wheel (site-packages)."""
    return component.rpath(len(PurePosixPath(member).parts) - 1)
