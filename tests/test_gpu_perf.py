"""Real-GPU tests of issue 22's changes (marker gpu; skipped without a GPU): the host path's staging
knobs, the start-up report in the ping JSON, NVML's temperature, and `sum` staying exact and
deterministic when calls move between streams."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cuplug

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "staging",
    [
        "threads=16,chunk_kb=64",
        "threads=3,chunk_kb=1088,copy=stream,schedule=dynamic",
        "threads=5,chunk_kb=4096,copy=memcpy,schedule=static",
        "threads=2,chunk_kb=8192,copy=stream,schedule=static",
        "chunk_kb=100",  # rounded down to 64 KiB
        "threads=banana,copy=sideways,chunk_kb=-3,nonsense",  # ignored: the defaults
    ],
)
def test_host_path_with_any_staging(monkeypatch, staging):
    monkeypatch.setenv("CUPLUG_STAGING", staging)
    rng = np.random.default_rng(len(staging))
    with cuplug.load() as b:
        got = b.info()["staging"]
        assert got["chunk_kb"] % 64 == 0 and 1 <= got["threads"] <= 16, got
        for n in (1, 17, (1 << 24) + 3, (5 << 22) + 1):
            # Offsets of 4 and 8 bytes: neither source nor destination 16-byte aligned (the streaming copy's edges).
            x = rng.standard_normal(n + 1, dtype=np.float32)[1:]
            y = rng.standard_normal(n + 2, dtype=np.float32)[2:]
            base_o = np.full(n + 4, np.nan, dtype=np.float32)
            out = base_o[3 : 3 + n]
            assert b.run("add", x, y, out=out) is out
            np.testing.assert_array_equal(out, x + y)
            assert np.isnan(base_o[:3]).all() and np.isnan(base_o[3 + n :]).all()  # nothing written outside
        h = rng.standard_normal((1 << 20) + 5).astype(np.float16)
        np.testing.assert_array_equal(b.run("add", h, h), h + h)
        big = rng.standard_normal((1 << 23) + 7, dtype=np.float32)
        bx = b.buffer(big)  # uploads and downloads use the same stagers
        np.testing.assert_array_equal(bx.to_host(), big)


def test_staging_env_is_reported(monkeypatch):
    monkeypatch.setenv("CUPLUG_STAGING", "threads=3,chunk_kb=1024,copy=memcpy,schedule=static")
    with cuplug.load() as b:
        assert b.info()["staging"] == {"threads": 3, "chunk_kb": 1024, "copy": "memcpy", "schedule": "static"}
    monkeypatch.setenv("CUPLUG_STAGING_THREADS", "5")
    monkeypatch.delenv("CUPLUG_STAGING")
    with cuplug.load() as b:
        assert b.info()["staging"]["threads"] == 5


def test_startup_report_and_temperature():
    threads = threading.active_count()
    with cuplug.load() as b:
        assert threading.active_count() == threads  # the loader's driver thread has ended
        first = b._info  # load()'s own ping: NVML left alone, out of the cold start
        # no NVML query on it: the step's clock reads 0 or 1 us (NVML's initialisation alone takes ~15 ms)
        assert first["device"]["temperature_c"] is None and first["startup_us"]["nvml"] < 1000, first
        info = b.info()
        steps = info["startup_us"]
        assert set(steps) >= {"runtime_init", "context", "create_rest", "smoke_launch", "device_facts", "nvml"}
        assert all(isinstance(v, int) and v >= 0 for v in steps.values()), steps
        assert isinstance(info["device"]["temperature_c"], int), info["device"]  # NVML ships with the driver
        assert info["device"]["name"] and info["device"]["capability"] == "9.0"
        again = b.info()  # later pings report the first ping's steps, unchanged
        assert again["startup_us"]["smoke_launch"] == steps["smoke_launch"]


def test_sum_same_bits_across_streams():
    torch = pytest.importorskip("torch")
    x = torch.randn((1 << 26) + 5, device="cuda")
    s = torch.empty((), device="cuda")
    seen = set()
    with cuplug.load() as b:
        for k in range(12):
            if k % 3 == 0:
                stream = torch.cuda.Stream()  # a new stream each time: may reuse a destroyed one's handle
                with torch.cuda.stream(stream):
                    r = b.run("sum", x, out=s, stream=stream)
                stream.synchronize()
                del stream
            elif k % 3 == 1:
                r = b.run("sum", x)  # the instance stream, a new result tensor
                r = torch.from_dlpack(r)
            else:
                r = b.run("sum", x, out=s, stream=torch.cuda.current_stream())
            torch.cuda.synchronize()
            seen.add(float(r))
        # Two streams taking turns without synchronizing in between: the scratch is ordered between them.
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        outs = [torch.empty((), device="cuda") for _ in range(8)]
        for i, o in enumerate(outs):
            b.run("sum", x, out=o, stream=s1 if i % 2 else s2)
        torch.cuda.synchronize()
        seen |= {float(o) for o in outs}
    assert len(seen) == 1, seen
    ref = float(x.double().sum())
    assert abs(seen.pop() - ref) <= 1e-5 * float(x.double().abs().sum())
