"""Real-GPU tests (marker gpu; skipped without a GPU). Run from the installed wheels."""

from __future__ import annotations

import json
import resource
import threading
import time

import numpy as np
import pytest

import cuplug
import cuplug.runtime.loading
from conftest import clean_env, run_cli, run_py

pytestmark = pytest.mark.gpu
# Host arrays above 16 MiB are split over several staging threads: (1 << 24) + 3 has
# four ranges, the last ending in a partial chunk and a scalar tail.
SIZES = [1, 3, 4, 5, 1023, 4097, (1 << 20) + 5, (1 << 24) + 3, 1 << 26]


def check_ops(b, n, seed=0):
    rng = np.random.default_rng(seed + n)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    np.testing.assert_array_equal(b.run("add", x, y), x + y)
    # Never fused into an FMA: the same bits as NumPy's (and the CPU backend's) two roundings.
    np.testing.assert_array_equal(b.run("scale_add", x, alpha=1.5, beta=-2.0), np.float32(1.5) * x - np.float32(2))
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


@pytest.mark.reliability(
    case="no kernel image for the device",
    how="CUPLUG_BACKEND forces an sm_75 or sm_80 CUBIN on the sm_90 H200 (either major)",
    expect="kernel-image-missing at the smoke launch, then the fatbin is loaded and every op is right",
)
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


@pytest.mark.reliability(
    case="allocation beyond the GPU's memory",
    how="Backend.empty(2^40 floats) on the H200",
    expect="OutOfMemoryError naming out of memory; the same instance then runs every op right",
)
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


def _cpu_reference():
    return cuplug.runtime.loading.load(env={"CUPLUG_BACKEND": "cpu"})


@pytest.mark.reliability(
    case="8 threads x 4 instances x 1,000 mixed ops",
    how="each thread runs 1,000 random ops "
    "(add, scale_add, sum; host arrays and resident buffers; 1 to 300,000 elements) on each of "
    "4 CUDA instances",
    expect="add and scale_add bit-exact against the CPU backend, sum within 1e-6 relative; no error, no cross-talk",
)
def test_threads_by_instances_against_the_cpu_backend(record_property):
    instances = [cuplug.load() for _ in range(4)]
    assert all(b.variant == "fatbin" for b in instances)
    cpu = _cpu_reference()
    failures: list[str] = []
    done = [0]

    def work(seed):
        rng = np.random.default_rng(seed)
        for i in range(1000):
            for b in instances:
                n = int(rng.integers(1, 300_000))
                x = rng.standard_normal(n, dtype=np.float32)
                op = ("add", "scale_add", "sum")[i % 3]
                resident = i % 4 == 0
                args = (x, x[::-1].copy()) if op == "add" else (x,)
                kw = (
                    {"alpha": float(rng.standard_normal()), "beta": float(rng.standard_normal())}
                    if op == "scale_add"
                    else {}
                )
                if resident:
                    bufs = [b.buffer(a) for a in args]
                    got = b.run(op, *bufs, **kw)
                    got = got if op == "sum" else got.to_host()
                    [buf.free() for buf in bufs]
                else:
                    got = b.run(op, *args, **kw)
                want = cpu.run(op, *args, **kw)
                if op == "sum":
                    if abs(got - want) > 1e-6 * max(1.0, float(np.abs(x).sum())):
                        failures.append(f"{seed}/{i}: sum {got} vs {want}")
                elif not np.array_equal(got, want):
                    failures.append(f"{seed}/{i}: {op} n={n} differs")
                done[0] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    record_property("ops", done[0])
    record_property("seconds", round(time.perf_counter() - t0, 1))
    for b in instances:
        b.close()
    cpu.close()
    assert done[0] == 8 * 4 * 1000 and failures == [], failures[:5]


@pytest.mark.reliability(
    case="10,000 create/destroy cycles",
    how="cuplug_backend_create + destroy 10,000 times on "
    "the H200, every 500th cycle with a 32 MiB host add (so staging is made and freed too)",
    expect="free device memory back to its baseline (within 2 MiB); host RSS growth reported",
)
def test_create_destroy_cycles_leave_no_device_memory(record_property):
    watcher = cuplug.load()
    lib, h = watcher._core.lib, watcher._core.handle

    def free_bytes():
        rc, text = lib.ping(h)
        assert rc == 0, text
        return json.loads(text)["device"]["memory_free"]

    x = np.ones(1 << 23, dtype=np.float32)
    one = lib.create("0")  # the first instance's runtime state is not a leak: take the baseline after it
    lib.destroy(one)
    before, rss_before = free_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    for i in range(10_000):
        handle = lib.create("0")
        if i % 500 == 0:
            probe = cuplug.Backend(lib, handle, watcher._info, cuda=watcher.cuda)
            assert probe.run("add", x, x)[7] == 2.0
            probe.close()
        else:
            lib.destroy(handle)
    seconds = time.perf_counter() - t0
    after = free_bytes()
    rss_growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024
    watcher.close()
    for key, value in (
        ("free_before_bytes", before),
        ("free_after_bytes", after),
        ("delta_bytes", before - after),
        ("seconds", round(seconds, 1)),
        ("max_rss_growth_bytes", rss_growth),
    ):
        record_property(key, value)
    assert before - after <= 2 << 20, f"{(before - after) / 2**20:.1f} MiB of device memory not returned"


