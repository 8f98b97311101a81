"""The driver probe, the decision and the CLI in subprocesses against a fake libcuda.so.1."""

from __future__ import annotations

import json
import time

import pytest

from conftest import clean_env, run_cli, run_json

PROBE = "import json, cuplug; print(json.dumps(cuplug.probe()))"
DECIDE = "import json, cuplug; print(json.dumps(cuplug.explain().to_json()))"


def fake(fake_driver_dir, **env):
    return clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), **env)


BINDINGS_VS_CUPLUG = """
import json, cuplug
from cuda.bindings import driver as d
def ok(r):
    err, *v = r
    assert int(err) == 0, err
    return v[0] if v else None
ok(d.cuInit(0))
A = d.CUdevice_attribute
theirs = {"driver_version": ok(d.cuDriverGetVersion()), "devices": []}
for i in range(ok(d.cuDeviceGetCount())):
    dev = ok(d.cuDeviceGet(i))
    cc = [ok(d.cuDeviceGetAttribute(getattr(A, f"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{p}"), dev))
          for p in ("MAJOR", "MINOR")]
    theirs["devices"].append({"capability": f"{cc[0]}.{cc[1]}", "memory_bytes": ok(d.cuDeviceTotalMem(dev)),
                              "uuid": bytes(ok(d.cuDeviceGetUuid(dev)).bytes).hex(),
                              "name": ok(d.cuDeviceGetName(256, dev)).split(b"\\0")[0].decode()})
ours = cuplug.probe()
ours = {"driver_version": ours["driver_version"], "devices": [
    {"capability": x["capability"], "memory_bytes": x["memory_bytes"], "uuid": x["uuid"].replace("-", "")[3:],
     "name": x["name"]} for x in ours["devices"]]}
print(json.dumps([theirs, ours]))
"""


def test_fake_driver_serves_nvidias_bindings_and_agrees_with_the_probe(fake_driver_dir):
    pytest.importorskip("cuda.bindings.driver")
    env = fake(
        fake_driver_dir, FAKE_CUDA_DEVICES="9.0,8.6", FAKE_CUDA_DRIVER_VERSION="12040", CUDA_VISIBLE_DEVICES="1,0"
    )
    theirs, ours = run_json(BINDINGS_VS_CUPLUG, env)
    assert theirs == ours and [x["capability"] for x in ours["devices"]] == ["8.6", "9.0"]


@pytest.mark.reliability(
    case="no driver", how="no libcuda.so.1 on the search path", expect="no-driver, CPU fallback, `cuplug probe` exit 10"
)
def test_no_driver():
    got = run_json(PROBE, clean_env())
    assert got["code"] == "no-driver" and not got["driver_found"]


def test_fake_driver_facts(fake_driver_dir):
    got = run_json(PROBE, fake(fake_driver_dir, FAKE_CUDA_DEVICES="9.0,8.6", FAKE_CUDA_DRIVER_VERSION="12040"))
    assert got["code"] == "ok" and got["driver_version"] == 12040
    assert got["driver_path"].endswith("libcuda.so.1") and str(fake_driver_dir) in got["driver_path"]
    assert [d["capability"] for d in got["devices"]] == ["9.0", "8.6"]
    assert got["devices"][1]["uuid"].startswith("GPU-") and got["devices"][0]["memory_bytes"] == 16 << 30


@pytest.mark.reliability(
    case="CUDA_VISIBLE_DEVICES reorders or names devices",
    how="indices, a reordered list, a list with a bad entry, a UUID",
    expect="the driver's numbering as cuInit applied it, reported as is",
)
@pytest.mark.parametrize(
    ("visible", "caps"),
    [
        ("1", ["8.6"]),
        ("1,0", ["8.6", "9.0"]),
        ("0,7,1", ["9.0"]),
        ("GPU-abababab-abab-abab-abab-ababababab01", ["8.6"]),
    ],
)
def test_cuda_visible_devices_is_the_drivers_business(fake_driver_dir, visible, caps):
    got = run_json(PROBE, fake(fake_driver_dir, FAKE_CUDA_DEVICES="9.0,8.6", CUDA_VISIBLE_DEVICES=visible))
    assert [d["capability"] for d in got["devices"]] == caps
    assert got["visible_devices"] == visible


@pytest.mark.reliability(
    case="CUDA_VISIBLE_DEVICES hides every device",
    how="empty, `-1`, or an index out of range (`5`)",
    expect="no-device; cuplug never re-applies the variable on top of the driver",
)
@pytest.mark.parametrize("visible", ["", "-1", "5"])
def test_no_visible_device(fake_driver_dir, visible):
    got = run_json(PROBE, fake(fake_driver_dir, CUDA_VISIBLE_DEVICES=visible))
    assert got["code"] == "no-device"


@pytest.mark.reliability(
    case="driver present but unusable at cuInit",
    how="fake driver: cuInit returns CUDA_ERROR_STUB_LIBRARY (34), CUDA_ERROR_INSUFFICIENT_DRIVER (35) or an unknown error (999)",
    expect="driver-init-failed with the driver's error name in the reason",
)
@pytest.mark.parametrize(("err", "name"), [("34", "STUB_LIBRARY"), ("35", "INSUFFICIENT_DRIVER"), ("999", "UNKNOWN")])
def test_init_failures(fake_driver_dir, err, name):
    got = run_json(PROBE, fake(fake_driver_dir, FAKE_CUDA_INIT_ERROR=err))
    assert got["code"] == "driver-init-failed" and name in got["reason"]


