"""The variant matrix expands to the right targets, and bad entries are named (pure, no toolkit)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cuplug.build import artifacts

ROOT = Path(__file__).resolve().parents[1]

MATRIX = json.loads((ROOT / "backends" / "variants.json").read_text())
CUDA13_ARCHS = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121]


def test_matrix_expansion():
    assert artifacts.expected_targets(MATRIX, "sm75", CUDA13_ARCHS) == (["sm_75"], [])
    assert artifacts.expected_targets(MATRIX, "ptx", CUDA13_ARCHS) == ([], ["compute_75"])
    sass, ptx = artifacts.expected_targets(MATRIX, "fatbin", [50, 60, 75, 80, 90])
    assert sass == ["sm_75", "sm_80", "sm_90"] and ptx == ["compute_90"]


def test_unknown_variant_and_arch_are_named():
    with pytest.raises(artifacts.BuildError, match="unknown variant 'sm99'"):
        artifacts.expected_targets(MATRIX, "sm99", CUDA13_ARCHS)
    bad = {**MATRIX, "variants": {"sm95": {"sass": ["95"], "ptx": []}}}
    with pytest.raises(artifacts.BuildError, match="arch 95 is not supported"):
        artifacts.expected_targets(bad, "sm95", CUDA13_ARCHS)


def test_missing_compiler_is_named(tmp_path):
    with pytest.raises(artifacts.BuildError, match=r"host C/C\+\+ compiler"):
        artifacts.build_backend(None, ROOT / "backends", tmp_path, env={**os.environ, "PATH": str(tmp_path)})


def test_linkage_check_rejects_extra_exports_and_dependencies(tmp_path, cpu_lib_path):
    artifacts.check_linkage(cpu_lib_path)  # the real CPU backend passes
    src = tmp_path / "leak.c"
    src.write_text("int cuplug_backend_abi_version(void){return 1;} int helper(void){return 2;}")
    so = tmp_path / "libleak.so"

    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(artifacts.BuildError, match="helper"):
        artifacts.check_linkage(so)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src), "-lz"], check=False)
    if so.exists() and "libz" in subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout:
        with pytest.raises(artifacts.BuildError, match="needs"):
            artifacts.check_linkage(so)
