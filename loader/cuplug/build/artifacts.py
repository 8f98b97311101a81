"""Build every variant of a CUDA backend with CMake, read back what is inside, write the manifest.

The manifest's device-code facts (``sass``, ``ptx``, ``ptx_isa``) come from the
built file through the toolkit's own ``cuobjdump``, never from the matrix; the
build fails when they differ from what the matrix declares, when a device image
is embedded twice, when a library needs more than the C runtime, or when it
exports anything but the ABI.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cuplug import abi, fatbin
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


@dataclasses.dataclass(frozen=True)
class Image:
    """One device code image of a library, as cuobjdump lists it."""

    target: str  # "sm_80" (SASS) or "compute_80" (PTX)
    kernels: tuple[str, ...]  # mangled entry function names
    isa: str | None = None  # PTX ISA (.version) of a PTX image
    size: int = 0  # payload bytes, from cuplug's fatbin reader

    @property
    def sass(self) -> bool:
        return self.target.startswith("sm_")


_IMAGE_HEAD = re.compile(r"^Fatbin (elf|ptx) code:\n=+\narch = (sm_\d+[af]?)\n", re.M)
_KERNEL_SASS = re.compile(r"^STT_FUNC\s+\S+\s+STO_ENTRY\s+(\S+)\s*$", re.M)
_KERNEL_PTX = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([^\s(]+)", re.M)
_DEVICE_LINK_USERS = "a one-step `nvcc -shared`, LINKER_LANGUAGE CUDA, or CUDA_RESOLVE_DEVICE_SYMBOLS"


def list_images(tc: Toolchain, so: Path) -> list[Image]:
    """Every device image in ``so`` in the order it is embedded: its target and its kernels.

    One cuobjdump call: ``-symbols`` gives each SASS image's entry functions, ``-ptx``
    each PTX image's text (its ``.entry`` lines and ``.version``).
    """
    out = subprocess.run(
        [str(tc.cuobjdump), "-symbols", "-ptx", str(so)], capture_output=True, text=True, check=False
    ).stdout
    heads = list(_IMAGE_HEAD.finditer(out))
    images = []
    for i, head in enumerate(heads):
        body = out[head.end() : heads[i + 1].start() if i + 1 < len(heads) else len(out)]
        if head[1] == "elf":
            images.append(Image(head[2], tuple(_KERNEL_SASS.findall(body))))
        else:
            version = re.search(r"^\s*\.version\s+(\d+\.\d+)", body, re.M)
            target = head[2].replace("sm_", "compute_")
            images.append(Image(target, tuple(_KERNEL_PTX.findall(body)), version[1] if version else None))
    return images


def _section(so: Path, name: str) -> bytes | None:
    """The bytes of one ELF section, located by readelf (no ELF library needed at build time)."""
    listing = _run(["readelf", "-S", "-W", str(so)], f"readelf -S {so}")
    m = re.search(rf"\]\s+{re.escape(name)}\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", listing)
    if m is None:
        return None
    with so.open("rb") as f:
        f.seek(int(m[1], 16))
        return f.read(int(m[2], 16))


def _with_reader_sizes(so: Path, images: list[Image]) -> list[Image]:
    """cuplug's own fatbin reader (what `cuplug inspect` uses) must see the same images, in order."""
    section = _section(so, ".nv_fatbin")
    if section is None:
        if images:
            raise BuildError(f"{so}: cuobjdump lists device code but the file has no .nv_fatbin section")
        return images
    try:
        entries = [e for e in fatbin.parse(section) if e.kind in (fatbin.KIND_ELF, fatbin.KIND_PTX)]
    except fatbin.FatbinError as exc:
        raise BuildError(f"{so}: cuplug's fatbin reader (cuplug inspect) cannot read it: {exc}") from exc
    seen = [e.target for e in entries]
    listed = [re.sub(r"[af]$", "", im.target) for im in images]
    if seen != listed:
        raise BuildError(f"{so}: cuobjdump lists images {listed}, cuplug's fatbin reader {seen}")
    return [dataclasses.replace(im, size=e.payload_size) for im, e in zip(images, entries, strict=True)]


def _demangle(names: list[str]) -> list[str]:
    tool = shutil.which("c++filt")
    if tool is None:
        return names
    proc = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False)
    out = proc.stdout.splitlines()
    return out if proc.returncode == 0 and len(out) == len(names) else names


def _some(names: set[str] | tuple[str, ...], limit: int = 3) -> str:
    shown = _demangle(sorted(names)[:limit])
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _image_tools(tc: Toolchain, so: Path) -> list[str | None]:
    """The tool that made each SASS image (ptxas, nvlink), in order; None where the cubin does not say
    (CUDA 12 writes no .note.nv.tkinfo)."""
    out = subprocess.run([str(tc.cuobjdump), "-elf", str(so)], capture_output=True, text=True, check=False).stdout
    blocks = re.split(r"^Fatbin elf code:$", out, flags=re.M)[1:]
    return [m[1] if (m := re.search(r"^\s*Tool Name:\s*(\S+)", b, re.M)) else None for b in blocks]


