"""The wheels as a user receives them: the shipping gate, and pip installs into fresh venvs.

Every install runs `pip install --no-index --find-links <wheels>` in a new
virtual environment and runs `cuplug` from a temporary directory, so nothing
comes from the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import WHEELS, clean_env, needs_wheels

DEPS = os.environ.get("CUPLUG_TEST_DEPS", "")
pytestmark = needs_wheels


def _wheel(prefix: str) -> Path:
    found = sorted(Path(WHEELS).glob(f"{prefix}-*.whl"))
    assert len(found) == 1, (prefix, found)
    return found[0]


def test_every_wheel_passes_the_gate():
    wheels = sorted(Path(WHEELS).glob("*.whl"))
    assert {w.name.split("-")[0] for w in wheels} == {"cuplug", "cuplug_cuda12", "cuplug_cuda13"}
    for w in wheels:  # cuplug's own holds its C dispatcher on the stable ABI; the backend wheels no extension
        tags = "-cp311-abi3-" if w.name.startswith("cuplug-") else "-py3-none-"
        assert tags in w.name and "manylinux_2_17_x86_64" in w.name, w.name
    proc = subprocess.run(
        [sys.executable, "-m", "cuplug.kit", "check", *map(str, wheels)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(Path(WHEELS).glob("cuplug-*.tar.gz")), "the sdist is missing"


def test_backend_wheels_hold_all_variants_within_5_mb():
    for major in ("cuda12", "cuda13"):
        w = _wheel(f"cuplug_{major}")
        assert w.stat().st_size <= 5 * 2**20, (w.name, w.stat().st_size)
        names = zipfile.ZipFile(w).namelist()
        assert sorted(n for n in names if n.endswith(".so")) == [
            f"cuplug_{major}/{v}/libcuplug_vector.so" for v in ("fatbin", "ptx", "sm75", "sm80")
        ]
        meta = zipfile.ZipFile(w).read(f"cuplug_{major}-0.1.0.dist-info/METADATA").decode()
        assert "Requires-Dist: cuplug==0.1.0" in meta


def _doctored(src: Path, dest: Path, add: dict[str, bytes] | None = None, flip: str | None = None) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename == flip:
                data = data[:1000] + bytes([data[1000] ^ 1]) + data[1001:]
            zout.writestr(item, data)
        for name, data in (add or {}).items():
            zout.writestr(name, data)
    return dest


@pytest.fixture(scope="module")
def rpath_lib(tmp_path_factory) -> bytes:
    d = tmp_path_factory.mktemp("rpath")
    (d / "x.c").write_text("int x(void) { return 1; }\n")
    subprocess.run(
        [
            os.environ.get("CC", "cc"),
            "-shared",
            "-fPIC",
            "-o",
            str(d / "libx.so"),
            str(d / "x.c"),
            "-Wl,-rpath,/usr/local/cuda/lib64",
        ],
        check=True,
    )
    return (d / "libx.so").read_bytes()


@pytest.mark.parametrize("case", ["libcuda", "libcudart", "rpath", "flipped", "linux-tag"])
def test_gate_refuses_a_bad_wheel(case, tmp_path, rpath_lib):
    from cuplug.kit.gate import check_wheel

    src = _wheel("cuplug_cuda13")
    name = src.name
    if case == "linux-tag":
        name = name.split("-py3-")[0] + "-py3-none-linux_x86_64.whl"
    dest = tmp_path / name
    add = {
        "libcuda": {"cuplug_cuda13/libcuda.so.1": b"\x7fELF"},
        "libcudart": {"cuplug_cuda13/lib/libcudart.so.13": b"\x7fELF"},
        "rpath": {"cuplug_cuda13/extra/libx.so": rpath_lib},
    }.get(case)
    flip = "cuplug_cuda13/sm80/libcuplug_vector.so" if case == "flipped" else None
    problems = check_wheel(_doctored(src, dest, add, flip))
    expected = {
        "libcuda": "never bundled",
        "libcudart": "never bundled",
        "rpath": "points outside the package",
        "flipped": "size/sha256 differ",
        "linux-tag": "not a manylinux tag",
    }[case]
    assert any(expected in p for p in problems), problems


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where / "bin"


def _pip_install(bindir: Path, *what: str, links: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    find = [a for d in (links or [WHEELS, DEPS]) if d for a in ("--find-links", d)]
    return subprocess.run(
        [str(bindir / "python"), "-m", "pip", "install", "-q", "--no-index", *find, *what],
        capture_output=True,
        text=True,
        env=clean_env(),
    )


def _cuplug(bindir: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bindir / "cuplug"), *args], capture_output=True, text=True, cwd=cwd, env=env or clean_env(), timeout=120
    )


def _doctor(bindir: Path, cwd: Path, env: dict[str, str] | None = None) -> dict:
    proc = _cuplug(bindir, "doctor", "--json", cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("extras", ["cuda12", "cuda13", "cuda12,cuda13"])
def test_pip_install_extra_into_fresh_venv(extras, tmp_path, fake_driver_dir):
    bindir = _venv(tmp_path / "venv")
    proc = _pip_install(bindir, f"cuplug[{extras}]")
    assert proc.returncode == 0, proc.stderr
    doc = _doctor(bindir, tmp_path)
    assert {c["cuda"] for c in doc["candidates"] if c["variant"] != "cpu"} == set(extras.split(","))
    assert all("/venv/" in p["path"] for p in doc["packages"]), doc["packages"]
    assert doc["loaded"]["ok"] and doc["loaded"]["variant"] == "cpu"  # no driver here
    probe = _cuplug(bindir, "probe", "--allow-cpu", cwd=tmp_path)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    if extras == "cuda12":  # the backend wheel removed: a working CPU fallback that says so
        subprocess.run([str(bindir / "python"), "-m", "pip", "uninstall", "-q", "-y", "cuplug-cuda12"], check=True)
        # No driver here either: the driver is the first missing step, as in DESIGN's order.
        doc = _doctor(bindir, tmp_path)
        assert doc["decision"]["code"] == "no-driver" and doc["packages"] == []
        # With a driver and an sm_90 device, the missing wheel is the reason.
        gpu = clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_DEVICES="9.0")
        doc = _doctor(bindir, tmp_path, gpu)
        assert doc["decision"]["code"] == "no-backend-installed" and doc["packages"] == []
        assert "pip install" in doc["decision"]["reason"]
        assert doc["loaded"]["ok"] and doc["loaded"]["variant"] == "cpu"
        assert _cuplug(bindir, "probe", cwd=tmp_path, env=gpu).returncode == 14
        assert _cuplug(bindir, "probe", "--allow-cpu", cwd=tmp_path, env=gpu).returncode == 0


def test_backend_wheel_without_the_loader_fails_clearly(tmp_path):
    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(_wheel("cuplug_cuda12"), only)
    bindir = _venv(tmp_path / "venv")
    proc = _pip_install(bindir, "cuplug-cuda12", links=[str(only)])
    assert proc.returncode != 0 and "cuplug==0.1.0" in proc.stderr, proc.stderr
    assert _pip_install(bindir, "--no-deps", "cuplug-cuda12", links=[str(only)]).returncode == 0
    imp = subprocess.run(
        [str(bindir / "python"), "-c", "import cuplug_cuda12"], capture_output=True, text=True, cwd=tmp_path
    )
    assert imp.returncode == 1 and "install cuplug" in imp.stderr and "cuplug.load()" in imp.stderr, imp.stderr