FORK_ON_GPU = """
import json, os, cuplug
b = cuplug.load()
assert b.variant == "fatbin", b.trace.text()
pid = os.fork()
if pid == 0:
    try:
        b.run("sum", memoryview(bytearray(16)).cast("f"))
        msg = ["ran"]
    except cuplug.CuplugError as e:
        msg = ["error", type(e).__name__, str(e)]
    fresh = cuplug.load()
    msg += [fresh.variant, fresh.trace.decision_code, fresh.run("sum", memoryview(bytearray(b"\\0\\0\\x80?" * 2)).cast("f"))]
    os.write(1, (json.dumps(msg) + "\\n").encode())
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), b.run("sum", memoryview(bytearray(b"\\0\\0\\x80?" * 3)).cast("f"))]))
"""


@pytest.mark.reliability(
    case="fork() after a CUDA load, on the GPU",
    how="cuplug.load() (cuda13/fatbin), os.fork(); the child uses the parent's backend, then calls cuplug.load()",
    expect="the child gets BackendError naming fork (no hang), its fresh load answers correctly "
    "(on the CPU, with the reason); the parent keeps its GPU backend",
)
def test_fork_after_cuda_load():
    proc = run_py(FORK_ON_GPU, clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    child, parent = (json.loads(line) for line in proc.stdout.strip().splitlines())
    assert child[:2] == ["error", "BackendError"] and "fork" in child[2], child
    assert child[-1] == 2.0, child
    assert parent == [0, 3.0]


@pytest.mark.reliability(
    case="JIT cache disabled, on the GPU",
    how="CUDA_CACHE_DISABLE=1 with the ptx variant forced",
    expect="results still right (the driver JIT-compiles in every process); `cuplug warmup` "
    "exits 1 and says nothing can be cached",
)
def test_ptx_without_a_jit_cache_is_correct_and_warmup_says_so(monkeypatch):
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "1")
    code = (
        "import numpy as np, cuplug, json; b = cuplug.load(); x = np.arange(4097, dtype=np.float32); "
        "print(json.dumps([b.cuda + ':' + b.variant, bool((b.run('add', x, x) == x + x).all())]))"
    )
    proc = run_py(code, clean_env(CUDA_CACHE_DISABLE="1", CUPLUG_BACKEND="cuda13:ptx"))
    assert proc.returncode == 0 and json.loads(proc.stdout) == ["cuda13:ptx", True], proc.stderr
    warm = run_cli(["warmup"], clean_env(CUDA_CACHE_DISABLE="1"))
    assert warm.returncode == 1 and "CUDA_CACHE_DISABLE" in warm.stdout + warm.stderr, warm.stdout + warm.stderr


def _gpu_count() -> int:
    try:
        return len(cuplug.probe(isolated=True)["devices"])  # collection must not initialize CUDA here
    except Exception:  # no driver: the gpu marker skips these anyway
        return 0


@pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs (issue 11: nvidia-h200-x2)")
@pytest.mark.reliability(
    case="two GPUs, one instance each",
    how="cuplug.load(device=0) and (device=1) used from "
    "4 threads each; 8 GiB allocated on device 0 only; device 0's instance closed first",
    expect="each result right; only device 0's free memory drops; device 1 keeps working",
)
def test_two_gpus_each_instance_stays_on_its_own_device():
    b0, b1 = cuplug.load(device=0), cuplug.load(device=1)
    assert (b0.info()["device"]["index"], b1.info()["device"]["index"]) == (0, 1)
    free1 = b1.info()["device"]["memory_free"]
    big = b0.empty(1 << 31)  # 8 GiB on device 0
    assert abs(b1.info()["device"]["memory_free"] - free1) < (256 << 20)
    errors: list[str] = []

    def work(b, seed):
        for _ in range(50):
            try:
                check_ops(b, 100_003, seed)
            except AssertionError as exc:
                errors.append(str(exc))

    threads = [threading.Thread(target=work, args=((b0, b1)[k % 2], k)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    big.free()
    b0.close()
    check_ops(b1, 4097)
    b1.close()
    assert errors == []


@pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs (issue 11: nvidia-h200-x2)")
@pytest.mark.parametrize("how", ["index", "uuid"])
def test_cuda_visible_devices_selects_the_second_gpu(how):
    second = cuplug.probe()["devices"][1]
    visible = "1" if how == "index" else second["uuid"]
    code = "import json, cuplug; b = cuplug.load(); print(json.dumps(b.info()['device']))"
    proc = run_py(code, clean_env(CUDA_VISIBLE_DEVICES=visible))
    assert proc.returncode == 0, proc.stderr
    dev = json.loads(proc.stdout)
    assert dev["index"] == 0 and dev["memory_total"] == second["memory_bytes"]
    doc = json.loads(run_cli(["doctor", "--json"], clean_env()).stdout)
    assert len(doc["devices"]) >= 2
