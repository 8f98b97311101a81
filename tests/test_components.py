"""Optional toolchain components (issue 32, part 5): a backend that calls cuBLAS, declared in its project file.

examples/gemm (cublasSgemm behind a one-op table, its CPU twin in C) is copied clean and built by its own noxfile
for CUDA 13 only (GEMMKIT_MAJORS=cuda13: the major whose toolkit had no cuBLAS headers; about two minutes, most
of it nox's venvs and pip): the kit installs NVIDIA's pinned cuBLAS wheel, the artifacts NEED libcublas.so.13 and
find it through RUNPATH $ORIGIN/../../nvidia/cu13/lib, the wheel requires nvidia-cublas and bundles nothing of
it, and the gate accepts it and says so. The project's tests installed gemmkit[cuda13] with pip, which brought
NVIDIA's real wheel: the installed artifact resolves libcublas there with no LD_LIBRARY_PATH. Undeclared, the
same project is refused at configure time, and the same wheel without its Requires-Dist by the gate. The twin's
GEMM is checked by the project's tests; its GPU test (cuBLAS against the twin) skips without a GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, WHEELS, clean_env, needs_wheels

DEPS = os.environ.get("CUPLUG_TEST_DEPS", "")
NOX_PYTHON = os.environ.get("CUPLUG_TEST_NOX_PYTHON")
RPATH13 = "$ORIGIN/../../nvidia/cu13/lib"


def _copy(root: Path) -> Path:
    project = root / "gemm"
    shutil.copytree(
        ROOT / "examples" / "gemm", project, ignore=shutil.ignore_patterns("build", "dist", ".nox", "__pycache__")
    )
    return project


@pytest.fixture(scope="module")
def gemm_project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if not WHEELS:
        pytest.skip("needs the wheels (nox -s tests builds them)")
    if not NOX_PYTHON:
        pytest.skip("needs nox (run through `python3 ci/nox.py -s tests`)")
    project = _copy(tmp_path_factory.mktemp("components"))
    env = clean_env(CUPLUG_FIND_LINKS=os.pathsep.join(d for d in (WHEELS, DEPS) if d), GEMMKIT_MAJORS="cuda13")
    proc = subprocess.run(
        [NOX_PYTHON, "-m", "nox", "-f", str(project / "noxfile.py"), "-s", "wheels", "tests"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project, proc.stdout + proc.stderr


def _cuda_wheel(project: Path) -> Path:
    (wheel,) = (project / "dist").glob("gemmkit_cuda13-0.1.0-*.whl")
    return wheel


def _dynamic(path: Path) -> tuple[list[str], list[str]]:
    out = subprocess.run(["readelf", "-d", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    return needed, re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[([^\]]+)\]", out)


@needs_wheels
def test_the_wheel_requires_cublas_and_finds_it_through_rpath(gemm_project, tmp_path):
    from cuplug.kit import gate

    project, log = gemm_project
    assert "cuda13: components declared in" in log and "cuda13/cublas:" in log
    wheel = _cuda_wheel(project)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        assert "Requires-Dist: nvidia-cublas>=13.1.0.3,<14" in metadata.splitlines()
        assert not [n for n in names if "libcublas" in n]  # required, never bundled (auditwheel --exclude)
        libs = [n for n in names if n.endswith("/libcuplug_gemm.so")]
        assert sorted(n.split("/")[1] for n in libs) == ["ptx", "sm80"]  # the project's own matrix
        for member in libs:
            so = tmp_path / member.replace("/", "_")
            so.write_bytes(zf.read(member))
            needed, rpaths = _dynamic(so)
            assert "libcublas.so.13" in needed and rpaths == [RPATH13], (member, needed, rpaths)
            assert not [n for n in needed if "cudart" in n or n.startswith("libcuda.")]
    assert gate.check_wheel(wheel) == []
    seen: list[str] = []
    gate.check_wheels([wheel], seen.append)
    assert f"component cublas: requires nvidia-cublas>=13.1.0.3,<14, RPATH {RPATH13}" in seen[0]


@needs_wheels
def test_the_installed_artifact_loads_cublas_from_nvidias_wheel(gemm_project):
    """The project's tests session installed gemmkit[cuda13]: pip brought nvidia-cublas from the index."""
    project, log = gemm_project
    sites = list((project / ".nox").glob("tests*/lib/python3*/site-packages"))
    assert len(sites) == 1, sites
    site = sites[0]
    assert list(site.glob("nvidia_cublas-13.*.dist-info")), "pip did not install nvidia-cublas for the wheel"
    so = site / "gemmkit_cuda13" / "sm80" / "libcuplug_gemm.so"
    ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True, env=clean_env(), check=True).stdout
    found = re.search(r"libcublas\.so\.13 => (\S+)", ldd)
    assert found and Path(found.group(1)).resolve() == (site / "nvidia/cu13/lib/libcublas.so.13").resolve(), ldd
    assert "not found" not in ldd, ldd
    assert re.search(r"\b[4-9] passed", log), log[-2000:]  # the project's own tests: the twin's GEMM


