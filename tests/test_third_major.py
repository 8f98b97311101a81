"""A third CUDA major (issue 17): ``cuplug-cuda14`` is selectable without editing the loader.

The cuda14 package here is a renamed copy of the cuda13 wheel (its manifest says ``cuda14``, CUDA
14.0, a driver for 14.0), installed beside cuplug and cuplug-cuda13; cuplug's own METADATA gets the
``cuda14`` extra that a cuplug built with a cuda14 toolchain lock would declare (pyproject's extras).
Nothing else changes: the loader ranks, forces, refuses and reports cuda14 like the others.
Every subprocess runs in that site, so it imports that cuplug whatever directory pytest started in.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import WHEELS, needs_wheels, run_cli, run_json

DECIDE = (
    "import json, cuplug; t = cuplug.explain(); print(json.dumps({'code': t.decision_code, "
    "'decision': t.decision.label, 'packages': [p.cuda for p in t.packages], "
    "'candidates': [[c.label, c.accepted, c.code] for c in t.candidates]}))"
)
LOAD = (
    "import json, cuplug; b = cuplug.load(); t = b.trace; "
    "print(json.dumps({'variant': b.variant, 'attempts': [[a.label, a.code] for a in t.attempts]}))"
)


def _renamed_wheel(src: Path, out_dir: Path) -> Path:
    """cuplug_cuda13-*.whl as cuplug_cuda14: paths, METADATA, entry point, manifest, RECORD."""
    from cuplug.kit.wheelfile import record_line

    old, new = "cuplug_cuda13", "cuplug_cuda14"
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(src) as zin:
        for info in zin.infolist():
            if info.filename.endswith("/RECORD"):
                continue
            data = zin.read(info)
            name = info.filename.replace(old, new)
            if name.endswith("/METADATA"):
                data = data.replace(b"Name: cuplug-cuda13", b"Name: cuplug-cuda14")
            elif name.endswith("/entry_points.txt"):
                data = data.replace(old.encode(), new.encode())
            elif name.endswith("/manifest.json"):
                doc = json.loads(data)
                doc["cuda"] = "cuda14"
                for a in doc["artifacts"]:
                    a["cuda_version"], a["min_driver"] = "14.0", max(a["min_driver"], 14000)
                data = (json.dumps(doc, indent=2) + "\n").encode()
            files[name] = data
    dist_info = next(n for n in files if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
    record = [record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    dest = out_dir / src.name.replace(old, new)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for name, data in files.items():
            zout.writestr(name, data)
    return dest


@pytest.fixture(scope="module")
def site14(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cuplug, cuplug-cuda13 and the renamed cuplug-cuda14, with cuplug declaring the cuda14 extra."""
    tmp = tmp_path_factory.mktemp("cuda14")
    wheels = Path(WHEELS or "")
    cuda13 = next(wheels.glob("cuplug_cuda13-*.whl"))
    cuda14 = _renamed_wheel(cuda13, tmp)
    target = tmp / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target)]
    subprocess.run([*cmd, str(next(wheels.glob("cuplug-*.whl"))), str(cuda13), str(cuda14)], check=True)
    meta = next(target.glob("cuplug-*.dist-info")) / "METADATA"
    head, _, body = meta.read_text().partition("\n\n")
    meta.write_text(head + '\nRequires-Dist: cuplug-cuda14==0.1.0; extra == "cuda14"\n\n' + body)
    return target


def _env(site: Path, fake_driver_dir: Path, **extra: str) -> dict[str, str]:
    from conftest import clean_env

    return clean_env(PYTHONPATH=str(site), LD_LIBRARY_PATH=str(fake_driver_dir), FAKE_CUDA_DEVICES="9.0", **extra)


@needs_wheels
def test_the_newest_major_is_ranked_first(site14, fake_driver_dir):
    got = run_json(DECIDE, _env(site14, fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="14000"), site14)
    assert got["packages"] == ["cuda13", "cuda14"]
    accepted = [c[0] for c in got["candidates"] if c[1]]
    # exact SASS (the fatbins' sm_90), the newer toolkit first; then PTX, newer first; the CPU last
    assert accepted == ["cuda14/fatbin", "cuda13/fatbin", "cuda14/ptx", "cuda13/ptx", "cpu"], accepted
    assert got["decision"] == "cuda14/fatbin" and got["code"] == "ok"


@needs_wheels
def test_an_older_driver_refuses_the_new_major_only(site14, fake_driver_dir):
    got = run_json(DECIDE, _env(site14, fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="13000"), site14)
    cuda14 = [c for c in got["candidates"] if c[0].startswith("cuda14/")]
    assert len(cuda14) == 4 and all(not c[1] and c[2] == "driver-too-old" for c in cuda14), cuda14
    assert got["decision"] == "cuda13/fatbin"


@needs_wheels
def test_the_new_major_can_be_forced_and_named(site14, fake_driver_dir):
    env = _env(site14, fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="14000", CUPLUG_BACKEND="CUDA14:sm80")
    got = run_json(DECIDE, env, site14)
    assert got["candidates"][0] == ["cuda14/sm80", True, "forced"] and got["code"] == "forced"
    bad = run_cli(["probe"], {**env, "CUPLUG_BACKEND": "cuda15:fatbin"}, site14)
    assert bad.returncode == 2 and "cuda14:fatbin" in bad.stderr and "cuda15" in bad.stderr, bad.stderr


@needs_wheels
def test_load_walks_the_new_major_first_and_doctor_shows_it(site14, fake_driver_dir):
    env = _env(site14, fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="14000")
    got = run_json(LOAD, env, site14)
    assert got["variant"] == "cpu" and got["attempts"][0] == ["cuda14/fatbin", "load-failed"], got
    doc = json.loads(run_cli(["doctor", "--json"], env, site14).stdout)
    assert [p["cuda"] for p in doc["packages"]] == ["cuda13", "cuda14"]
    assert doc["loaded"]["attempts"][0]["cuda"] == "cuda14"


@needs_wheels
def test_without_the_extra_the_new_major_is_not_trusted(site14, fake_driver_dir, tmp_path):
    import shutil

    plain = tmp_path / "site"
    shutil.copytree(site14, plain)
    meta = next(plain.glob("cuplug-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace('Requires-Dist: cuplug-cuda14==0.1.0; extra == "cuda14"\n', ""))
    env = _env(plain, fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="14000")
    got = run_json(DECIDE, env, plain)
    assert got["packages"] == ["cuda13"] and got["decision"] == "cuda13/fatbin"
    doc = json.loads(run_cli(["doctor", "--json", "--no-load"], env, plain).stdout)
    assert [r["distribution"] for r in doc["refused"]] == ["cuplug_cuda14"]
