"""cuplug's jobs. Run through `python3 ci/nox.py -s <session>` (pinned nox in a private venv)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import nox

nox.needs_version = ">=2026.10.20"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "loader"))  # build helpers (cuplug.build), no install needed

BUILD_TOOLS = ["scikit-build-core==1.1.2", "cmake==4.4.5", "ninja==1.13.2"]
TEST_DEPS = ["pytest==9.0.3", "numpy==2.4.6", "jsonschema==4.26.0", "hypothesis==6.155.2"]
LINT_DEPS = ["ruff==0.17.6", "validate-pyproject[all]==0.27"]


def _clean_env() -> dict[str, str]:
    """No system CUDA: hide /usr/local/cuda and any nvcc on PATH from every build."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if "cuda" not in p.lower()]
    return {"PATH": os.pathsep.join(path), "CUDA_HOME": "", "CUDA_PATH": "", "CUDACXX": ""}


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint + format check) and validate-pyproject."""
    session.install(*LINT_DEPS)
    session.run("ruff", "check", "loader", "tests", "noxfile.py", "ci")
    session.run("validate-pyproject", "pyproject.toml")


def _backend_wheels(session: nox.Session, out: Path) -> None:
    sys.path.insert(0, str(ROOT / "packaging"))
    import backend_wheel

    version = nox.project.load_toml("pyproject.toml")["project"]["version"]
    for major in CUDA_MAJORS:
        session.log(f"wheel: {backend_wheel.build_wheel(ROOT / 'build' / 'backends' / major, major, version, out)}")


@nox.session
def tests(session: nox.Session) -> None:
    """Build the CUDA variants (cached), install cuplug, run pytest against the installed package and wheels."""
    session.install(*BUILD_TOOLS, *TEST_DEPS)
    _build_backends(session, CUDA_MAJORS)
    wheels = ROOT / "build" / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    _backend_wheels(session, wheels)
    session.env["CUPLUG_TEST_WHEELS"] = str(wheels)
    session.install("--no-build-isolation", ".", env=_clean_env())
    # From a directory outside the tree: nothing is imported from the checkout.
    with tempfile.TemporaryDirectory() as tmp:
        session.chdir(tmp)
        session.run("python", "-m", "pytest", str(ROOT / "tests"), "-p", "no:cacheprovider",
                    f"--rootdir={ROOT}", "-c", str(ROOT / "pyproject.toml"), *session.posargs)


CUDA_MAJORS = ["cuda12", "cuda13"]


def _build_backends(session: nox.Session, majors: list[str]) -> None:
    from cuplug.build import artifacts, toolchain

    sysroot = toolchain.install_sysroot(session.log)
    for major in majors:
        tc = toolchain.install(major, session.log)
        artifacts.build_backend(tc, ROOT / "backends", ROOT / "build" / "backends" / major, sysroot=sysroot,
                                log=session.log, cmake=str(Path(session.bin) / "cmake"),
                                env={**os.environ, **_clean_env()})


@nox.session
def build_backends(session: nox.Session) -> None:
    """Install the pinned CUDA 12.4 and 13.0 toolchains (cached) and build every variant + manifest.

    `-- cuda13` (or cuda12) builds one major only. Output: build/backends/<major>/<variant>/libcuplug_vector.so
    and build/backends/<major>/manifest.json, facts read back from the files.
    """
    majors = session.posargs or CUDA_MAJORS
    unknown = sorted(set(majors) - set(CUDA_MAJORS))
    if unknown:
        session.error(f"unknown CUDA major(s) {unknown}; choose from {CUDA_MAJORS}")
    session.install("cmake==4.4.5", "ninja==1.13.2")
    _build_backends(session, majors)


@nox.session
def wheels(session: nox.Session) -> None:
    """The main wheel and both backend wheels into dist/ (builds the variants first, cached)."""
    session.install("build==1.3.0", *BUILD_TOOLS)
    _build_backends(session, CUDA_MAJORS)
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), env=_clean_env())
    _backend_wheels(session, dist)


@nox.session
def main(session: nox.Session) -> None:
    """The main job: every variant and wheel, `cuplug[cuda13]` into a fresh venv, `cuplug probe` outside the tree."""
    wheels(session)
    dist = ROOT / "dist"
    with tempfile.TemporaryDirectory() as tmp:
        env_dir = Path(tmp) / "venv"
        session.run("python", "-m", "venv", str(env_dir))
        py = str(env_dir / "bin" / "python")
        session.run(py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(dist), "cuplug[cuda13]",
                    external=True)
        session.chdir(tmp)
        session.run(str(env_dir / "bin" / "cuplug"), "doctor", external=True)
        session.run(str(env_dir / "bin" / "cuplug"), "probe", "--allow-cpu", external=True)


@nox.session(default=False, venv_params=["--system-site-packages"])  # torch, CuPy from the host
def gpu_tests(session: nox.Session) -> None:
    """The `gpu` tests against the installed wheels (needs a GPU; they skip without one)."""
    session.install(*TEST_DEPS)  # cuda-bindings, for the cross-check, comes from the host if present
    wheels(session)
    session.install("--no-index", "--find-links", str(ROOT / "dist"), "cuplug[cuda12,cuda13]")
    with tempfile.TemporaryDirectory() as tmp:
        session.chdir(tmp)
        session.run("python", "-m", "pytest", str(ROOT / "tests" / "test_gpu.py"), "-p", "no:cacheprovider",
                    f"--rootdir={ROOT}", "-c", str(ROOT / "pyproject.toml"), "-m", "gpu", *session.posargs)


@nox.session(default=False, venv_params=["--system-site-packages"])  # torch, CuPy from the host
def bench(session: nox.Session) -> None:
    """GPU benchmarks side by side with torch and CuPy (needs a GPU, torch, cupy); JSON + PNG in bench/results/."""
    session.install("numpy==2.4.6", "matplotlib")
    wheels(session)
    session.install("--no-index", "--find-links", str(ROOT / "dist"), "cuplug[cuda12,cuda13]")
    out = ROOT / "bench" / "results" / "latest.json"
    session.run("python", str(ROOT / "bench" / "gpu_bench.py"), str(out))
    session.run("python", str(ROOT / "bench" / "plot.py"), str(out))
