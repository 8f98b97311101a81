"""Build every variant of a CUDA backend with CMake, read back what is inside, write the manifest.

The manifest's device-code facts (``sass``, ``ptx``, ``ptx_isa``) come from the
built file through the toolkit's own ``cuobjdump``, never from the matrix; the
build fails when they differ from what the matrix declares, when a device image
is embedded twice, when a library needs more than the C runtime, or when it
exports anything but the ABI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from cuplug import abi
from cuplug.elfarch import file_arch
from cuplug.manifest import MANIFEST_SCHEMA

from .toolchain import Toolchain, ToolchainError, sha256_file

Log = Callable[[str], None]
ALLOWED_NEEDED = re.compile(
    r"^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so\.\d+$|^ld-linux-(x86-64\.so\.2|aarch64\.so\.1)$"
)
ABI_SYMBOLS = frozenset(abi.SYMBOLS)  # the loader's binding is the one list of ABI entry points
RUNTIME_MIN_DRIVER = {"12": 12000, "13": 13000}  # CUDA minor-version compatibility: any driver of the major


class BuildError(RuntimeError):
    """The build or one of its checks failed; the message names the variant and the check."""


def _run(cmd: list[str], step: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise BuildError(
            f"{step} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return proc.stdout + proc.stderr


def load_matrix(path: Path) -> dict:
    matrix = json.loads(path.read_text())
    if matrix.get("schema") != 1 or not isinstance(matrix.get("variants"), dict):
        raise BuildError(f"{path}: expected {{'schema': 1, 'variants': {{...}}}}")
    return matrix


def toolkit_archs(tc: Toolchain) -> list[int]:
    out = _run([str(tc.nvcc), "--list-gpu-arch"], f"{tc.major}: nvcc --list-gpu-arch")
    return sorted({int(a) for a in re.findall(r"compute_(\d+)", out)})


def expected_targets(matrix: dict, variant: str, archs: list[int]) -> tuple[list[str], list[str]]:
    """What a variant must contain: (sass, ptx) names, from the matrix and the toolkit's arch list."""
    if variant not in matrix["variants"]:
        raise BuildError(f"unknown variant {variant!r}; the matrix has {sorted(matrix['variants'])}")
    spec = matrix["variants"][variant]
    usable = [a for a in archs if a >= int(matrix["min_arch"])]

    def expand(value: object, kind: str) -> list[int]:
        if value == "all":
            return usable
        if value == "newest":
            return usable[-1:]
        if not isinstance(value, list):
            raise BuildError(f"variant {variant}: {kind} = {value!r} (use a list, 'all' or 'newest')")
        for a in value:
            if int(a) not in archs:
                raise BuildError(f"variant {variant}: arch {a} is not supported by this nvcc (it has {archs})")
        return [int(a) for a in value]

    return ([f"sm_{a}" for a in expand(spec["sass"], "sass")], [f"compute_{a}" for a in expand(spec["ptx"], "ptx")])


def read_device_code(tc: Toolchain, so: Path) -> tuple[list[str], list[str], str | None]:
    """(sass, ptx, ptx_isa) of a built library, read by the toolkit's cuobjdump."""
    listing = subprocess.run(
        [str(tc.cuobjdump), "--list-elf", "--list-ptx", str(so)], capture_output=True, text=True, check=False
    ).stdout
    sass = re.findall(r"^ELF file\s+\d+: .*\.(sm_\d+[af]?)\.cubin$", listing, re.M)
    ptx = [t.replace("sm_", "compute_") for t in re.findall(r"^PTX file\s+\d+: .*\.(sm_\d+[af]?)\.ptx$", listing, re.M)]
    for kind, names in (("SASS", sass), ("PTX", ptx)):
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise BuildError(f"{so}: {kind} {dupes} embedded more than once (one-step nvcc -shared?)")
    isa = None
    if ptx:
        text = subprocess.run([str(tc.cuobjdump), "-ptx", str(so)], capture_output=True, text=True, check=False).stdout
        versions = sorted(set(re.findall(r"^\s*\.version\s+(\d+\.\d+)", text, re.M)))
        if len(versions) != 1:
            raise BuildError(f"{so}: expected one PTX ISA version, found {versions}")
        isa = versions[0]
    return sorted(sass, key=lambda t: int(re.sub(r"\D", "", t))), ptx, isa


