"""The CPU backend's C ABI, called directly through ctypes on the installed .so."""

from __future__ import annotations

import ctypes
import os
import subprocess

import numpy as np
import pytest

from cuplug import abi

F = ctypes.POINTER(ctypes.c_float)


@pytest.fixture
def lib(cpu_lib_path):
    return abi.BackendLibrary(cpu_lib_path)


@pytest.fixture
def handle(lib):
    h = lib.create(None)
    yield h
    lib.destroy(h)


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def test_exports_only_the_abi(cpu_lib_path):
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(cpu_lib_path)], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert names == set(abi.SYMBOLS)


def test_abi_version_and_ping(lib, handle):
    assert lib.abi_version() == abi.ABI_VERSION
    rc, text = lib.ping(handle)
    assert rc == 0 and '"variant":"cpu"' in text


@pytest.mark.parametrize("n", [1, 3, 4, 1000, 1 << 20])
def test_ops_match_numpy(lib, handle, n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    out = np.full(n, np.nan, dtype=np.float32)
    assert lib.run(handle, b"add", ptr(x), ptr(y), 0.0, 0.0, ptr(out), n) == 0
    np.testing.assert_array_equal(out, x + y)
    out[:] = np.nan
    assert lib.run(handle, b"scale_add", ptr(x), None, 2.5, -1.0, ptr(out), n) == 0
    np.testing.assert_array_equal(out, np.float32(2.5) * x + np.float32(-1.0))
    s = np.zeros(1, dtype=np.float32)
    assert lib.run(handle, b"sum", ptr(x), None, 0.0, 0.0, ptr(s), n) == 0
    assert s[0] == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-6, abs=1e-4)


def test_sum_of_1e8_elements_is_float64_accurate(lib, handle):
    n = 100_000_000
    x = np.full(n, 0.1, dtype=np.float32)  # float32 naive summation drifts far off here
    s = np.zeros(1, dtype=np.float32)
    assert lib.run(handle, b"sum", ptr(x), None, 0.0, 0.0, ptr(s), n) == 0
    ref = float(x.astype(np.float64).sum())
    assert abs(float(s[0]) - ref) / ref < 1e-6


@pytest.mark.reliability(
    case="bad arguments to the C ABI",
    how="NULL handle, unknown or NULL op, n of 0, -1 or 2^62, NULL pointers",
    expect="the documented negative status and a message from last_error",
)
def test_bad_arguments_are_error_codes(lib, handle):
    x = np.ones(4, dtype=np.float32)
    assert lib.run(None, b"add", ptr(x), ptr(x), 0, 0, ptr(x), 4) == abi.E_INVALID_ARGUMENT
    assert lib.run(handle, b"mul", ptr(x), ptr(x), 0, 0, ptr(x), 4) == abi.E_UNKNOWN_OP
    assert "unknown op 'mul'" in lib.last_error(handle)
    assert lib.run(handle, None, ptr(x), ptr(x), 0, 0, ptr(x), 4) == abi.E_UNKNOWN_OP
    for n in (0, -1, 1 << 62):
        assert lib.run(handle, b"add", ptr(x), ptr(x), 0, 0, ptr(x), n) == abi.E_INVALID_ARGUMENT
    assert lib.run(handle, b"add", ptr(x), None, 0, 0, ptr(x), 4) == abi.E_INVALID_ARGUMENT
    assert lib.run(handle, b"add", None, ptr(x), 0, 0, ptr(x), 4) == abi.E_INVALID_ARGUMENT
    assert lib.alloc(handle, 0) == abi.E_INVALID_ARGUMENT
    assert lib.alloc(None, 4) == abi.E_INVALID_ARGUMENT


@pytest.mark.reliability(
    case="resident buffer ids freed, stale, foreign or made up",
    how="double free, use after free, another instance's id, 0, -5, random ids",
    expect="CUPLUG_E_BAD_BUFFER (or BUFFER_TOO_SMALL), no crash",
)
def test_buffer_ids_are_checked(lib, handle):
    other = lib.create(None)
    try:
        a = lib.alloc(handle, 8)
        b = lib.alloc(other, 8)
        assert a > 0 and b > 0 and a != b
        host = np.arange(8, dtype=np.float32)
        assert lib.upload(handle, a, ptr(host), 8) == 0
        assert lib.upload(handle, b, ptr(host), 8) == abi.E_BAD_BUFFER  # foreign id
        assert lib.upload(handle, a, ptr(host), 9) == abi.E_BUFFER_TOO_SMALL
        assert lib.upload(handle, a, None, 8) == abi.E_INVALID_ARGUMENT
        assert lib.run_resident(handle, b"add", a, a, a, 0, 0, 8) == 0
        back = np.zeros(8, dtype=np.float32)
        assert lib.download(handle, a, ptr(back), 8) == 0
        np.testing.assert_array_equal(back, 2 * host)
        assert lib.free(handle, a) == 0
        assert lib.free(handle, a) == abi.E_BAD_BUFFER  # double free
        assert lib.download(handle, a, ptr(back), 8) == abi.E_BAD_BUFFER  # stale
        for bogus in (0, -5, 12345, (1 << 40) + 1):
            assert lib.download(handle, bogus, ptr(back), 8) == abi.E_BAD_BUFFER
    finally:
        lib.destroy(other)


def test_create_rejects_a_device_it_does_not_have(lib):
    assert not lib.lib.cuplug_backend_create(b"3")
    with pytest.raises(Exception, match="one device"):
        lib.create("3")


def test_null_destroy_is_a_noop(lib):
    lib.destroy(None)
    assert os.getpid() > 0  # still alive
