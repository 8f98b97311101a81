"""The driver probe (runtime.driver), in process, against the fake libcuda.so.1 loaded by absolute path.

Every fact the driver gives is reported as given; a fact it fails to give is None with the failing
call in the reason, never a 0 that reads as a fact; a driver that lies about counts or versions is
refused, not believed. (tests/test_hostile_driver.py runs the same driver through `python -c`.)
"""

from __future__ import annotations

import pytest

from cuplug.contract import reasons
from cuplug.runtime import driver


@pytest.fixture
def fake(fake_driver_dir, monkeypatch):
    """driver.probe() opens the fake driver; its knobs are read at each call, from this environment."""
    for name in list(__import__("os").environ):
        if name.startswith("FAKE_CUDA_") or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)
    monkeypatch.setattr(driver, "LIBCUDA", str(fake_driver_dir / "libcuda.so.1"))
    return monkeypatch


def test_a_good_driver_gives_every_fact(fake):
    fake.setenv("FAKE_CUDA_DEVICES", "9.0,7.5")
    r = driver.probe()
    assert (r.code, r.driver_found, r.driver_version, r.driver_version_str) == ("ok", True, 13000, "13.0")
    assert r.driver_path and r.driver_path.endswith("libcuda.so.1")
    assert [d.index for d in r.devices] == [0, 1] and [d.capability for d in r.devices] == [(9, 0), (7, 5)]
    d = r.devices[0]
    assert d.name and d.memory_bytes and d.memory_bytes > 0 and d.problem is None and d.capability_str == "9.0"
    assert (
        d.uuid is not None and d.uuid.startswith("GPU-") and [len(p) for p in d.uuid[4:].split("-")] == [8, 4, 4, 4, 12]
    )
    assert r.reason == "2 device(s)" and r.visible_devices is None


def test_visible_devices_are_reported_not_reapplied(fake):
    fake.setenv("FAKE_CUDA_DEVICES", "9.0,7.5,8.6")
    fake.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    r = driver.probe()
    assert r.visible_devices == "2,0" and [d.capability for d in r.devices] == [(8, 6), (9, 0)]


@pytest.mark.parametrize(("version", "shown"), [("12040", "12.4"), ("13000", "13.0"), ("11080", "11.8")])
def test_the_driver_version_as_cuda_names_it(fake, version, shown):
    fake.setenv("FAKE_CUDA_DRIVER_VERSION", version)
    assert driver.probe().driver_version_str == shown


@pytest.mark.parametrize("version", ["999", "0", "-5", "1000000"])
def test_an_impossible_driver_version_is_unknown(fake, version):
    fake.setenv("FAKE_CUDA_DRIVER_VERSION", version)
    r = driver.probe()
    assert r.code == reasons.DRIVER_INIT_FAILED and r.driver_version is None and "no CUDA version" in r.reason


def test_the_lowest_and_highest_believable_versions(fake):
    for version in ("1000", "999999"):
        fake.setenv("FAKE_CUDA_DRIVER_VERSION", version)
        assert driver.probe().driver_version == int(version)


def test_a_failing_version_call_is_unknown_with_its_error(fake):
    fake.setenv("FAKE_CUDA_VERSION_ERROR", "999")
    r = driver.probe()
    assert r.code == reasons.DRIVER_INIT_FAILED and r.driver_version is None
    assert "cuDriverGetVersion failed" in r.reason and "(999)" in r.reason


@pytest.mark.parametrize(
    ("error", "code", "words"),
    [
        ("100", "no-device", "no CUDA device visible"),
        ("34", "driver-init-failed", "(34)"),
        ("3", "driver-init-failed", "(3)"),
    ],
)
def test_cuinit_failures(fake, error, code, words):
    fake.setenv("FAKE_CUDA_INIT_ERROR", error)
    r = driver.probe()
    assert r.code == code and words in r.reason and r.devices == () and r.driver_version == 13000


def test_the_error_name_comes_from_the_driver(fake):
    fake.setenv("FAKE_CUDA_INIT_ERROR", "34")
    fake.setenv("FAKE_CUDA_ERROR_NAME", "CUDA_ERROR_STUB_LIBRARY")
    assert "CUDA_ERROR_STUB_LIBRARY (34)" in driver.probe().reason


def test_zero_devices(fake):
    fake.setenv("FAKE_CUDA_COUNT", "0")
    r = driver.probe()
    assert r.code == reasons.NO_DEVICE and "0 devices" in r.reason
    fake.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert "(CUDA_VISIBLE_DEVICES='0')" in driver.probe().reason


