"""Issue 18, class 4: driver facts that failed are unknown, not zero.

The fake driver fails one call at a time (FAKE_CUDA_* in fake_libcuda.c): a failed
attribute read must not report CC 0.0 or turn a 7.5 card into 7.0, a failed
cuDeviceGet must not read as "0 devices", a driver version of -1 must not show as
"-1.99". The failure is carried into the reason and the CPU answers.
"""

from __future__ import annotations

import json

import pytest

from conftest import clean_env, env_for, needs_wheels, run_cli, run_json

PROBE = "import json, cuplug; print(json.dumps(cuplug.probe()))"
DECIDE = "import json, cuplug; print(json.dumps(cuplug.explain().to_json()))"


def fake(fake_driver_dir, **env):
    return clean_env(LD_LIBRARY_PATH=str(fake_driver_dir), **env)


@pytest.mark.reliability(
    case="a device attribute read fails",
    how="fake driver with one CC 7.5 card whose cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR) (or _MAJOR) fails "
    "after writing 0",
    expect="capability unknown (null in JSON, `CC unknown` in doctor), never 7.0 or 0.0; the decision is "
    "driver-init-failed naming the failed call; no artifact is chosen for a capability nobody read",
)
@needs_wheels
@pytest.mark.parametrize("attr", ["76", "75"], ids=["minor", "major"])
def test_failed_attribute_is_unknown_not_zero(attr, site, fake_driver_dir):
    env = env_for(site, fake_driver_dir, FAKE_CUDA_DEVICES="7.5", FAKE_CUDA_ATTR_FAIL=attr)
    got = run_json(PROBE, env)
    dev = got["devices"][0]
    assert dev["capability"] is None and "COMPUTE_CAPABILITY_" in dev["problem"], dev
    assert got["code"] == "driver-init-failed"
    trace = run_json(DECIDE, env)
    assert trace["decision"]["code"] == "driver-init-failed" and "COMPUTE_CAPABILITY" in trace["decision"]["reason"]
    assert all(not c["accepted"] for c in trace["candidates"] if c["variant"] != "cpu")
    text = run_cli(["doctor", "--no-load"], env).stdout
    assert "CC unknown" in text and "CC 7.0" not in text and "CC 0.0" not in text, text


@pytest.mark.reliability(
    case="cuDeviceGet fails",
    how="fake driver with 9.0 and 7.5 whose cuDeviceGet fails (CUDA_ERROR_INVALID_DEVICE) for every ordinal; "
    "CUPLUG_DEVICE=0 and =1",
    expect="cuDeviceGet failing is driver-init-failed naming cuDeviceGet, never `0 devices` / no-device",
)
def test_failed_device_get_is_not_zero_devices(fake_driver_dir):
    got = run_json(PROBE, fake(fake_driver_dir, FAKE_CUDA_DEVICES="9.0,7.5", FAKE_CUDA_DEVICE_GET_ERROR="101"))
    assert got["code"] == "driver-init-failed" and "cuDeviceGet(0) failed" in got["reason"], got
    assert "0 devices" not in got["reason"] and len(got["devices"]) == 2
    assert all(d["capability"] is None and d["name"] is None for d in got["devices"])
    trace = run_json(
        DECIDE, fake(fake_driver_dir, FAKE_CUDA_DEVICES="9.0,7.5", FAKE_CUDA_DEVICE_GET_ERROR="101", CUPLUG_DEVICE="1")
    )
    assert trace["decision"]["code"] == "driver-init-failed"


@pytest.mark.reliability(
    case="an impossible driver version",
    how="fake driver reporting cuDriverGetVersion -1, 0 or 2^31-1",
    expect="the version is unknown (null; doctor `driver version : unknown`, never -1.99), driver-init-failed "
    "quoting the value; no artifact is judged against it",
)
@pytest.mark.parametrize("version", ["-1", "0", str(2**31 - 1)])
def test_impossible_driver_version_is_unknown(version, fake_driver_dir):
    env = fake(fake_driver_dir, FAKE_CUDA_DRIVER_VERSION=version)
    got = run_json(PROBE, env)
    assert got["code"] == "driver-init-failed" and got["driver_version"] is None
    assert f"reported {version}" in got["reason"], got
    text = run_cli(["doctor", "--no-load"], env).stdout
    assert "[backend-cuda] driver version      : unknown" in text and "-1.99" not in text, text
    doc = json.loads(run_cli(["doctor", "--json"], env).stdout)
    assert doc["driver"]["version"] is None and doc["decision"]["code"] == "driver-init-failed"


def test_attribute_failure_marks_each_device_unknown(fake_driver_dir):
    """Every device whose read failed is unknown; without the fault the same driver gives every fact, no problem."""
    got = run_json(PROBE, fake(fake_driver_dir, FAKE_CUDA_DEVICES="9.0,8.6", FAKE_CUDA_ATTR_FAIL="76"))
    assert [d["capability"] for d in got["devices"]] == [None, None]
    ok = run_json(PROBE, fake(fake_driver_dir, FAKE_CUDA_DEVICES="9.0,8.6"))
    assert [d["capability"] for d in ok["devices"]] == ["9.0", "8.6"] and all(
        d["problem"] is None for d in ok["devices"]
    )


@pytest.mark.reliability(
    case="one of two devices cannot be read",
    how="fake driver with 9.0 and 8.6; the capability read fails only for device 0; CUPLUG_DEVICE=0 and =1",
    expect="device 0 is unknown and CUPLUG_DEVICE=0 is driver-init-failed naming device 0's failed call; device 1 "
    "keeps its facts and CUPLUG_DEVICE=1 chooses cuda13/fatbin for its exact sm_86",
)
@needs_wheels
def test_one_unreadable_device_does_not_hide_the_other(site, fake_driver_dir):
    lie = {"FAKE_CUDA_DEVICES": "9.0,8.6", "FAKE_CUDA_ATTR_FAIL": "76", "FAKE_CUDA_ATTR_FAIL_DEVICE": "0"}
    got = run_json(PROBE, env_for(site, fake_driver_dir, **lie))
    assert got["code"] == "ok" and [d["capability"] for d in got["devices"]] == [None, "8.6"], got
    assert "unknown capability" in got["reason"]
    first = run_json(DECIDE, env_for(site, fake_driver_dir, CUPLUG_DEVICE="0", **lie))
    assert first["decision"]["code"] == "driver-init-failed" and "device 0" in first["decision"]["reason"]
    second = run_json(DECIDE, env_for(site, fake_driver_dir, CUPLUG_DEVICE="1", **lie))
    best = second["candidates"][0]
    assert (best["cuda"], best["variant"], best["accepted"]) == ("cuda13", "fatbin", True) and "sm_86" in best["reason"]