def check_images(tc: Toolchain, so: Path, images: list[Image]) -> None:
    """The library holds each source's code once, for one set of targets.

    Each .cu is its own translation unit with its own fat binary, so a library of
    three sources legitimately lists three sm_80 images (different kernels). What is
    refused: an image without kernels (a device link's, or a source without kernels),
    the same image twice (the same code linked twice), and kernels whose targets differ
    (one source, or a linked static library, built for other architectures).
    """
    empty = [im for im in images if not im.kernels]
    if empty:
        targets = ", ".join(sorted({im.target for im in empty}, key=_arch_key))
        tools = _image_tools(tc, so)
        sass = [im for im in images if im.sass]
        if any(not im.kernels and tool == "nvlink" for im, tool in zip(sass, tools, strict=False)):
            raise BuildError(
                f"{so}: {len(empty)} device images hold no kernel ({targets}) and were made by nvlink: a device "
                f"link ran when the library was linked ({_DEVICE_LINK_USERS}); it embeds an extra, kernel-less "
                "image per architecture beside each source's own. Compile each .cu with -c and link with the "
                "host compiler, as cuplug_add_cuda_backend() does."
            )
        raise BuildError(
            f"{so}: {len(empty)} device images hold no kernel ({targets}): either a device link ran when the "
            f"library was linked ({_DEVICE_LINK_USERS}: compile each .cu with -c and link with the host compiler, "
            "as cuplug_add_cuda_backend() does), or a .cu source has no kernel (make host-only code a .cpp "
            "source; cuda_runtime.h is on its include path)."
        )
    copies: dict[tuple[str, int, tuple[str, ...]], int] = {}
    for im in images:
        key = (im.target, im.size, tuple(sorted(im.kernels)))
        copies[key] = copies.get(key, 0) + 1
    for (target, _size, kernels), n in copies.items():
        if n > 1:
            raise BuildError(
                f"{so}: the same {target} image (kernels {_some(kernels)}) is embedded {n} times: the same device "
                "code was linked more than once (a source listed twice, or an object or static library linked "
                "twice). One image per architecture per source is expected; images of different sources are fine."
            )
    targets_of: dict[str, set[str]] = {}
    for im in images:
        for k in im.kernels:
            targets_of.setdefault(k, set()).add(im.target)
    groups: dict[frozenset[str], set[str]] = {}
    for k, ts in targets_of.items():
        groups.setdefault(frozenset(ts), set()).add(k)
    if len(groups) > 1:
        described = "; ".join(
            f"{_some(ks)} {'has' if len(ks) == 1 else 'have'} {','.join(sorted(ts, key=_arch_key))}"
            for ts, ks in sorted(groups.items(), key=lambda g: sorted(g[1]))
        )
        raise BuildError(
            f"{so}: its kernels were built for different targets: {described}. A source (or a linked static "
            "library) was compiled for other architectures than the variant's, e.g. by an -arch/-gencode option "
            "on one source; every kernel needs every target of the variant."
        )


def _arch_key(target: str) -> int:
    return int(re.sub(r"\D", "", target))


def read_device_code(tc: Toolchain, so: Path) -> tuple[list[str], list[str], str | None]:
    """(sass, ptx, ptx_isa) of a built library, read by the toolkit's cuobjdump and checked (check_images)."""
    if _section(so, "__nv_relfatbin") is not None:
        raise BuildError(
            f"{so}: holds relocatable device code (section __nv_relfatbin): it was built with separable "
            "compilation (CUDA_SEPARABLE_COMPILATION, -rdc=true or -dc) and a device link. cuplug compiles each "
            ".cu whole-program into its own fat binary: a device link keeps SASS only, so the ptx variant would "
            "be empty and the fatbin variant would lose its PTX."
        )
    images = _with_reader_sizes(so, list_images(tc, so))
    check_images(tc, so, images)
    sass = sorted({im.target for im in images if im.sass}, key=_arch_key)
    ptx = sorted({im.target for im in images if not im.sass}, key=_arch_key)
    versions = sorted({im.isa for im in images if not im.sass and im.isa})
    if ptx and len(versions) != 1:
        raise BuildError(f"{so}: expected one PTX ISA version, found {versions}")
    return sass, ptx, versions[0] if ptx else None


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


def build_summary(ninja_output: str) -> str:
    """What a `cmake --build` (Ninja) did: "up to date", or the sources compiled and libraries linked."""
    if "ninja: no work to do" in ninja_output:
        return "up to date (nothing compiled or linked)"
    compiled = re.findall(r"^\[\d+/\d+\] Building \w+ object \S*?\.dir/(\S+)\.o$", ninja_output, re.M)
    linked = re.findall(r"^\[\d+/\d+\] Linking \w+ shared library (\S+)$", ninja_output, re.M)
    counts = {src: compiled.count(src) for src in sorted(set(compiled))}
    what = ", ".join(f"{src} x{n}" for src, n in counts.items()) or "nothing"
    return f"compiled {len(compiled)} objects ({what}), linked {len(linked)} libraries"


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
    ninja = shutil.which("ninja", path=(env or os.environ).get("PATH"))
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
            # The interpreter running this build (a project's `python -m cuplug --cmake-dir` then finds
            # this cuplug), and this PATH's ninja: not what an earlier run's venv left in the cache.
            f"-DPython_EXECUTABLE={sys.executable}",
            *([f"-DCMAKE_MAKE_PROGRAM={os.path.abspath(ninja)}"] if ninja else []),
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
    log(f"{tc.major}: {build_summary(out)}")
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
                f"the matrix declares SASS {want_sass} PTX {want_ptx} (the architectures come from the matrix: "
                "an -arch/-gencode added to the target, or device code of a linked static library?)"
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


__all__ = [
    "BuildError",
    "Image",
    "ToolchainError",
    "build_backend",
    "check_images",
    "check_linkage",
    "list_images",
    "read_device_code",
]
