"""Shared fixtures: the installed CPU backend, a fake libcuda.so.1, subprocess runners."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WHEELS = os.environ.get("CUPLUG_TEST_WHEELS")
if not WHEELS and os.environ.get("CI"):
    raise RuntimeError("CUPLUG_TEST_WHEELS is unset under CI: run through `nox -s tests`")
needs_wheels = pytest.mark.skipif(not WHEELS, reason="needs the wheels (nox -s tests builds them)")
GPU_PRESENT = shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidiactl")


@pytest.fixture(autouse=True)
def _reliability_row(request: pytest.FixtureRequest) -> None:
    """Puts a reliability test's row (case, how, expect) into the JUnit XML, for docs/reliability.md."""
    mark = request.node.get_closest_marker("reliability")
    if mark is not None:
        for key in ("case", "how", "expect"):
            request.node.user_properties.append((key, mark.kwargs[key]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords and not GPU_PRESENT:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cpu_lib_path() -> Path:
    import cuplug.runtime.loading

    path = cuplug.runtime.loading.cpu_library_path("vector")
    assert path.is_file(), f"the installed cuplug lacks its CPU backend at {path}"
    assert "site-packages" in str(path), "tests must run against the installed package, not the checkout"
    return path


@pytest.fixture(scope="session")
def fake_driver_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Builds tests/fake_cuda/fake_libcuda.c into <tmp>/libcuda.so.1."""
    out = tmp_path_factory.mktemp("fake_cuda")
    build_shared_library(HERE / "fake_cuda" / "fake_libcuda.c", out / "libcuda.so.1", "-ldl")
    return out


def build_shared_library(source: Path, out: Path, *flags: str) -> Path:
    """A test-only C shared library, with $CC (default cc)."""
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), str(source), *flags], check=True)
    return out


def clean_env(**extra: str) -> dict[str, str]:
    """The parent's environment without any cuplug/CUDA knob, plus ``extra``."""
    drop = ("CUPLUG_", "BACKEND_CUDA_", "CUDA_VISIBLE_DEVICES", "FAKE_CUDA_", "LD_LIBRARY_PATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra)
    return env


def run_py(
    code: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def run_json(code: str, env: dict[str, str], cwd: Path | None = None) -> object:
    proc = run_py(code, env, cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cli(args: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cuplug", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both backend wheels installed with `pip --target` into a private directory (for PYTHONPATH)."""
    target = tmp_path_factory.mktemp("site")
    wheels = sorted(Path(WHEELS or "").glob("cuplug_cuda*.whl"))
    assert len(wheels) == 2, wheels
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            *map(str, wheels),
        ],
        check=True,
    )
    return target


def planted_site(site: Path, out: Path, member: str, data: bytes) -> Path:
    """A copy of ``site`` at ``out`` with ``data`` in place of ``member`` (e.g. "cuplug_cuda13/fatbin/
    libcuplug_vector.so") and that package's manifest agreeing (size, sha256): the loader meets it where it would
    meet a wrong or lying artifact in the field."""
    import hashlib

    shutil.copytree(site, out, symlinks=True)
    package, _, file = member.partition("/")
    (out / member).write_bytes(data)
    manifest = out / package / "manifest.json"
    doc = json.loads(manifest.read_text())
    for a in doc["artifacts"]:
        if a["file"] == file:
            a["size"], a["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    manifest.write_text(json.dumps(doc))
    return out


def env_for(site: Path, fake_driver_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """A clean environment that sees the backends in ``site`` and, if given, the fake driver."""
    env = clean_env(PYTHONPATH=str(site), **extra)
    if fake_driver_dir is not None:
        env["LD_LIBRARY_PATH"] = str(fake_driver_dir)
    return env
