"""Issue 18, class 7: `cuplug new-backend` never makes a package that overwrites another.

Names of cuplug and its backend packages, Python keywords, standard-library modules,
installed distributions and registered backends are refused, as are --dir values that
are files; a good name gives a project whose every Python file compiles.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env


def new_backend(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cuplug", "new-backend", *args], capture_output=True, text=True, env=clean_env(), cwd=cwd
    )


REFUSED = {
    "cuplug": (["cuplug"], "belong to cuplug"),
    "package-cuplug_cuda13": (["mine", "--package", "cuplug_cuda13"], "belong to cuplug"),
    "cuplugx": (["cuplugx"], "belong to cuplug"),
    "keyword-import": (["import"], "keyword"),
    "keyword-class": (["class"], "keyword"),
    "soft-keyword-match": (["match"], "keyword"),
    "stdlib-json": (["json"], "standard library"),
    "stdlib-package-os": (["mine", "--package", "os"], "standard library"),
    "installed-numpy": (["numpy"], "already installed"),
    "installed-package-pytest": (["mine", "--package", "pytest"], "already installed"),
    "template-scankit": (["mine", "--package", "scankit"], "reserved"),
    "not-identifier": (["my-backend"], "lowercase"),
    "uppercase": (["Histo"], "lowercase"),
    "dir-is-a-file": (["histo", "--dir", "a-file"], "not a directory"),
}


@pytest.mark.reliability(
    case="`cuplug new-backend` with a name that would overwrite or break something",
    how="cuplug, --package cuplug_cuda13, cuplugx, import, class, match, json, --package os, numpy (installed), "
    "--package pytest (installed), --package scankit, my-backend, Histo, --dir pointing at a file",
    expect="exit 2 with the reason, nothing written, no traceback",
)
@pytest.mark.parametrize("case", list(REFUSED))
def test_new_backend_refuses(case, tmp_path):
    args, needle = REFUSED[case]
    (tmp_path / "a-file").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = new_backend(*args, cwd=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "a-file").read_text() == "x"


def test_new_backend_with_a_good_name_gives_python_that_compiles(tmp_path):
    proc = new_backend("histo", "--package", "histokit", "--dir", str(tmp_path / "p"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = sorted((tmp_path / "p").rglob("*.py"))
    assert files
    for f in files:
        compile(f.read_text(), str(f), "exec")