def check_linkage(so: Path) -> None:
    """Needs only the C runtime; exports exactly the ABI."""
    dyn = _run(["readelf", "-d", "-W", str(so)], f"readelf {so}")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    bad = [n for n in needed if not ALLOWED_NEEDED.match(n)]
    if bad:
        raise BuildError(
            f"{so} needs {bad}: a backend may link only libc/libm/libdl/libpthread/librt/"
            "libstdc++/libgcc_s (static CUDA runtime, never libcudart.so or libcuda.so)"
        )
    syms = _run(["nm", "-D", "--defined-only", str(so)], f"nm {so}")
    exported = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    if exported != ABI_SYMBOLS:
        raise BuildError(f"{so} exports {sorted(exported ^ ABI_SYMBOLS)} beyond/short of the ABI")


def build_backend(
    tc: Toolchain,
    source_dir: Path,
    build_dir: Path,
    *,
    sysroot: Path | None = None,
    matrix_path: Path | None = None,
    backend: str = "vector",
    log: Log = print,
    cmake: str = "cmake",
    env: dict[str, str] | None = None,
) -> Path:
    """Configures and builds every variant; checks each; writes ``build_dir/manifest.json``."""
    from cuplug.select import ptx_driver_needed  # the PTX ISA -> driver table lives with the loader

    for compiler in ("cc", "c++"):
        if shutil.which(compiler, path=(env or os.environ).get("PATH")) is None:
            raise BuildError(
                f"no `{compiler}` on PATH: nvcc needs a host C/C++ compiler (Debian: apt-get install gcc g++)"
            )
    matrix_path = matrix_path or source_dir / "variants.json"
    matrix = load_matrix(matrix_path)
    variants = sorted(matrix["variants"])
    archs = toolkit_archs(tc)
    build_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log(f"{tc.major}: configuring {', '.join(variants)} for {tc.arch} (nvcc {tc.version}, archs {archs})")
    _run(
        [
            cmake,
            "-S",
            str(source_dir),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_CUDA_COMPILER={tc.nvcc}",
            *tc.cmake_args,
            f"-DCUPLUG_SYSROOT={sysroot or ''}",
            f"-DCUPLUG_MATRIX={matrix_path}",
        ],
        f"{tc.major}: cmake configure",
        env=env,
    )
    log(f"{tc.major}: compiling {len(variants)} variants")
    out = _run(
        [cmake, "--build", str(build_dir), "--parallel", str(os.cpu_count() or 2)],
        f"{tc.major}: cmake --build",
        env=env,
    )
    if "ninja: no work to do" in out:
        log(f"{tc.major}: up to date")
    entries = []
    for variant in variants:
        so = build_dir / variant / f"libcuplug_{backend}.so"
        if not so.is_file():
            raise BuildError(f"{tc.major}/{variant}: {so} was not built")
        sass, ptx, isa = read_device_code(tc, so)
        want_sass, want_ptx = expected_targets(matrix, variant, archs)
        if (sass, ptx) != (sorted(want_sass, key=lambda t: int(t[3:])), want_ptx):
            raise BuildError(
                f"{tc.major}/{variant}: built file holds SASS {sass} PTX {ptx}, "
                f"the matrix declares SASS {want_sass} PTX {want_ptx}"
            )
        check_linkage(so)
        arch = file_arch(str(so))  # from the ELF header, never typed
        if arch != tc.arch:
            raise BuildError(f"{tc.major}/{variant}: {so} is built for {arch}, the toolchain targets {tc.arch}")
        min_driver = RUNTIME_MIN_DRIVER[tc.version.split(".")[0]]
        if ptx and not sass:  # PTX-only: the JIT gate is part of what the artifact needs
            min_driver = max(min_driver, ptx_driver_needed(isa) or min_driver)
        entries.append(
            {
                "backend": backend,
                "variant": variant,
                "file": f"{variant}/{so.name}",
                "sha256": sha256_file(so),
                "size": so.stat().st_size,
                "sass": sass,
                "ptx": ptx,
                "ptx_isa": isa,
                "cuda_version": tc.version,
                "min_driver": min_driver,
                "abi": abi.ABI_VERSION,
                "arch": arch,
            }
        )
        log(
            f"{tc.major}/{variant}: {arch}, {so.stat().st_size:,} B, SASS {','.join(sass) or '-'}, "
            f"PTX {','.join(ptx) or '-'}{f' (ISA {isa})' if isa else ''}"
        )
    manifest = {"schema": MANIFEST_SCHEMA, "cuda": tc.major, "artifacts": entries}
    (build_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"{tc.major}: manifest written, {len(entries)} artifacts in {time.perf_counter() - t0:.1f} s")
    return build_dir / "manifest.json"


__all__ = ["BuildError", "ToolchainError", "build_backend", "check_linkage", "read_device_code"]
