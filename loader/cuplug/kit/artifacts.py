"""Build every variant of a CUDA backend with CMake, read back what is inside, write the manifest.

``build_backend(spec)`` runs three steps: :func:`configure_and_build` (CMake + Ninja,
every variant of the matrix), :func:`describe` (each built library read back and
checked: its device code by ``devicecode``, its linkage by the shipping ``gate``, its CPU
from the ELF header), and ``contract.manifest.write``. The build fails when the facts
differ from what the matrix declares, when a device image is embedded twice, when a
library needs more than the C runtime, or when it exports anything but the ABI.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from cuplug.contract import abi, manifest, targets
from cuplug.contract.cuda import ptx_driver_needed, runtime_min_driver
from cuplug.contract.elfarch import file_arch
from cuplug.contract.manifest import Artifact

from . import components as _components
from . import devicecode, gate
from .devicecode import Image, check_images, list_images, read_device_code
from .process import BuildError, run
from .toolchain import Toolchain, sha256_file

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """One backend built for one toolchain: what every step of ``build_backend`` needs."""

    toolchain: Toolchain
    source_dir: Path  # holds the backend's CMakeLists.txt
    build_dir: Path  # one subdirectory per variant, and manifest.json
    backend: str = "vector"
    matrix_path: Path | None = None  # default: source_dir / variants.json
    sysroot: Path | None = None
    cmake: str = "cmake"
    env: Mapping[str, str] | None = None  # default: os.environ without a system CUDA
    log: Log = print
    components: tuple[_components.Installed, ...] = ()  # the declared ones ([tool.cuplug] components), installed

    @property
    def matrix(self) -> Path:
        return self.matrix_path or self.source_dir / "variants.json"

    @property
    def run_env(self) -> dict[str, str]:
        from .process import without_system_cuda

        return without_system_cuda(self.env)


MATRIX_SHAPE = "{'schema': 1, 'min_arch': '75', 'variants': {...}} (backends/variants.json is one)"


def load_matrix(path: Path) -> dict:
    """The variant matrix at ``path``, its shape checked: CMake reads the same file and would stop on the same
    faults with less to say."""
    try:
        matrix = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nesting
        raise BuildError(f"{path}: cannot read the variant matrix: {type(exc).__name__}: {exc}") from exc
    if (
        not isinstance(matrix, dict)
        or type(matrix.get("schema")) is not int  # true and 1.0 equal 1 but are not it
        or matrix["schema"] != 1
        or not isinstance(matrix.get("variants"), dict)
        or not re.fullmatch(r"[0-9]+", str(matrix.get("min_arch", "")))  # ASCII digits: "²".isdigit() is True
    ):
        raise BuildError(f"{path}: expected {MATRIX_SHAPE}")
    return matrix


def toolkit_archs(tc: Toolchain) -> list[int]:
    out = run([str(tc.nvcc), "--list-gpu-arch"], f"{tc.major}: nvcc --list-gpu-arch")
    return sorted({int(a) for a in re.findall(r"compute_(\d+)", out)})


def expected_targets(
    matrix: dict, variant: str, archs: list[int], cuda_version: str | None = None
) -> tuple[list[str], list[str]]:
    """What a variant must contain: (sass, ptx) names, from the matrix and the toolkit's arch list. A listed arch
    may carry the contract's suffix (90a, 100f); one the toolkit cannot build is refused with the fix
    (contract/targets.buildable: an arch a newer CUDA renamed or dropped, a kind too new for it)."""
    if variant not in matrix["variants"]:
        raise BuildError(f"unknown variant {variant!r}; the matrix has {sorted(matrix['variants'])}")
    spec = matrix["variants"][variant]
    usable = [str(a) for a in archs if a >= int(matrix["min_arch"])]
    listed = frozenset(str(a) for a in archs)
    version = _version_number(cuda_version) if cuda_version else None

    def expand(value: object, kind: str) -> list[str]:
        if value == "all":
            return usable
        if value == "newest":
            return usable[-1:]
        if not isinstance(value, list):
            raise BuildError(f"variant {variant}: {kind} = {value!r} (use a list, 'all' or 'newest')")
        for a in value:
            buildable_target(variant, kind, a, version, listed)
        return [str(a) for a in value]

    return ([f"sm_{a}" for a in expand(spec["sass"], "sass")], [f"compute_{a}" for a in expand(spec["ptx"], "ptx")])


def expected_lto(matrix: dict, variant: str, archs: list[int], cuda_version: str | None = None) -> list[str]:
    """The LTO-IR targets a variant declares ("lto": ["75"], docs/lto.md): an LTO variant is device-linked, so it
    holds SASS (its registered image, the first "sass" arch) and no PTX."""
    spec = matrix["variants"][variant]
    value = spec.get("lto", [])
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise BuildError(f'variant {variant}: lto = {value!r} (use a list of arch numbers like ["75"])')
    if not value:
        return []
    if spec.get("ptx") or not isinstance(spec.get("sass"), list) or not spec["sass"]:
        raise BuildError(
            f'variant {variant}: an LTO variant lists its SASS (the device link\'s image, e.g. "sass": '
            f"[{value[0]!r}]) and no PTX (a device link keeps SASS only)"
        )
    version = _version_number(cuda_version) if cuda_version else None
    listed = frozenset(str(a) for a in archs)
    found = {buildable_target(variant, "lto", a, version, listed) for a in value}
    return [t.text for t in sorted(found, key=lambda t: t.cc)]  # as the file is read: by arch, once each


# The spelling of a matrix list's arch numbers as targets: "90a" in "sass" is sm_90a.
_PREFIX = {"sass": "sm", "ptx": "compute", "lto": "lto"}


def buildable_target(
    variant: str, kind: str, arch: object, version: int | None, listed: frozenset[str]
) -> targets.Target:
    """One arch number of a variant's ``kind`` list ("sass", "ptx", "lto") as a target a toolkit of ``version``
    that lists ``listed`` can build; a BuildError naming the variant and the fix otherwise."""
    try:
        target = targets.parse(f"{_PREFIX[kind]}_{arch}")
    except ValueError as exc:
        raise BuildError(f"variant {variant}: {kind} lists {arch!r}: {exc}") from None
    why = targets.buildable(target, version, listed)
    if why:
        raise BuildError(f"variant {variant}: {why}")
    return target


def _version_number(version: str) -> int:
    """'12.4' -> 12040 (cudaRuntimeGetVersion's form)."""
    major, _, minor = version.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


def build_summary(ninja_output: str) -> str:
    """What a `cmake --build` (Ninja) did: "up to date", or the sources compiled and libraries linked."""
    if "ninja: no work to do" in ninja_output:
        return "up to date (nothing compiled or linked)"
    compiled = re.findall(r"^\[\d+/\d+\] Building \w+ object \S*?\.dir/(\S+)\.o$", ninja_output, re.M)
    linked = re.findall(r"^\[\d+/\d+\] Linking \w+ shared library (\S+)$", ninja_output, re.M)
    counts = {src: compiled.count(src) for src in sorted(set(compiled))}
    what = ", ".join(f"{src} x{n}" for src, n in counts.items()) or "nothing"
    return f"compiled {len(compiled)} objects ({what}), linked {len(linked)} libraries"


# A variant heavier than these gets a warning with the usual remedies (issue 32: a softmax of OneFlow's took
# 477 s / 853 s of nvcc and 54 / 69 MB on CUDA 12 / 13 and said nothing).
HEAVY_SECONDS = 180.0
HEAVY_BYTES = 32 << 20
HEAVY_REMEDIES = (
    "fewer architectures (a variant matrix of your own: the dedicated sm_XX variants and PTX, or family targets "
    "sm_XXf on CUDA >= 12.9, instead of every SASS in the fatbin), nvcc --threads N (CUDA_FLAGS: compiles the "
    "architectures of one file in parallel), fewer template instantiations (cuplug_dispatch<Mask> instantiates only "
    "the dtypes an op takes), -Xptxas -O1 for code that is not hot, and no -G/-lineinfo in release builds"
)


def ninja_times(build_dir: Path, since_ns: int, variants: list[str]) -> dict[str, float]:
    """Seconds of compiling and linking per variant in the build that started at ``since_ns`` (time.time_ns()):
    read from Ninja's own log (start and end of every output in milliseconds, and the output's mtime in
    nanoseconds: an entry whose output is older than the build is an earlier build's), never timed here. Not by
    the log's length: Ninja recompacts the log when it has grown, and a byte offset then points past it (issue
    33's sm90a variant, built while the log was recompacted, read as 0 s)."""
    log = build_dir / ".ninja_log"
    times = dict.fromkeys(variants, 0.0)
    if not log.is_file():
        return times
    for line in log.read_bytes().decode(errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 4 or not all(p.isdigit() for p in parts[:3]) or int(parts[2]) < since_ns:
            continue
        output = parts[3]
        for variant in variants:  # an object of target cuplug_<name>_<variant>, or <variant>/lib...so
            if f"_{variant}.dir/" in output or output.startswith(f"{variant}/"):
                times[variant] += (int(parts[1]) - int(parts[0])) / 1000
                break
    return times


def heavy(variant: str, seconds: float, size: int) -> str | None:
    """A warning for a variant over HEAVY_SECONDS or HEAVY_BYTES, naming the remedies; None otherwise."""
    over = []
    if seconds > HEAVY_SECONDS:
        over.append(f"{seconds:.0f} s of compiling (over {HEAVY_SECONDS:.0f})")
    if size > HEAVY_BYTES:
        over.append(f"{size / 1e6:.1f} MB (over {HEAVY_BYTES / 1e6:.0f})")
    return f"warning: {variant} is heavy: {' and '.join(over)}. Remedies: {HEAVY_REMEDIES}" if over else None


def configure_and_build(spec: BuildSpec, variants: list[str], archs: list[int]) -> str:
    """CMake configure + build of every variant; what Ninja did, in one line."""
    tc, env = spec.toolchain, spec.run_env
    ninja = shutil.which("ninja", path=env.get("PATH"))
    spec.build_dir.mkdir(parents=True, exist_ok=True)
    spec.log(f"{tc.major}: configuring {', '.join(variants)} for {tc.arch} (nvcc {tc.version}, archs {archs})")
    run(
        [
            spec.cmake,
            "-S",
            str(spec.source_dir),
            "-B",
            str(spec.build_dir),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_CUDA_COMPILER={tc.nvcc}",
            *tc.cmake_args,
            f"-DCUPLUG_SYSROOT={spec.sysroot or ''}",
            f"-DCUPLUG_MATRIX={spec.matrix}",
            *_components.cmake_args(spec.components),
            # The interpreter running this build (a project's `python -m cuplug --cmake-dir` then finds
            # this cuplug), and this PATH's ninja: not what an earlier run's venv left in the cache.
            f"-DPython_EXECUTABLE={sys.executable}",
            *([f"-DCMAKE_MAKE_PROGRAM={os.path.abspath(ninja)}"] if ninja else []),
        ],
        f"{tc.major}: cmake configure",
        env=env,
    )
    spec.log(f"{tc.major}: compiling {len(variants)} variants")
    out = run(
        [spec.cmake, "--build", str(spec.build_dir), "--parallel", str(os.cpu_count() or 2)],
        f"{tc.major}: cmake --build",
        env=env,
    )
    return build_summary(out)


def describe(spec: BuildSpec, variant: str, matrix: dict, archs: list[int]) -> Artifact:
    """The manifest entry of one built variant, every fact read from the file and checked."""
    tc = spec.toolchain
    so = spec.build_dir / variant / f"libcuplug_{spec.backend}.so"
    if not so.is_file():
        raise BuildError(f"{tc.major}/{variant}: {so} was not built")
    want_lto = expected_lto(matrix, variant, archs, tc.version)
    sass, ptx, isa, lto = read_device_code(tc, so, lto=bool(want_lto))
    want_sass, want_ptx = expected_targets(matrix, variant, archs, tc.version)
    if lto != want_lto:
        raise BuildError(f"{tc.major}/{variant}: built file holds LTO-IR {lto}, the matrix declares {want_lto}")
    if (sass, ptx) != (sorted(want_sass, key=devicecode._arch_key), sorted(want_ptx, key=devicecode._arch_key)):
        raise BuildError(
            f"{tc.major}/{variant}: built file holds SASS {sass} PTX {ptx}, "
            f"the matrix declares SASS {want_sass} PTX {want_ptx} (the architectures come from the matrix: "
            "an -arch/-gencode added to the target, or device code of a linked static library?)"
        )
    gate.check_linkage(so, [i.component for i in spec.components])
    arch = file_arch(str(so))  # from the ELF header, never typed
    if arch != tc.arch:
        raise BuildError(f"{tc.major}/{variant}: {so} is built for {arch}, the toolchain targets {tc.arch}")
    min_driver = runtime_min_driver(tc.version)
    if ptx and not sass:  # PTX-only: the JIT gate is part of what the artifact needs
        min_driver = max(min_driver, ptx_driver_needed(isa) or min_driver)
    return Artifact(
        backend=spec.backend,
        variant=variant,
        file=f"{variant}/{so.name}",
        sha256=sha256_file(so),
        size=so.stat().st_size,
        sass=tuple(sass),
        ptx=tuple(ptx),
        ptx_isa=isa,
        cuda_version=tc.version,
        min_driver=min_driver,
        abi=abi.ABI_VERSION,
        arch=arch or "",
        lto=tuple(lto),
    )


def check_host_compilers(env: Mapping[str, str]) -> None:
    for compiler in ("cc", "c++"):
        if shutil.which(compiler, path=env.get("PATH")) is None:
            raise BuildError(
                f"no `{compiler}` on PATH: nvcc needs a host C/C++ compiler (Debian: apt-get install gcc g++)"
            )


def build_backend(spec: BuildSpec) -> Path:
    """Configures and builds every variant; checks each; writes ``build_dir/manifest.json``."""
    check_host_compilers(spec.run_env)
    tc = spec.toolchain
    matrix = load_matrix(spec.matrix)
    variants = sorted(matrix["variants"])
    archs = toolkit_archs(tc)
    for variant in variants:  # a target this toolkit cannot build is named before CMake runs
        expected_targets(matrix, variant, archs, tc.version)
    t0 = time.perf_counter()
    since_ns = time.time_ns() // 1_000_000_000 * 1_000_000_000  # whole seconds: coarse file timestamps count too
    spec.log(f"{tc.major}: {configure_and_build(spec, variants, archs)}")
    seconds = ninja_times(spec.build_dir, since_ns, variants)
    artifacts, report, warnings = [], {}, []
    for variant in variants:
        art = describe(spec, variant, matrix, archs)
        artifacts.append(art)
        built = f", built in {seconds[variant]:.1f} s" if seconds[variant] else ", up to date"
        spec.log(
            f"{tc.major}/{variant}: {art.arch}, {art.size:,} B, SASS {','.join(art.sass) or '-'}, "
            f"PTX {','.join(art.ptx) or '-'}{f' (ISA {art.ptx_isa})' if art.ptx_isa else ''}"
            f"{', LTO-IR ' + ','.join(art.lto) if art.lto else ''}{built}"
        )
        report[variant] = {"bytes": art.size, "seconds": round(seconds[variant], 3)}
        warning = heavy(f"{tc.major}/{variant}", seconds[variant], art.size)
        if warning:
            warnings.append(warning)
    for warning in warnings:  # after the table: the last lines a user reads
        spec.log(warning)
    # The build report beside the manifest: per variant its size and this build's compile seconds (0: up to date).
    (spec.build_dir / "build-report.json").write_text(json.dumps({"cuda": tc.major, "variants": report}, indent=1))
    # What the backend wheel must require (and auditwheel leave out): python -m cuplug.kit wheel reads it.
    _components.record(spec.build_dir, tc.major, spec.components)
    path = manifest.write(spec.build_dir, tc.major, artifacts)
    spec.log(f"{tc.major}: manifest written, {len(artifacts)} artifacts in {time.perf_counter() - t0:.1f} s")
    return Path(path)


__all__ = [
    "BuildError",
    "BuildSpec",
    "Image",
    "build_backend",
    "check_images",
    "devicecode",
    "list_images",
    "read_device_code",
]
