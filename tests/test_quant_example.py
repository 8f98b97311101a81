"""examples/quant (blockwise int8 quantization, ABI v2: typed tensors, attributes, two outputs),
built like another author's project with nothing but the installed cuplug.

A clean copy runs its own noxfile (build_backends, wheels, tests) with cuplug from this run's
wheels; then `quantkit[cuda13]` goes into a fresh venv, where its own tests pass on the CPU
twin, with no driver and with a fake driver whose sm_90 device makes the CUDA artifacts the
first choice (they fail to load there; the trace says so). The GPU half is
examples/quant/tests/test_quantkit_gpu.py (`nox -s gpu_tests` in the project on a GPU machine).
Slow: two toolkits, eight variants each.
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
from test_example_backend import run_project_nox

pytestmark = needs_wheels
DEPS = os.environ.get("CUPLUG_TEST_DEPS", "")
TEST_TOOLS = ["pytest==9.0.3", "numpy==2.4.6"]  # what quantkit's tests need (its noxfile's TEST_DEPS)


@pytest.fixture(scope="module")
def quant_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/quant copied without build outputs, built and tested by its own noxfile."""
    project = tmp_path_factory.mktemp("example") / "quant"
    shutil.copytree(
        ROOT / "examples" / "quant",
        project,
        ignore=shutil.ignore_patterns("build", "dist", ".nox", "__pycache__", "_bin"),
    )
    proc = run_project_nox(project)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project


@pytest.fixture(scope="module")
def quant_venv(quant_project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with quantkit[cuda13] from the project's wheels and cuplug's, offline; then the test tools."""
    venv = tmp_path_factory.mktemp("quant-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    links = [a for d in (quant_project / "dist", WHEELS, DEPS) if d for a in ("--find-links", str(d))]
    proc = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-index", *links, "quantkit[cuda13]"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [py, "-m", "pip", "install", "-q", *links, *TEST_TOOLS], capture_output=True, text=True, env=clean_env()
    )
    assert proc.returncode == 0, proc.stderr
    return venv / "bin"


def test_example_builds_its_variants_and_wheels_with_installed_cuplug(quant_project):
    for major in ("cuda12", "cuda13"):
        manifest = json.loads((quant_project / "build" / major / "manifest.json").read_text())
        assert {a["variant"] for a in manifest["artifacts"]} == {"fatbin", "ptx", "sm75", "sm80"}
        assert {a["backend"] for a in manifest["artifacts"]} == {"quant"} and manifest["cuda"] == major
    names = sorted(p.name.split("-")[0] for p in (quant_project / "dist").glob("*.whl"))
    assert names == ["quantkit", "quantkit_cuda12", "quantkit_cuda13"]
    assert all("manylinux_2_17_x86_64" in p.name for p in (quant_project / "dist").glob("*.whl"))


LOAD_QUANT = (
    "import json, quantkit; b = quantkit.load(); t = b.trace; "
    "q, a = b.run('quantize_blockwise', memoryview(bytearray(b'\\x00\\x00\\x80\\x3f' * 300)).cast('f'), blocksize=64); "
    "print(json.dumps({'variant': b.variant, 'q': list(q)[:3], 'absmax': list(a), 'ops': sorted(b.ops), "
    "'code': t.decision_code, 'labels': [c.label for c in t.candidates], "
    "'attempts': [x.code for x in t.attempts], 'text': t.text()}))"
)


def _env(kind: str, fake_driver_dir: Path) -> dict[str, str]:
    if kind == "no-driver":
        return clean_env()
    return clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_DEVICES="9.0")


@pytest.mark.parametrize("kind", ["no-driver", "fake-sm90"])
def test_example_installs_and_its_tests_pass_on_the_cpu_twin(
    quant_project, quant_venv, tmp_path, fake_driver_dir, kind
):
    env = _env(kind, fake_driver_dir)
    proc = subprocess.run(
        [str(quant_venv / "python"), "-c", LOAD_QUANT], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["variant"] == "cpu" and got["ops"] == ["dequantize_blockwise", "quantize_blockwise"]
    assert got["q"] == [127, 127, 127] and got["absmax"] == [1.0] * 5  # 300 ones in blocks of 64
    assert "cuda13/fatbin" in got["labels"] and not any(label.startswith("cuda12/") for label in got["labels"])
    if kind == "no-driver":
        assert got["code"] == "no-driver" and "no-driver" in got["text"]
    else:  # chosen first, tried (this fake driver cannot serve the runtime), the CPU twin answers
        assert got["labels"][0] == "cuda13/fatbin" and got["attempts"][0] == "load-failed"
    # quantkit's own tests (the gpu ones skip: no torch), run from outside the project: `python -m
    # pytest` puts the working directory on sys.path, and the source tree has no built CPU twin.
    tests = subprocess.run(
        [str(quant_venv / "python"), "-m", "pytest", str(quant_project / "tests"), "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and " failed" not in tests.stdout


def test_doctor_lists_the_quant_ops(quant_venv, tmp_path, fake_driver_dir):
    doctor = subprocess.run(
        [str(quant_venv / "cuplug"), "doctor", "--json", "--backend", "quant"],
        capture_output=True,
        text=True,
        env=_env("fake-sm90", fake_driver_dir),
        cwd=tmp_path,
    )
    doc = json.loads(doctor.stdout)
    assert doc["decision"]["backend"] == "quant" and doc["loaded"]["ok"], doc
    assert [a["code"] for a in doc["loaded"]["attempts"]][-1] == "ok"


def test_every_op_of_the_example_is_a_pytorch_op_that_opcheck_passes(quant_project, tmp_path):
    """cuplug.torch.register on the example's own backend (issue 30): torch.library.opcheck of each op
    (functional and .out), run()'s results, torch.compile(fullgraph=True), on its CPU twin."""
    pytest.importorskip("torch")
    import torch_opcheck

    report = torch_opcheck.check_project(str(quant_project / "dist"), "quantkit", "quant", str(tmp_path))
    assert report, "the backend declares no op"
    for name, r in report.items():
        assert r == torch_opcheck.PASSED, name
