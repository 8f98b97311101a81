"""On a real Hopper GPU (issue 33): the sm90a and the sm90 variants of `vector` (packaging/hopper.json, built by
`nox -s hopper_wheels` into dist-hopper/) are selected and run right, the self-test runs on them, and a planted
artifact wrong on exactly this architecture is rejected by its self-test, the next candidate serving.

CUPLUG_HOPPER_SITE names a site with dist/'s cuplug wheel and dist-hopper/'s backend wheels installed
(bench/gpu_targets.sh makes it); CUPLUG_PLANTED_SM90A the planted build (bench/plant_wrong_sm90a.py; default
build/planted/libcuplug_vector.so). Skips without a CC 9.0 GPU or without the site."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, planted_site

pytestmark = pytest.mark.gpu

RUN = (
    "import json, cuplug, array\n"
    "b = cuplug.load(); t = b.trace\n"
    "x = array.array('f', [float(i) for i in range(64)]); y = array.array('f', [1.0] * 64)\n"
    "r = b.run('add', x, y)\n"
    "print(json.dumps({'variant': f'{b.cuda}/{b.variant}', 'device_type': b.device_type, 'sum': sum(r),\n"
    "                  'attempts': [[a.label, a.code, a.reason] for a in t.attempts],\n"
    "                  'selftests': [s.as_json() for s in t.selftests]}))"
)


def _site() -> Path:
    site = os.environ.get("CUPLUG_HOPPER_SITE")
    if not site or not (Path(site) / "cuplug_cuda13" / "sm90a").is_dir():
        pytest.skip("CUPLUG_HOPPER_SITE names no site with the hopper wheels (bench/gpu_targets.sh)")
    return Path(site)


def _hopper() -> bool:
    try:
        import cuplug

        facts = cuplug.probe(isolated=True) if hasattr(cuplug, "probe") else None
    except Exception:
        return False
    devices = (facts or {}).get("devices") or []
    return any(d.get("capability") == "9.0" for d in devices)


if not _hopper():
    pytest.skip("needs a CC 9.0 GPU (H100/H200)", allow_module_level=True)


def _run(site: Path, cache: Path, **env: str) -> dict:
    full = {**os.environ, "PYTHONPATH": str(site), "CUPLUG_CACHE_DIR": str(cache), **env}
    proc = subprocess.run([sys.executable, "-c", RUN], env=full, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_arch_specific_variant_serves_a_hopper_and_the_plain_one_when_forced(tmp_path):
    auto = _run(_site(), tmp_path / "cache", CUPLUG_SELFTEST="always")
    assert auto["variant"] == "cuda13/sm90a" and auto["device_type"] == 2, auto
    assert auto["sum"] == sum(range(64)) + 64 and auto["selftests"][0]["outcome"] == "passed"
    plain = _run(_site(), tmp_path / "cache", CUPLUG_BACKEND="cuda13:sm90", CUPLUG_SELFTEST="always")
    assert plain["variant"] == "cuda13/sm90" and plain["sum"] == auto["sum"]
    assert plain["selftests"][0]["outcome"] == "passed"
    fatbin = _run(_site(), tmp_path / "cache", CUPLUG_BACKEND="cuda13:fatbin", CUPLUG_SELFTEST="always")
    assert fatbin["variant"] == "cuda13/fatbin" and fatbin["sum"] == auto["sum"]
    cuda12 = _run(_site(), tmp_path / "cache", CUPLUG_BACKEND="cuda12:sm90a", CUPLUG_SELFTEST="always")
    assert cuda12["variant"] == "cuda12/sm90a" and cuda12["sum"] == auto["sum"]


def test_a_planted_artifact_wrong_on_this_architecture_is_rejected_by_its_self_test(tmp_path):
    planted = Path(os.environ.get("CUPLUG_PLANTED_SM90A", ROOT / "build" / "planted" / "libcuplug_vector.so"))
    if not planted.is_file():
        pytest.skip(f"no planted build at {planted} (bench/plant_wrong_sm90a.py makes it)")
    site = planted_site(_site(), tmp_path / "site", "cuplug_cuda13/sm90a/libcuplug_vector.so", planted.read_bytes())
    got = _run(site, tmp_path / "cache")
    first = got["attempts"][0]
    assert first[0] == "cuda13/sm90a" and first[1] == "self-test-mismatch", got
    assert first[2].startswith("add: output 0: element ") and "the CPU twin gives" in first[2]
    # the next candidate in the decision's order serves: CUDA 12's sm90a (the same kind, the older toolkit)
    assert got["variant"] == "cuda12/sm90a" and got["sum"] == sum(range(64)) + 64
    assert [s["outcome"] for s in got["selftests"]] == ["mismatch", "passed"]
    assert not (tmp_path / "cache" / "selftest").exists() or len(list((tmp_path / "cache" / "selftest").iterdir())) == 1


@pytest.mark.parametrize("major", ["cuda13", "cuda12"])
def test_the_lto_variant_is_linked_for_this_gpu_and_computes_right(major, tmp_path):
    """packaging/hopper.json's lto variant: nvJitLink (the GPU machine's, or one on CUPLUG_NVJITLINK_SITE) links its
    LTO-IR for sm_90 at load; the kernels of the linked image run and agree with the CPU twin; the image is kept."""
    from cuplug.runtime import jitlink

    extra = os.environ.get("CUPLUG_NVJITLINK_SITE", "")
    if jitlink.find(int(major[4:]), path=[extra, *sys.path] if extra else None) is None:
        pytest.skip(f"no nvJitLink {major[4:]}.x installed here or on CUPLUG_NVJITLINK_SITE")
    site = _site()
    path = f"{site}{os.pathsep}{extra}" if extra else str(site)
    first = _run(site, tmp_path / "cache", CUPLUG_BACKEND=f"{major}:lto", CUPLUG_SELFTEST="always", PYTHONPATH=path)
    assert first["variant"] == f"{major}/lto" and first["device_type"] == 2, first
    assert first["sum"] == sum(range(64)) + 64 and first["selftests"][0]["outcome"] == "passed", first
    assert "LTO-IR linked for sm_90: linked by nvJitLink" in first["attempts"][-1][2], first
    again = _run(site, tmp_path / "cache", CUPLUG_BACKEND=f"{major}:lto", PYTHONPATH=path)
    assert again["variant"] == f"{major}/lto" and again["sum"] == first["sum"]
    assert again["attempts"][-1][2].endswith("LTO-IR linked for sm_90: reused from the cache"), again
