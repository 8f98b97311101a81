"""What device code a built library holds, read back with the toolkit's own cuobjdump and checked.

The manifest's device-code facts (``sass``, ``ptx``, ``ptx_isa``) come from here,
never from the matrix; cuplug's own fatbin reader (what ``cuplug inspect`` uses) must
see the same images in the same order.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

from cuplug.contract import fatbin

from .process import BuildError, run
from .toolchain import Toolchain


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
    listing = run(["readelf", "-S", "-W", str(so)], f"readelf -S {so}")
    m = re.search(rf"\]\s+{re.escape(name)}\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", listing)
    if m is None:
        return None
    with so.open("rb") as f:
        f.seek(int(m[1], 16))
        return f.read(int(m[2], 16))


def _with_reader_sizes(so: Path, images: list[Image]) -> list[Image]:
    """cuplug's own fatbin reader (what `cuplug inspect` uses) must see the same images, in order."""
    section = _section(so, fatbin.FATBIN_SECTION)
    if section is None:
        if images:
            raise BuildError(f"{so}: cuobjdump lists device code but the file has no .nv_fatbin section")
        return images
    try:
        entries = [e for e in fatbin.parse(section) if e.kind in (fatbin.KIND_ELF, fatbin.KIND_PTX)]
    except fatbin.FatbinError as exc:
        raise BuildError(f"{so}: cuplug's fatbin reader (cuplug inspect) cannot read it: {exc}") from exc
    seen = [e.target for e in entries]
    listed = [im.target for im in images]  # with cuobjdump's a/f: the reader must tell them apart too
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


def _arch_key(target: str) -> tuple[int, str]:
    return int(re.sub(r"\D", "", target)), target[-1] if target[-1] in "af" else ""


def read_lto(so: Path, section: bytes) -> list[str]:
    """The LTO-IR targets of an LTO variant's ``__nv_relfatbin``: every source's container must hold the same."""
    try:
        per_source = [fatbin.lto_targets(c) for c in fatbin.containers(section)]
    except fatbin.FatbinError as exc:
        raise BuildError(f"{so}: its relocatable device code (__nv_relfatbin) is unreadable: {exc}") from exc
    if not per_source or not per_source[0] or len(set(per_source)) != 1:
        raise BuildError(
            f"{so}: an LTO variant needs the same LTO-IR in every source's relocatable code; found {per_source} "
            "(a source compiled without the variant's lto_XX, or a linked static library with device code?)"
        )
    return list(per_source[0])


def read_device_code(tc: Toolchain, so: Path, lto: bool = False) -> tuple[list[str], list[str], str | None, list[str]]:
    """(sass, ptx, ptx_isa, lto) of a built library, read by the toolkit's cuobjdump and checked (check_images).
    ``lto``: the variant declares LTO-IR, so its relocatable code (``__nv_relfatbin``) is expected and read."""
    relocatable = _section(so, fatbin.RELOCATABLE_SECTION)
    lto_targets: list[str] = []
    if lto:
        if relocatable is None:
            raise BuildError(f"{so}: the variant declares LTO-IR but the file has no {fatbin.RELOCATABLE_SECTION}")
        lto_targets = read_lto(so, relocatable)
    elif relocatable is not None:
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
    return sass, ptx, versions[0] if ptx else None, lto_targets
