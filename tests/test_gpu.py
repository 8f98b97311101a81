"""Real-GPU tests (marker gpu; skipped without a GPU). Run from the installed wheels."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import cuplug
from conftest import clean_env, run_cli

pytestmark = pytest.mark.gpu
# Host arrays above 16 MiB are split over several staging threads: (1 << 24) + 3 has
# four ranges, the last ending in a partial chunk and a scalar tail.
SIZES = [1, 3, 4, 5, 1023, 4097, (1 << 20) + 5, (1 << 24) + 3, 1 << 26]


def check_ops(b, n, seed=0):
    rng = np.random.default_rng(seed + n)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    np.testing.assert_array_equal(b.run("add", x, y), x + y)
    np.testing.assert_allclose(b.run("scale_add", x, alpha=1.5, beta=-2.0), np.float32(1.5) * x - np.float32(2),
                               rtol=1e-6, atol=1e-6)
    ref = float(x.astype(np.float64).sum())
    assert abs(b.run("sum", x) - ref) <= 1e-5 * max(1.0, float(np.abs(x).astype(np.float64).sum()))


def load_forced(monkeypatch, value):
    monkeypatch.setenv("CUPLUG_BACKEND", value)
    return cuplug.load()


def test_auto_selection_picks_exact_sass():
    with cuplug.load() as b:
        assert (b.cuda, b.variant) == ("cuda13", "fatbin"), b.trace.text()
        assert b.info()["device"]["capability"] == "9.0"


@pytest.mark.parametrize("forced", ["cuda12:fatbin", "cuda13:fatbin", "cuda12:ptx", "cuda13:ptx"])
def test_variants_correct_at_all_sizes(monkeypatch, forced):
    with load_forced(monkeypatch, forced) as b:
        assert f"{b.cuda}:{b.variant}" == forced, b.trace.text()
        for n in SIZES:
            check_ops(b, n)


def test_largest_size(monkeypatch):
    with load_forced(monkeypatch, "cuda13:fatbin") as b:
        check_ops(b, 1 << 28)


@pytest.mark.parametrize("forced", ["cuda12:sm75", "cuda12:sm80", "cuda13:sm75", "cuda13:sm80"])
def test_wrong_sass_falls_through_cleanly(monkeypatch, forced):
    with load_forced(monkeypatch, forced) as b:
        first = b.trace.attempts[0]
        assert f"{first.cuda}:{first.variant}" == forced and first.code == "kernel-image-missing", first
        assert b.variant == "fatbin"
        check_ops(b, 100_003)


def test_resident_buffers_and_isolation():
    b1, b2 = cuplug.load(), cuplug.load()
    errors = []

    def work(k):
        b = (b1, b2)[k % 2]
        rng = np.random.default_rng(k)
        for _ in range(20):
            x = rng.standard_normal(1 << 18, dtype=np.float32)
            bx = b.buffer(x)
            by = b.run("scale_add", bx, alpha=2.0, beta=float(k))
            bz = b.run("add", bx, by)
            if not np.array_equal(bz.to_host(), x + (np.float32(2) * x + np.float32(k))):
                errors.append(k)
            for buf in (bx, by, bz):
                buf.free()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    b1.close()
    b2.close()
    assert errors == []


@pytest.mark.parametrize("threads", ["1", "3", "8"])
def test_host_path_with_any_number_of_staging_threads(monkeypatch, threads):
    monkeypatch.setenv("CUPLUG_STAGING_THREADS", threads)
    with cuplug.load() as b:
        for n in ((1 << 24) + 3, (5 << 22) + 1):
            check_ops(b, n, seed=int(threads))
        x = np.random.default_rng(1).standard_normal((1 << 25) + 7, dtype=np.float32)
        bx = b.buffer(x)  # upload and download of resident buffers go through the same stagers
        np.testing.assert_array_equal(bx.to_host(), x)
        out = np.full_like(x, np.nan)
        assert b.run("add", x, x, out=out) is out
        np.testing.assert_array_equal(out, x + x)


def test_warmup_fills_the_jit_cache_and_inspect_agrees(tmp_path):
    env = clean_env(CUDA_CACHE_PATH=str(tmp_path / "jit"))
    proc = run_cli(["warmup", "--json"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert sorted(r["label"] for r in report["results"]) == ["cuda12/ptx", "cuda13/ptx"], report
    assert all(r["error"] is None and r["device"] for r in report["results"]), report
    assert report["cache_bytes_added"] > 0 and report["cache_problem"] is None
    again = json.loads(run_cli(["warmup", "--json"], env).stdout)
    assert again["cache_bytes_added"] == 0, again  # the second process finds the PTX compiled
    inspected = run_cli(["inspect", "--json"], clean_env())
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr


def test_out_of_memory_is_an_error_and_instance_survives():
    with cuplug.load() as b:
        with pytest.raises(cuplug.OutOfMemoryError, match="out of memory"):
            b.empty(1 << 40)
        check_ops(b, 1000)


def test_probe_cross_checked_with_cuda_bindings():
    cuda_driver = pytest.importorskip("cuda.bindings.driver")
    ours = cuplug.probe()

    def ok(result):
        err, *values = result if isinstance(result, tuple) else (result,)
        assert int(err) == 0, err
        return values[0] if values else None

    ok(cuda_driver.cuInit(0))
    version = ok(cuda_driver.cuDriverGetVersion())
    assert version == ours["driver_version"]
    dev = ok(cuda_driver.cuDeviceGet(0))
    attr = cuda_driver.CUdevice_attribute
    major = ok(cuda_driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ok(cuda_driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    mem = ok(cuda_driver.cuDeviceTotalMem(dev))
    uuid = ok(cuda_driver.cuDeviceGetUuid(dev))
    d0 = ours["devices"][0]
    assert d0["capability"] == f"{major}.{minor}" and d0["memory_bytes"] == mem
    assert d0["uuid"].replace("-", "")[3:] == bytes(uuid.bytes).hex()


def test_cli_on_the_gpu():
    proc = run_cli(["probe", "--json"], clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["variant"] == "fatbin"
    doc = json.loads(run_cli(["doctor", "--json"], clean_env()).stdout)
    assert doc["loaded"]["ok"] and doc["decision"]["variant"] == "fatbin"