@needs_wheels
def test_the_gate_refuses_cublas_the_wheel_does_not_declare(gemm_project, tmp_path):
    from cuplug.kit import gate

    project, _ = gemm_project
    wheel = _cuda_wheel(project)
    stripped = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(stripped, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".dist-info/METADATA"):
                data = b"".join(line for line in data.splitlines(True) if b"nvidia-cublas" not in line)
            zout.writestr(info, data)
    problems = gate.check_wheel(stripped)
    needs = [p for p in problems if "needs libcublas.so.13, a CUDA library the wheel does not declare" in p]
    assert len(needs) == 2, problems  # ptx and sm80
    assert '[tool.cuplug] components = ["cublas"]' in needs[0] and "COMPONENTS cublas" in needs[0]
    assert any(f"RPATH/RUNPATH {RPATH13!r} points outside the package" in p for p in problems), problems
    with pytest.raises(Exception, match="does not declare"):
        gate.check_wheels([stripped], lambda _: None)


@needs_wheels
def test_an_undeclared_component_is_refused_at_configure_time(tmp_path):
    project = _copy(tmp_path)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('[tool.cuplug]\ncomponents = ["cublas"]\n', ""))
    assert "[tool.cuplug]" not in pyproject.read_text()
    cmd = [sys.executable, "-m", "cuplug.kit", "variants", "--cuda", "cuda13", "--source", str(project / "cuda")]
    cmd += ["--out", str(tmp_path / "build"), "--backend", "gemm", "--matrix", str(project / "variants.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    text = " ".join(proc.stderr.split())
    assert "cuplug_add_cuda_backend(gemm): COMPONENTS: the component 'cublas' is not declared" in text, text[-3000:]
    assert '[tool.cuplug] components = ["cublas"]' in text


def test_a_declaration_names_only_what_cuplug_offers(tmp_path):
    from cuplug.kit import components
    from cuplug.kit.process import BuildError

    good = tmp_path / "good.toml"
    good.write_text('[tool.cuplug]\ncomponents = ["curand", "cublas", "cublas"]\n')
    assert components.declared(good) == ["cublas", "curand"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[tool.cuplug]\ncomponents = ["cublasLt", "cufft"]\n')
    with pytest.raises(BuildError, match="cublasLt, cufft; cuplug offers cublas, curand"):
        components.declared(bad)
    bad.write_text('[tool.cuplug]\ncomponents = "cublas"\n')
    with pytest.raises(BuildError, match="must be a list"):
        components.declared(bad)
    assert components.declared(None) == []
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "cuda").mkdir()
    assert components.project_file(tmp_path / "cuda") == tmp_path / "pyproject.toml"
    assert components.declared(tmp_path / "pyproject.toml") == []


def test_every_component_is_pinned_for_both_majors_with_its_layout():
    from cuplug.kit import components

    lock = components.read_lock()
    assert sorted((c.major, c.name) for c in lock) == [
        ("cuda12", "cublas"),
        ("cuda12", "curand"),
        ("cuda13", "cublas"),
        ("cuda13", "curand"),
    ]
    for c in lock:
        assert re.fullmatch(r"[0-9a-f]{64}", c.sha256) and re.fullmatch(r"\d+(\.\d+)+", c.version)
        assert c.requires == f"{c.dist}>={c.version},<{int(c.version.split('.')[0]) + 1}"
        assert all(components.CUDA_LIBRARY_RE.match(s) for s in c.layout.sonames)
    cublas13 = components.pinned("cublas", "cuda13")
    assert (cublas13.dist, cublas13.rpath()) == ("nvidia-cublas", RPATH13)
    assert components.rpath_for("gemmkit_cuda13/sm80/libcuplug_gemm.so", cublas13) == RPATH13
    assert components.pinned("cublas", "cuda12").rpath() == "$ORIGIN/../../nvidia/cublas/lib"
    meta = "Name: x\nRequires-Dist: cuplug==0.1.0\nRequires-Dist: nvidia_cublas >=13.1.0.3,<14\n"
    assert [c.name for c in components.wheel_components(meta, "cuda13")] == ["cublas"]
    assert components.wheel_components(meta, "cuda12") == []