@pytest.mark.parametrize("count", ["65", "2147483647", "-1"])
def test_an_unbelievable_device_count_is_refused(fake, count):
    fake.setenv("FAKE_CUDA_COUNT", count)
    r = driver.probe()
    assert r.code == reasons.DRIVER_INIT_FAILED and r.devices == () and "not believable" in r.reason


def test_64_devices_are_believed(fake):
    fake.setenv("FAKE_CUDA_COUNT", "64")
    fake.setenv("FAKE_CUDA_DEVICES", ",".join(["8.0"] * 64))
    assert len(driver.probe().devices) == 64


def test_one_unreadable_capability_leaves_that_device_unknown(fake):
    fake.setenv("FAKE_CUDA_DEVICES", "9.0,8.6")
    fake.setenv("FAKE_CUDA_ATTR_FAIL", "76")
    fake.setenv("FAKE_CUDA_ATTR_FAIL_DEVICE", "1")
    r = driver.probe()
    assert r.code == "ok" and r.devices[0].capability == (9, 0)
    assert r.devices[1].capability is None and "COMPUTE_CAPABILITY_MINOR" in (r.devices[1].problem or "")
    assert r.reason == "2 device(s), 1 with unknown capability"


@pytest.mark.parametrize("attribute", ["75", "76"])
def test_no_readable_capability_is_a_failed_init(fake, attribute):
    fake.setenv("FAKE_CUDA_ATTR_FAIL", attribute)
    r = driver.probe()
    assert r.code == reasons.DRIVER_INIT_FAILED and "no device's capability could be read" in r.reason
    assert r.devices[0].capability is None


@pytest.mark.parametrize("rc", ["101", "-2"])  # a negative status is a failure too
def test_a_device_that_cannot_be_got_has_no_facts(fake, rc):
    fake.setenv("FAKE_CUDA_DEVICE_GET_ERROR", rc)
    r = driver.probe()
    d = r.devices[0]
    assert (d.name, d.capability, d.memory_bytes, d.uuid) == (None, None, None, None) and "cuDeviceGet(0) failed" in (
        d.problem or ""
    )


@pytest.mark.parametrize(
    ("cc", "ok"),
    [
        ("10.0", True),
        ("12.1", True),
        ("1.0", True),
        ("99.9", True),
        ("0.5", False),
        ("100.0", False),
        ("101.0", False),
        ("9.10", False),
        ("9.11", False),
        ("9.-1", False),
        ("-1.0", False),
    ],
)
def test_capabilities_no_gpu_has_are_refused(fake, cc, ok):
    fake.setenv("FAKE_CUDA_DEVICES", cc)
    d = driver.probe().devices[0]
    assert (d.capability is not None) == ok
    if not ok:
        assert "which no GPU has" in (d.problem or "")


def test_names_are_decoded_whatever_their_bytes(fake):
    fake.setenv("FAKE_CUDA_NAME", "H\u00e9200\nx")
    assert driver.probe().devices[0].name == "H\u00e9200\nx"


def test_no_driver_library(fake):
    fake.setattr(driver, "LIBCUDA", "/nonexistent/libcuda.so.1")
    r = driver.probe()
    assert (r.code, r.driver_found, r.driver_path, r.devices) == (reasons.NO_DRIVER, False, None, ())
    assert r.reason.startswith("/nonexistent/libcuda.so.1 not found")


def test_json_round_trip(fake):
    fake.setenv("FAKE_CUDA_DEVICES", "9.0,8.6")
    r = driver.probe()
    doc = r.to_json()
    assert doc["devices"][1]["capability"] == "8.6" and doc["driver_version"] == 13000
    assert driver.ProbeResult.from_json(doc) == r


@pytest.mark.parametrize(("v", "text"), [(12040, "12.4"), (13000, "13.0"), (None, None), (0, None), (-1, None)])
def test_version_str(v, text):
    assert driver.version_str(v) == text


def test_long_names_are_cut_at_the_buffer(fake):
    fake.setenv("FAKE_CUDA_NAME", "N" * 400)
    # names of up to 254 bytes come whole: the driver is given one byte less than the 256-byte buffer (so a
    # name is NUL-terminated whatever it writes) and writes its own NUL within that
    assert driver.probe().devices[0].name == "N" * 254
    fake.setenv("FAKE_CUDA_NAME", "N" * 254)
    assert driver.probe().devices[0].name == "N" * 254


