"""The loader on the real CUDA artifacts from build_backends, installed from their wheels.

No GPU here: a fake libcuda.so.1 supplies the facts, so selection, verification,
dlopen and the ABI check run for real, and create() fails the way a machine
whose driver cannot serve the runtime does (load-failed), ending at the CPU.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import env_for, needs_wheels, run_cli, run_json

pytestmark = needs_wheels
DECIDE_LOAD = (
    "import json, cuplug; b = cuplug.load(); t = b.trace; print(json.dumps({'variant': b.variant, "
    "'cuda': b.cuda, 'code': t.decision_code, 'attempts': [a.to_json() for a in t.attempts], "
    "'candidates': [[c.label, c.accepted, c.code] for c in t.candidates]}))"
)


def test_every_artifact_matches_its_manifest_and_loads_without_driver(site):
    code = (
        "import json, cuplug.runtime.discovery as d, cuplug.runtime.verify as v, cuplug.runtime.library as a; out = [];\n"
        "for p in d.discover().packages:\n"
        "  for art in p.artifacts:\n"
        "    lib = a.BackendLibrary(v.verify(art)); out.append([p.cuda, art.variant, lib.abi_version()])\n"
        "print(json.dumps(out))"
    )
    got = run_json(code, env_for(site))
    assert sorted(map(tuple, got)) == sorted(
        (c, v, 2) for c in ("cuda12", "cuda13") for v in ("fatbin", "ptx", "sm75", "sm80")
    )


def test_manifest_facts(site):
    m12 = json.loads((site / "cuplug_cuda12" / "manifest.json").read_text())
    m13 = json.loads((site / "cuplug_cuda13" / "manifest.json").read_text())
    by = {(m["cuda"], a["variant"]): a for m in (m12, m13) for a in m["artifacts"]}
    assert by["cuda12", "sm75"]["sass"] == ["sm_75"] and by["cuda12", "sm75"]["ptx"] == []
    assert by["cuda12", "ptx"]["ptx"] == ["compute_75"] and by["cuda12", "ptx"]["ptx_isa"] == "8.4"
    assert by["cuda13", "ptx"]["ptx_isa"] == "9.0" and by["cuda13", "ptx"]["min_driver"] == 13000
    assert by["cuda12", "fatbin"]["sass"][-1] == "sm_90" and by["cuda12", "fatbin"]["ptx"] == ["compute_90"]
    assert by["cuda13", "fatbin"]["ptx"] == ["compute_121"] and "sm_121" in by["cuda13", "fatbin"]["sass"]


@pytest.mark.parametrize(
    ("caps", "driver", "first"),
    [
        ("9.0", "13000", "cuda13/fatbin"),
        ("8.0", "13000", "cuda13/sm80"),
        ("8.6", "13000", "cuda13/fatbin"),
        ("7.5", "12040", "cuda12/sm75"),
        ("9.0", "12040", "cuda12/fatbin"),
        ("12.0", "12040", "cuda12/ptx"),
    ],
)
def test_selection_on_real_manifests(site, fake_driver_dir, caps, driver, first):
    got = run_json(DECIDE_LOAD, env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES=caps, FAKE_CUDA_DRIVER_VERSION=driver))
    accepted = [c[0] for c in got["candidates"] if c[1]]
    assert accepted[0] == first, got["candidates"]
    # The fake driver cannot serve cudart: every CUDA candidate fails create() cleanly, the CPU serves.
    assert got["variant"] == "cpu" and got["code"] == "load-failed"
    assert [a["code"] for a in got["attempts"]][:-1] == ["load-failed"] * (len(accepted) - 1)


@pytest.mark.reliability(
    case="driver too old for the artifact",
    how="fake driver reporting CUDA 12.4 with both extras installed",
    expect="every cuda13 artifact rejected with driver-too-old before any dlopen; cuda12 chosen",
)
def test_driver_too_old_for_cuda13(site, fake_driver_dir):
    got = run_json(DECIDE_LOAD, env_for(site, fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="12040"))
    rejected = {c[0]: c[2] for c in got["candidates"] if not c[1]}
    assert all(rejected[f"cuda13/{v}"] == "driver-too-old" for v in ("fatbin", "ptx", "sm75", "sm80"))


def test_corrupt_artifact_is_refused_and_the_next_one_tried(site, fake_driver_dir, tmp_path):
    broken = tmp_path / "site"
    shutil.copytree(site, broken)
    so = broken / "cuplug_cuda13" / "fatbin" / "libcuplug_vector.so"
    so.write_bytes(so.read_bytes()[:4096])  # truncated: dlopen could SIGBUS; must never get there
    flipped = broken / "cuplug_cuda12" / "fatbin" / "libcuplug_vector.so"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    got = run_json(DECIDE_LOAD, env_for(broken, fake_driver_dir))
    codes = {f"{a['cuda']}/{a['variant']}": a["code"] for a in got["attempts"]}
    assert codes["cuda13/fatbin"] == "artifact-corrupt" and codes["cuda12/fatbin"] == "artifact-corrupt"
    assert codes["cuda13/ptx"] == "load-failed" and got["variant"] == "cpu"


def test_require_cuda_makes_fallback_an_error(site, fake_driver_dir):
    proc = run_cli(["probe"], env_for(site, fake_driver_dir, CUPLUG_REQUIRE_CUDA="1"))
    assert proc.returncode == 2 and "load-failed" in proc.stderr


def test_probe_and_doctor_exit_codes(site, fake_driver_dir, tmp_path):
    assert run_cli(["probe"], env_for(site, fake_driver_dir), cwd=tmp_path).returncode == 16  # load-failed
    assert run_cli(["probe"], env_for(site), cwd=tmp_path).returncode == 10
    assert run_cli(["probe", "--allow-cpu"], env_for(site, fake_driver_dir), cwd=tmp_path).returncode == 0
    doc = json.loads(run_cli(["doctor", "--json"], env_for(site, fake_driver_dir)).stdout)
    assert {c["cuda"] for c in doc["candidates"]} == {"cuda12", "cuda13", None}
    assert [a["code"] for a in doc["loaded"]["attempts"]][-1] == "ok"


def test_planted_library_is_never_loaded(site, fake_driver_dir, tmp_path):
    plant = tmp_path / "plant"
    plant.mkdir()
    shutil.copy(site / "cuplug_cuda13" / "fatbin" / "libcuplug_vector.so", plant / "libcuplug_vector.so")
    code = DECIDE_LOAD.replace(
        "print(", "maps = open('/proc/self/maps').read(); print(json.dumps('plant/' in maps)); print("
    )
    env = env_for(site, fake_driver_dir)
    env["LD_LIBRARY_PATH"] = f"{plant}:{fake_driver_dir}"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=plant, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "false"


def test_kill_switch_with_backends_installed(site, fake_driver_dir):
    got = run_json(DECIDE_LOAD, env_for(site, fake_driver_dir, CUPLUG_DISABLE_CUDA="1"))
    assert got["code"] == "disabled" and got["variant"] == "cpu" and got["candidates"] == [["cpu", True, "disabled"]]


@pytest.mark.reliability(
    case="cuplug.load() racing from 16 threads",
    how="16 threads load and run at once (fake driver, real artifacts)",
    expect="16 working, isolated instances with right results",
)
def test_concurrent_load_from_16_threads(site, fake_driver_dir):
    code = (
        "import json, threading, array, cuplug; out = []\n"
        "def go(k):\n"
        "    b = cuplug.load(); x = array.array('f', [float(k)] * 1000)\n"
        "    out.append((b.variant, b.run('sum', x) == 1000.0 * k)); b.close()\n"
        "ts = [threading.Thread(target=go, args=(k,)) for k in range(16)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]; print(json.dumps(out))"
    )
    got = run_json(code, env_for(site, fake_driver_dir))
    assert len(got) == 16 and all(ok for _, ok in got)


def test_isolated_probe_leaves_this_process_uninitialized(site, fake_driver_dir):
    code = (
        "import json, cuplug; p = cuplug.probe(isolated=True); "
        "print(json.dumps([p['code'], len(p['devices']), 'libcuda' in open('/proc/self/maps').read()]))"
    )
    got = run_json(code, env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES="9.0,8.0"))
    assert got == ["ok", 2, False]
