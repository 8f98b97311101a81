"""examples/llmops (issue 32's "done when"): the interfaces of four public kernels as they are upstream, built like
another author's project with nothing but the installed cuplug. A LayerNorm with (B, T) mean and rstd, a uint8 ->
uint32 histogram, a bfloat16 GeLU and a CUB block-reduce softmax compile for CUDA 12.4 and 13.0 (a variant matrix
of the project's own), the build reports each variant's time and size, the CPU twin calls libm and still repairs
to manylinux_2_17, and the project's own tests pass on the twin. The GPU half: its tests/test_llmkit_gpu.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, needs_wheels
from test_example_backend import run_project_nox

pytestmark = needs_wheels


@pytest.fixture(scope="module")
def llm_project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    project = tmp_path_factory.mktemp("example") / "llmops"
    shutil.copytree(
        ROOT / "examples" / "llmops", project, ignore=shutil.ignore_patterns("build", "dist", ".nox", "__pycache__")
    )
    proc = run_project_nox(project)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return project, proc.stdout + proc.stderr


def test_the_four_kernels_build_for_both_majors_with_a_report(llm_project):
    project, log = llm_project
    for major in ("cuda12", "cuda13"):
        report = json.loads((project / "build" / major / "build-report.json").read_text())
        manifest = json.loads((project / "build" / major / "manifest.json").read_text())
        assert sorted(report["variants"]) == ["ptx", "sm80", "sm90"]  # the project's own matrix
        assert {a["variant"]: a["size"] for a in manifest["artifacts"]} == {
            v: r["bytes"] for v, r in report["variants"].items()
        }
        assert all(r["seconds"] > 0 for r in report["variants"].values()), report  # a first build: compiled
        for variant in ("ptx", "sm80", "sm90"):
            assert f"{major}/{variant}: x86_64" in log and "built in" in log


def test_the_cpu_twin_calls_libm_and_stays_manylinux_2_17(llm_project):
    from cuplug.kit import gate, glibc

    project, _ = llm_project
    wheel = next((project / "dist").glob("llmkit-0.1.0-py3-none-manylinux*.whl"))
    assert gate.check_wheel(wheel) == []
    with zipfile.ZipFile(wheel) as zf:
        twin = zf.read("llmkit/libcuplug_llm_cpu.so")
    assert glibc.glibc_needs(twin) == []
    tmp = project / "build" / "twin.so"
    tmp.write_bytes(twin)
    symbols = subprocess.run(["nm", "-D", str(tmp)], capture_output=True, text=True, check=True).stdout
    assert "expf@GLIBC_2.2.5" in symbols and "tanhf" in symbols


def test_the_projects_tests_pass_on_the_twin(llm_project):
    _, log = llm_project
    assert "13 passed" in log, log[-2000:]
