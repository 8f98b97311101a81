"""``python -m cuplug.kit``: the build kit's commands, for any backend's noxfile or CI.

  toolchain cuda12|cuda13|sysroot [--arch aarch64]
                                    install a pinned toolchain into the user cache, print where
  variants  --cuda M --source DIR --out DIR [--backend NAME] [--matrix JSON] [--arch aarch64]
            [--project PYPROJECT]   build every variant with CMake, check it, write manifest.json;
                                    the components the project file declares ([tool.cuplug]
                                    components = ["cublas"]) are installed and offered to CMake
  wheel     --build-dir DIR --name NAME --requires REQ --out DIR [--version V] [--variants]
                                    assemble a backend wheel (its arch from the manifest; Requires-Dist
                                    on the components it was built with), auditwheel-repair it, check it;
                                    --variants: also one PEP 825 variant wheel per dedicated SASS
                                    variant (+ PTX), a `null` one (PTX) and <name>-<v>-variants.json
  repair    WHEEL --out DIR         auditwheel-repair a package's main wheel (its CPU twin), check it
  check     WHEEL...                the shipping gate (no libcuda/libcudart.so, RPATH, tags, manifest)

Exit status: 0 done, 1 a build or check failed (the message names the step), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from cuplug.contract import manifest

from . import artifacts, components, gate, toolchain, wheel
from .process import BuildError
from .resources import default_matrix


def _log(msg: str) -> None:
    print(f"cuplug.kit: {msg}", file=sys.stderr, flush=True)


def cmd_toolchain(args: argparse.Namespace) -> int:
    if args.which == "sysroot":
        print(json.dumps({"sysroot": str(toolchain.install_sysroot(_log, args.arch))}))
        return 0
    tc = toolchain.install(args.which, _log, args.arch)
    print(
        json.dumps(
            {
                "major": tc.major,
                "version": tc.version,
                "root": str(tc.root),
                "nvcc": str(tc.nvcc),
                "cuobjdump": str(tc.cuobjdump),
                "arch": tc.arch,
                "cmake_args": list(tc.cmake_args),
            }
        )
    )
    return 0


def cmd_variants(args: argparse.Namespace) -> int:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("no `cmake` on PATH (pip install cmake ninja)")
    sysroot = None if args.no_sysroot else toolchain.install_sysroot(_log, args.arch)
    tc = toolchain.install(args.cuda, _log, args.arch)
    project = args.project or components.project_file(args.source)
    names = components.declared(project)
    if names and args.arch != "x86_64":
        raise BuildError(f"{project}: components ({', '.join(names)}) are offered for x86_64 builds only")
    if names:
        _log(f"{args.cuda}: components declared in {project}: {', '.join(names)}")
    installed = tuple(components.install(n, args.cuda, _log) for n in names)
    spec = artifacts.BuildSpec(
        tc,
        args.source.resolve(),
        args.out.resolve(),
        backend=args.backend,
        matrix_path=(args.matrix or default_matrix()).resolve(),
        sysroot=sysroot,
        cmake=cmake,
        log=_log,
        components=installed,
    )
    path = artifacts.build_backend(spec)
    print(path)
    return 0


def cmd_wheel(args: argparse.Namespace) -> int:
    version = args.version or _version()
    arches = {a.arch or "x86_64" for a in manifest.read_strict(args.build_dir)}
    if len(arches) != 1:
        raise wheel.WheelError(f"{args.build_dir}/manifest.json mixes CPU architectures {sorted(arches)}")
    (arch,) = arches
    used = components.recorded(args.build_dir)  # what the variants were built with: required, never bundled
    requires = [args.requires or f"cuplug=={_version()}", *(c["requires"] for c in used)]
    exclude = [s for c in used for s in c["sonames"]]
    with tempfile.TemporaryDirectory() as tmp:
        raw = wheel.build_backend_wheel(
            args.build_dir,
            Path(tmp),
            name=args.name,
            version=version,
            requires=requires,
            summary=args.summary,
            tag=wheel.raw_tag(arch),
        )
        repaired = wheel.repair_wheel(raw, args.out, plat=wheel.target_plat(arch), exclude=exclude)
    gate.check_wheels([repaired], _log)
    print(repaired)
    if args.variants:
        from . import variants

        made = variants.build_variant_wheels(
            args.build_dir,
            args.out,
            name=args.name,
            version=version,
            requires=requires,
            summary=args.summary,
            log=_log,
            exclude=exclude,
        )
        gate.check_wheels([m for m in made if m.suffix == ".whl"], _log)
        for m in made:
            print(m)
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    repaired = wheel.repair_wheel(args.wheel, args.out)
    gate.check_wheels([repaired], _log)
    print(repaired)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    gate.check_wheels(args.wheels, _log)
    return 0


def _version() -> str:
    from cuplug import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cuplug.kit",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("toolchain", help="install a pinned CUDA toolchain or the glibc sysroot (cached)")
    t.add_argument("which", choices=[*toolchain.INSTALLERS, "sysroot"])
    t.add_argument("--arch", default="x86_64", choices=list(toolchain.ARCHES), help="CPU to build for")
    t.set_defaults(func=cmd_toolchain)
    v = sub.add_parser("variants", help="build every variant of a backend and write its manifest")
    v.add_argument("--cuda", required=True, choices=list(toolchain.INSTALLERS))
    v.add_argument("--source", type=Path, required=True, help="CMake project calling cuplug_add_cuda_backend()")
    v.add_argument("--out", type=Path, required=True, help="build directory; manifest.json lands here")
    v.add_argument("--backend", default="vector", help="backend name (libcuplug_<name>.so)")
    v.add_argument("--matrix", type=Path, help="variant matrix JSON (default: cuplug's variants.json)")
    v.add_argument(
        "--project",
        type=Path,
        help="the project file declaring [tool.cuplug] components (default: the first pyproject.toml at or above --source)",
    )
    v.add_argument("--no-sysroot", action="store_true", help="link against the host glibc (newer manylinux tag)")
    v.add_argument(
        "--arch", default="x86_64", choices=list(toolchain.ARCHES), help="CPU to build for (cross on x86_64)"
    )
    v.set_defaults(func=cmd_variants)
    w = sub.add_parser("wheel", help="assemble, auditwheel-repair and check a backend wheel")
    w.add_argument("--build-dir", type=Path, required=True, help="holds manifest.json from `variants`")
    w.add_argument("--name", required=True, help="distribution name, e.g. mypkg-cuda13")
    w.add_argument("--version", help="wheel version (default: cuplug's)")
    w.add_argument("--requires", help="Requires-Dist on the loader (default: cuplug==<this version>)")
    w.add_argument("--summary", default="")
    w.add_argument("--out", type=Path, default=Path("dist"))
    w.add_argument(
        "--variants",
        action="store_true",
        help="also write PEP 825 variant wheels (one per dedicated SASS variant, and null) and the index file",
    )
    w.set_defaults(func=cmd_wheel)
    r = sub.add_parser("repair", help="auditwheel-repair a main wheel (manylinux_2_17, libcuda excluded), check it")
    r.add_argument("wheel", type=Path)
    r.add_argument("--out", type=Path, default=Path("dist"))
    r.set_defaults(func=cmd_repair)
    c = sub.add_parser("check", help="the shipping gate for wheels")
    c.add_argument("wheels", type=Path, nargs="+")
    c.set_defaults(func=cmd_check)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BuildError as exc:
        print(f"cuplug.kit {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