@pytest.mark.parametrize(("given", "shown"), [(300, 128), (129, 128), (128, 128), (127, 127)])
def test_error_names_of_up_to_128_bytes_come_whole(fake, given, shown):
    fake.setenv("FAKE_CUDA_INIT_ERROR", "34")
    fake.setenv("FAKE_CUDA_ERROR_NAME", "E" * given)
    reason = driver.probe().reason
    assert f"cuInit failed: {'E' * shown} (34)" in reason


def test_an_unnamed_error_is_shown_by_number(fake):
    fake.setenv("FAKE_CUDA_INIT_ERROR", "34")
    fake.setenv("FAKE_CUDA_ERROR_NAME", "")
    assert "cuInit failed: CUDA error 34 (34)" in driver.probe().reason


def test_a_count_the_driver_did_not_write_is_no_device(fake):
    """A driver that says success and writes nothing: no device, never one made up."""
    fake.setenv("FAKE_CUDA_COUNT_UNWRITTEN", "1")
    r = driver.probe()
    assert r.code == reasons.NO_DEVICE and r.devices == ()


def test_the_isolated_probe_answers_like_the_probe(fake, fake_driver_dir):
    fake.setenv("LD_LIBRARY_PATH", str(fake_driver_dir))
    fake.setenv("FAKE_CUDA_DEVICES", "8.6")
    r = driver.probe_isolated(60)
    assert r.code == "ok" and r.devices[0].capability == (8, 6) and r.driver_version == 13000


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_the_isolated_probe_wants_a_real_timeout(timeout):
    with pytest.raises(ValueError, match="not a positive number of seconds"):
        driver.probe_isolated(timeout)


def test_a_stuck_isolated_probe_is_reported(fake, fake_driver_dir):
    fake.setenv("LD_LIBRARY_PATH", str(fake_driver_dir))
    fake.setenv("FAKE_CUDA_INIT_SLEEP_MS", "20000")
    r = driver.probe_isolated(1.5)
    assert r.code == reasons.DRIVER_INIT_FAILED and "did not answer within 2 s" in r.reason


def test_an_error_name_the_driver_did_not_give_is_not_used(fake):
    fake.setenv("FAKE_CUDA_INIT_ERROR", "34")
    fake.setenv("FAKE_CUDA_ERROR_NAME", "WRITTEN_BUT_FAILED")
    fake.setenv("FAKE_CUDA_ERROR_NAME_RC", "1")
    assert "cuInit failed: CUDA error 34 (34)" in driver.probe().reason


def test_a_negative_status_is_a_failure_too(fake):
    fake.setenv("FAKE_CUDA_VERSION_ERROR", "-5")
    r = driver.probe()
    assert r.code == reasons.DRIVER_INIT_FAILED and "cuDriverGetVersion failed" in r.reason and "(-5)" in r.reason


@pytest.mark.parametrize(("cap", "parsed"), [("9.0", (9, 0)), ("9.0.1", None), ("9", None), (None, None)])
def test_from_json_reads_only_major_dot_minor(cap, parsed):
    doc = {"code": "ok", "reason": "", "devices": [{"index": 0, "capability": cap}]}
    assert driver.ProbeResult.from_json(doc).devices[0].capability == parsed


