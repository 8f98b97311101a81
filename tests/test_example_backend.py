"""Another author's backend, built with nothing but the installed cuplug (issue 10).

A clean copy of examples/scan runs its own noxfile (build_backends, wheels, tests)
with cuplug taken from this run's wheels; then its wheels go into a fresh venv,
where cuplug.load("scan") falls back and explains like the reference backend.
`cuplug new-backend` makes a project under a new name that builds and passes its
tests untouched. Slow (two toolkits, eight variants each): about two minutes a project.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, WHEELS, clean_env, needs_wheels

pytestmark = needs_wheels
DEPS = os.environ.get("CUPLUG_TEST_DEPS", "")
NOX_PYTHON = os.environ.get("CUPLUG_TEST_NOX_PYTHON")


def run_project_nox(project: Path) -> subprocess.CompletedProcess[str]:
    if not NOX_PYTHON:
        pytest.skip("needs nox (run through `python3 ci/nox.py -s tests`)")
    env = clean_env(CUPLUG_FIND_LINKS=os.pathsep.join(d for d in (WHEELS, DEPS) if d))
    return subprocess.run(
        [NOX_PYTHON, "-m", "nox", "-f", str(project / "noxfile.py"), "-s", "wheels", "tests"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.fixture(scope="module")
def scan_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/scan copied without build outputs, built and tested by its own noxfile."""
    project = tmp_path_factory.mktemp("example") / "scan"
    shutil.copytree(
        ROOT / "examples" / "scan", project, ignore=shutil.ignore_patterns("build", "dist", ".nox", "__pycache__")
    )
    proc = run_project_nox(project)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project


def test_example_builds_its_variants_and_wheels_with_installed_cuplug(scan_project):
    for major in ("cuda12", "cuda13"):
        manifest = json.loads((scan_project / "build" / major / "manifest.json").read_text())
        assert {a["variant"] for a in manifest["artifacts"]} == {"fatbin", "ptx", "sm75", "sm80"}
        assert {a["backend"] for a in manifest["artifacts"]} == {"scan"} and manifest["cuda"] == major
    names = sorted(p.name.split("-")[0] for p in (scan_project / "dist").glob("*.whl"))
    assert names == ["scankit", "scankit_cuda12", "scankit_cuda13"]
    assert all("manylinux_2_17_x86_64" in p.name for p in (scan_project / "dist").glob("*.whl"))


def _fresh_venv_with(project: Path, tmp_path: Path, requirement: str) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    links = [a for d in (project / "dist", WHEELS, DEPS) if d for a in ("--find-links", str(d))]
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", *links, requirement],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return venv / "bin"


LOAD_SCAN = (
    "import array, json, cuplug, scankit; b = scankit.load(); "
    "r = b.run('prefix_sum', array.array('f', [1.0, 2.0, 3.0, 4.0])); t = b.trace; "
    "print(json.dumps({'variant': b.variant, 'result': list(r), 'code': t.decision_code, "
    "'reason': t.decision_reason, 'labels': [c.label for c in t.candidates], "
    "'attempts': [a.code for a in t.attempts], 'text': t.text()}))"
)


def test_example_installs_and_falls_back_like_the_reference(scan_project, tmp_path, fake_driver_dir):
    bindir = _fresh_venv_with(scan_project, tmp_path, "scankit[cuda13]")
    plain = subprocess.run(
        [str(bindir / "python"), "-c", LOAD_SCAN], capture_output=True, text=True, env=clean_env(), cwd=tmp_path
    )
    assert plain.returncode == 0, plain.stderr
    got = json.loads(plain.stdout)
    assert got["variant"] == "cpu" and got["result"] == [1.0, 3.0, 6.0, 10.0] and got["code"] == "no-driver"
    assert "cuda13/fatbin" in got["labels"] and "no-driver" in got["text"]
    # A driver with an sm_90 device: the scan CUDA artifacts are chosen, tried (this fake driver cannot
    # serve the runtime: load-failed) and the CPU twin answers, each step in the trace.
    gpu = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_DEVICES="9.0")
    faked = subprocess.run(
        [str(bindir / "python"), "-c", LOAD_SCAN], capture_output=True, text=True, env=gpu, cwd=tmp_path
    )
    got = json.loads(faked.stdout)
    assert got["labels"][0] == "cuda13/fatbin" and got["attempts"][0] == "load-failed" and got["variant"] == "cpu"
    doctor = subprocess.run(
        [str(bindir / "cuplug"), "doctor", "--json", "--backend", "scan"],
        capture_output=True,
        text=True,
        env=gpu,
        cwd=tmp_path,
    )
    doc = json.loads(doctor.stdout)
    assert doc["decision"]["backend"] == "scan" and doc["loaded"]["ok"]
    assert [a["code"] for a in doc["loaded"]["attempts"]][-1] == "ok"
    # The reference backend is unaffected by the other package being installed.
    vector = subprocess.run(
        [str(bindir / "cuplug"), "probe", "--allow-cpu"], capture_output=True, text=True, env=clean_env(), cwd=tmp_path
    )
    assert vector.returncode == 0, vector.stdout + vector.stderr


def test_unknown_backend_name_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import cuplug; cuplug.load('nosuch')"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "cuplug.cpu_backends" in proc.stderr and "nosuch" in proc.stderr


def test_new_backend_project_builds_and_passes_its_tests_untouched(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug", "new-backend", "histo", "--dir", str(tmp_path / "histo")],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    project = tmp_path / "histo"
    assert (project / "cuda" / "histo.cu").is_file() and (project / "histo" / "__init__.py").is_file()
    assert "scan" not in (project / "pyproject.toml").read_text()
    built = run_project_nox(project)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    assert len(list((project / "dist").glob("histo*.whl"))) == 3


@pytest.mark.parametrize(
    ("args", "needle"), [(["Bad-Name"], "lowercase"), (["vector"], "cuplug's own"), (["ok", "--dir", "."], "not empty")]
)
def test_new_backend_refuses_bad_names_and_places(args, needle, tmp_path):
    (tmp_path / "something").write_text("x")
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug", "new-backend", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