@pytest.mark.reliability(
    case="kill switch",
    how="CUPLUG_DISABLE_CUDA=1 or BACKEND_CUDA_DISABLE=1 with a driver present",
    expect="disabled; libcuda.so.1 is never opened (the fake driver's load marker stays absent)",
)
def test_kill_switch_never_opens_the_driver(fake_driver_dir, tmp_path):
    marker = tmp_path / "opened"
    for var in ("CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE"):
        got = run_json(DECIDE, fake(fake_driver_dir, FAKE_CUDA_MARKER=str(marker), **{var: "1"}))
        assert got["decision"]["code"] == "disabled" and got["driver"] is None
        assert not marker.exists()
    run_json(DECIDE, fake(fake_driver_dir, FAKE_CUDA_MARKER=str(marker)))
    assert marker.exists()  # the marker works: without the switch the driver is opened


def test_decision_without_backends(fake_driver_dir):
    got = run_json(DECIDE, fake(fake_driver_dir))
    assert got["decision"]["code"] == "no-backend-installed" and got["decision"]["variant"] == "cpu"
    got = run_json(DECIDE, fake(fake_driver_dir, CUPLUG_DEVICE="4"))
    assert got["decision"]["code"] == "no-device" and "CUPLUG_DEVICE=4" in got["decision"]["reason"]


def test_require_cuda_turns_fallback_into_error(fake_driver_dir):
    proc = run_cli(["probe"], fake(fake_driver_dir, CUPLUG_REQUIRE_CUDA="1"))
    assert proc.returncode == 2 and "CUPLUG_REQUIRE_CUDA=1" in proc.stderr


@pytest.mark.parametrize(
    ("env", "plain", "allowed"),
    [
        ({}, 10, 0),
        ({"CUPLUG_DISABLE_CUDA": "1"}, 20, 0),
        ({"CUPLUG_BACKEND": "cpu"}, 0, 0),
    ],
)
def test_probe_exit_codes_without_driver(tmp_path, env, plain, allowed):
    proc = run_cli(["probe"], clean_env(**env), cwd=tmp_path)
    assert proc.returncode == plain, proc.stdout + proc.stderr
    proc = run_cli(["probe", "--allow-cpu", "--json"], clean_env(**env), cwd=tmp_path)
    assert proc.returncode == allowed
    out = json.loads(proc.stdout)
    assert out["ok"] and out["variant"] == "cpu"


def test_probe_exit_codes_with_fake_driver(fake_driver_dir, tmp_path):
    assert run_cli(["probe"], fake(fake_driver_dir, CUDA_VISIBLE_DEVICES=""), cwd=tmp_path).returncode == 11
    assert run_cli(["probe"], fake(fake_driver_dir, FAKE_CUDA_INIT_ERROR="34"), cwd=tmp_path).returncode == 10
    assert run_cli(["probe"], fake(fake_driver_dir, FAKE_CUDA_DEVICES="7.0"), cwd=tmp_path).returncode == 14
    assert run_cli(["probe"], fake(fake_driver_dir), cwd=tmp_path).returncode == 14


def test_doctor_json_schema_fields(fake_driver_dir):
    proc = run_cli(["doctor", "--json"], fake(fake_driver_dir, FAKE_CUDA_DEVICES="8.6"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "cuplug.doctor/1"
    assert doc["driver"]["found"] and doc["driver"]["version"] == 13000
    assert doc["devices"][0]["capability"] == "8.6"
    assert doc["decision"]["code"] == "no-backend-installed"
    assert doc["loaded"]["ok"] and doc["loaded"]["variant"] == "cpu"
    assert doc["loaded"]["attempts"][-1] == {"variant": "cpu", "cuda": None, "code": "ok", "reason": "loaded"}


def test_doctor_text_table(fake_driver_dir):
    proc = run_cli(["doctor"], fake(fake_driver_dir, FAKE_CUDA_DRIVER_VERSION="12040"))
    assert "[backend-cuda] driver version      : 12.4" in proc.stdout
    assert "[backend-cuda] backend ABI         : v2" in proc.stdout
    assert "decision" in proc.stdout


@pytest.mark.parametrize(
    ("argv", "step"),
    [
        (["doctor"], "decide and load"),
        (["doctor", "--json"], "decide and load"),
        (["doctor", "--no-load"], "decide (driver probe)"),
    ],
)
def test_doctor_never_hangs_on_a_stuck_driver(fake_driver_dir, tmp_path, argv, step):
    """A cuInit that never returns (FAKE_CUDA_INIT_SLEEP_MS) is what doctor is run to diagnose: with --timeout 2
    it comes back within seconds, exit 10 (driver-init-failed), naming the step that hung and where to look."""
    t0 = time.monotonic()
    proc = run_cli([*argv, "--timeout", "2"], fake(fake_driver_dir, FAKE_CUDA_INIT_SLEEP_MS="60000"), cwd=tmp_path)
    assert proc.returncode == 10 and time.monotonic() - t0 < 20, (proc.returncode, proc.stderr)
    assert f"cuplug: step '{step}' did not finish within 2 s" in proc.stderr and "nvidia-smi" in proc.stderr


def test_help_lists_exit_codes():
    proc = run_cli(["probe", "--help"], clean_env())
    assert "no-backend-installed" in proc.stdout and "20  disabled" in proc.stdout