def _child(tmp_path, body: str):
    """A stand-in for the interpreter probe_isolated starts: it prints or fails as told."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("echo boom >&2; exit 3", "driver probe process failed: boom"),
        ("echo not json", "driver probe process answered nonsense"),
        ('echo \'{"code": "ok", "reason": "", "devices": 5}\'', "driver probe process answered nonsense"),
        ('echo \'{"code": "ok", "reason": "", "devices": [{}]}\'', "driver probe process answered nonsense"),
    ],
)
def test_an_isolated_probe_that_fails_or_answers_nonsense(tmp_path, monkeypatch, body, words):
    import sys

    monkeypatch.setattr(sys, "executable", _child(tmp_path, body))
    r = driver.probe_isolated(30)
    assert r.code == reasons.DRIVER_INIT_FAILED and r.reason.startswith(words), r.reason
    assert "b'" not in r.reason  # the child's output is text


def test_a_short_timeout_is_a_timeout(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "executable", _child(tmp_path, "sleep 5"))
    r = driver.probe_isolated(0.5)
    assert r.code == reasons.DRIVER_INIT_FAILED and "did not answer within 0 s" in r.reason


@pytest.fixture(scope="module")
def odd_drivers(tmp_path_factory):
    """The fake driver without cuDeviceGetUuid_v2 (an older driver), without any UUID entry point, without
    any entry point at all; and one installed under a directory whose name has a space."""
    from conftest import HERE, build_shared_library

    out = tmp_path_factory.mktemp("odd drivers")
    built = {}
    for kind, flags in (
        ("v1uuid", ["-DFAKE_NO_UUID_V2"]),
        ("nouuid", ["-DFAKE_NO_UUID"]),
        ("nosyms", ["-DFAKE_NO_SYMBOLS"]),
        ("plain", []),
    ):
        (out / kind).mkdir()
        built[kind] = build_shared_library(
            HERE / "fake_cuda" / "fake_libcuda.c", out / kind / "libcuda.so.1", "-ldl", *flags
        )
    return built


def test_an_older_drivers_uuid_entry_point_serves(fake, odd_drivers):
    fake.setattr(driver, "LIBCUDA", str(odd_drivers["v1uuid"]))
    d = driver.probe().devices[0]
    assert d.uuid is not None and d.uuid.startswith("GPU-") and d.problem is None


def test_a_driver_without_uuids_says_so(fake, odd_drivers):
    fake.setattr(driver, "LIBCUDA", str(odd_drivers["nouuid"]))
    d = driver.probe().devices[0]
    assert d.uuid is None and d.problem == "the driver lacks cuDeviceGetUuid" and d.capability == (9, 0)


def test_a_library_without_the_entry_points_is_named_by_its_real_path(fake, odd_drivers, tmp_path):
    link = tmp_path / "libcuda-link.so.1"
    link.symlink_to(odd_drivers["nosyms"])
    fake.setattr(driver, "LIBCUDA", str(link))
    r = driver.probe()
    assert r.code == reasons.DRIVER_INIT_FAILED and r.driver_found
    assert r.reason.startswith(f"{odd_drivers['nosyms']} lacks cuInit, ") and "not a usable CUDA driver" in r.reason


def test_the_path_of_a_driver_in_a_directory_with_spaces(fake, odd_drivers):
    fake.setattr(driver, "LIBCUDA", str(odd_drivers["plain"]))
    assert driver.probe().driver_path == str(odd_drivers["plain"]) and " " in str(odd_drivers["plain"])


@pytest.mark.parametrize("error", [UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), OSError("no /proc")])
def test_unreadable_maps_leave_the_path_unknown(fake, error):
    def broken(*_a, **_k):
        raise error

    fake.setattr(driver, "open", broken, raising=False)
    r = driver.probe()
    assert r.code == "ok" and r.driver_found and r.driver_path is None


@pytest.mark.parametrize(
    ("knob", "rc"), [("FAKE_CUDA_INIT_ERROR", "-7"), ("FAKE_CUDA_COUNT_ERROR", "-7"), ("FAKE_CUDA_COUNT_ERROR", "2")]
)
def test_any_nonzero_status_of_init_or_count_fails(fake, knob, rc):
    fake.setenv(knob, rc)
    r = driver.probe()
    assert r.code == reasons.DRIVER_INIT_FAILED and f"({rc})" in r.reason and r.devices == ()


@pytest.mark.parametrize("rc", ["-3", "2"])
def test_any_nonzero_status_of_an_attribute_leaves_it_unknown(fake, rc):
    fake.setenv("FAKE_CUDA_DEVICES", "9.0,8.0")
    fake.setenv("FAKE_CUDA_ATTR_FAIL", "75")
    fake.setenv("FAKE_CUDA_ATTR_FAIL_DEVICE", "1")
    fake.setenv("FAKE_CUDA_ATTR_FAIL_RC", rc)
    d = driver.probe().devices[1]
    assert d.capability is None and "COMPUTE_CAPABILITY_MAJOR) failed: " in (d.problem or "") and f"({rc})" in d.problem


def test_a_negative_error_name_status_is_no_name(fake):
    fake.setenv("FAKE_CUDA_INIT_ERROR", "34")
    fake.setenv("FAKE_CUDA_ERROR_NAME", "WRITTEN_BUT_FAILED")
    fake.setenv("FAKE_CUDA_ERROR_NAME_RC", "-1")
    assert "cuInit failed: CUDA error 34 (34)" in driver.probe().reason


def test_an_isolated_probe_shows_the_end_of_a_long_error(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(
        sys, "executable", _child(tmp_path, "printf 'A%.0s' $(seq 100) >&2; printf 'B%.0s' $(seq 500) >&2; exit 1")
    )
    r = driver.probe_isolated(30)
    assert r.reason == "driver probe process failed: " + "B" * 500


def test_an_isolated_probe_that_cannot_start(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    r = driver.probe_isolated(30)
    assert r.code == reasons.DRIVER_INIT_FAILED and r.reason.startswith("driver probe process could not start")
