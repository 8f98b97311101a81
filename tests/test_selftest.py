"""The numerical self-test of a CUDA candidate (issue 33, part 2), on the fake driver with planted artifacts.

A library built from the CPU twin's own source, but with `add` wrong in one element, is planted in place of
cuda13/fatbin (its manifest agreeing), so the loader meets it where it would meet a wrong kernel in the field: it
loads, its self-test disagrees with the CPU twin, it is rejected with `self-test-mismatch` naming the op, the
element and both values, and the next candidate is tried, down to the CPU. The same library built right passes,
and its pass is remembered per device UUID, driver version and artifact sha256 (a change of any tests again);
CUPLUG_SELFTEST=0|1|always.
"""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, build_shared_library, env_for, needs_wheels, planted_site, run_cli, run_json

pytestmark = needs_wheels

WRONG = "case CUPLUG_F32: CUPLUG_LOOP2(float, x[i] + y[i] + (i == 5 ? 0.5f : 0.0f)); break;"
RIGHT = "case CUPLUG_F32: CUPLUG_LOOP2(float, x[i] + y[i]); break;"
LOAD = (
    "import json, cuplug; b = cuplug.load(); t = b.trace; "
    "print(json.dumps({'variant': b.variant, 'cuda': b.cuda, "
    "'attempts': [[a.label, a.code, a.reason] for a in t.attempts], "
    "'selftests': [r.as_json() for r in t.selftests]}))"
)


def _plant(site, tmp_path, source: str, name: str):
    """The installed backends with the twin's source (as `source` makes it) planted as cuda13/fatbin."""
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    so = build_shared_library(
        src,
        tmp_path / f"{name}.so",
        "-O1",
        "-std=c11",
        "-ffp-contract=off",
        "-fvisibility=hidden",
        "-Wno-missing-field-initializers",
        f"-I{ROOT / 'backends' / 'include'}",
        f"-I{ROOT / 'backends' / 'common'}",
        f"-Wl,--version-script={ROOT / 'backends' / 'cmake' / 'cuplug_exports.map'}",
        "-lm",
    )
    return planted_site(site, tmp_path / f"site-{name}", "cuplug_cuda13/fatbin/libcuplug_vector.so", so.read_bytes())


@pytest.fixture(scope="module")
def twin_source():
    source = (ROOT / "backends" / "cpu" / "vector_cpu.c").read_text()
    assert source.count(RIGHT) == 1
    return source


@pytest.fixture(scope="module")
def wrong_site(site, tmp_path_factory, twin_source):
    return _plant(site, tmp_path_factory.mktemp("wrong"), twin_source.replace(RIGHT, WRONG), "wrong")


@pytest.fixture(scope="module")
def right_site(site, tmp_path_factory, twin_source):
    return _plant(site, tmp_path_factory.mktemp("right"), twin_source, "right")


@pytest.mark.reliability(
    case="an artifact that loads but computes wrong",
    how="the CPU twin's source with add wrong in element 5, planted in place of cuda13/fatbin on a fake sm_90",
    expect="rejected by its self-test (self-test-mismatch, naming op, element and values), the next tried, the CPU "
    "answering; doctor shows the self-test",
)
def test_a_wrong_artifact_is_rejected_by_its_self_test(wrong_site, fake_driver_dir, tmp_path):
    env = env_for(wrong_site, fake_driver_dir, CUPLUG_CACHE_DIR=str(tmp_path / "cache"))
    got = run_json(LOAD, env)
    first = got["attempts"][0]
    assert first[0] == "cuda13/fatbin" and first[1] == "self-test-mismatch"
    assert first[2] == "add: output 0: element 5 is 0.0, the CPU twin gives -0.5", first
    assert got["selftests"][0]["outcome"] == "mismatch" and got["variant"] == "cpu"
    assert [a[1] for a in got["attempts"]][-1] == "ok"  # the CPU twin serves
    doctor = run_cli(["doctor", "--json"], env)
    doc = json.loads(doctor.stdout)
    assert doc["selftests"][0]["outcome"] == "mismatch" and doc["loaded"]["attempts"][0]["code"] == "self-test-mismatch"
    text = run_cli(["doctor"], env).stdout
    assert "self-test           : cuda13/fatbin: mismatch" in text, text
    assert not (tmp_path / "cache" / "selftest").exists() or not any((tmp_path / "cache" / "selftest").iterdir())


def test_a_right_artifact_passes_and_its_pass_is_remembered(right_site, fake_driver_dir, tmp_path):
    cache = tmp_path / "cache"
    env = env_for(right_site, fake_driver_dir, CUPLUG_CACHE_DIR=str(cache))
    first = run_json(LOAD, env)
    assert first["attempts"][0][:2] == ["cuda13/fatbin", "ok"] and first["cuda"] == "cuda13"
    assert first["selftests"][0]["outcome"] == "passed" and first["selftests"][0]["ms"] > 0
    ops = first["selftests"][0]["ops_ms"]  # where the time went: each op's [twin ms, candidate ms]
    assert sorted(ops) == ["add", "scale_add", "sum"] and all(len(t) == 2 and min(t) > 0 for t in ops.values())
    twin_ms = first["selftests"][0]["twin_ms"]  # loading the twin is part of the test's time, and named
    assert twin_ms > 0 and first["selftests"][0]["ms"] >= twin_ms + sum(map(sum, ops.values())) - 0.01
    assert len(list((cache / "selftest").iterdir())) == 1
    again = run_json(LOAD, env)
    assert again["selftests"][0]["outcome"] == "passed (remembered)"
    always = run_json(LOAD, {**env, "CUPLUG_SELFTEST": "always"})
    assert always["selftests"][0]["outcome"] == "passed"
    off = run_json(LOAD, {**env, "CUPLUG_SELFTEST": "0"})
    assert off["selftests"][0]["outcome"] == "skipped"
    newer_driver = run_json(LOAD, {**env, "FAKE_CUDA_DRIVER_VERSION": "13010"})
    assert newer_driver["selftests"][0]["outcome"] == "passed"  # another driver: tested again
    assert len(list((cache / "selftest").iterdir())) == 2


def test_a_bad_selftest_value_is_named(right_site, fake_driver_dir):
    env = env_for(right_site, fake_driver_dir, CUPLUG_SELFTEST="sometimes")
    proc = run_cli(["doctor"], env)
    assert proc.returncode != 0 and "CUPLUG_SELFTEST='sometimes': expected 0, 1 or always" in proc.stdout + proc.stderr


def test_the_key_changes_with_each_fact():
    from cuplug.runtime import selftest

    base = selftest.key("GPU-1", 13000, "a" * 64)
    assert (
        base
        and len(
            {
                base,
                selftest.key("GPU-2", 13000, "a" * 64),
                selftest.key("GPU-1", 13010, "a" * 64),
                selftest.key("GPU-1", 13000, "b" * 64),
            }
        )
        == 4
    )
    assert selftest.key(None, 13000, "a" * 64) is None and selftest.key("GPU-1", None, "a") is None


def test_a_sample_the_twin_cannot_run_is_left_out_not_held_against_the_candidate():
    """The twin runs each sample first: where the twin (or the sampler) fails, that op is named as not compared
    and the candidate passes on the rest, unremembered; where the twin runs and the candidate fails, the
    candidate fails (the H200 saw a sampler fault reject every correct CUDA candidate)."""
    import cuplug
    from cuplug.runtime import selftest

    class Failing:
        def __init__(self, inner, op):
            self.inner, self.op, self.ops = inner, op, inner.ops

        def run(self, name, *args, **kw):
            if name == self.op:
                raise ValueError(f"{name} cannot run here")
            return self.inner.run(name, *args, **kw)

    with cuplug.load(env={"CUPLUG_BACKEND": "cpu"}) as cpu:
        assert selftest.compare(cpu, cpu) == (None, [])
        why, left_out = selftest.compare(cpu, Failing(cpu, "sum"))
        assert why is None and left_out == ["sum (the CPU twin's sample failed: ValueError: sum cannot run here)"]
        why, left_out = selftest.compare(Failing(cpu, "sum"), cpu)
        assert why == "sum: the sample failed here but not on the CPU twin: ValueError: sum cannot run here"
        result = selftest.run(cpu, lambda: (Failing(cpu, "sum"), 0.0), "cuda13/fatbin", None, "1")
        assert result.outcome == "passed" and result.why.startswith("not compared: sum (")


def test_the_twins_load_is_named_by_the_test_that_loaded_it_only():
    """load() loads the CPU twin once, for the first CUDA candidate it tests; a later candidate's test (the first
    failed) names no twin time."""
    import cuplug
    from cuplug.runtime import selftest

    with cuplug.load(env={"CUPLUG_BACKEND": "cpu"}) as cpu:
        first = selftest.run(cpu, lambda: (cpu, 1.5), "cuda13/sm90a", None, "always")
        later = selftest.run(cpu, lambda: (cpu, 0.0), "cuda13/sm90", None, "always")
    assert first.as_json()["twin_ms"] == 1.5 and "twin_ms" not in later.as_json()
    assert first.outcome == later.outcome == "passed" and later.ms > 0


@pytest.mark.parametrize(
    ("dtype", "want", "got", "why"),
    [
        ("float32", [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], None),
        ("float32", [1.0, 2.0, 3.0], [1.0, 2.0005, 3.0], None),  # other bits, within 1e-3 of the largest
        ("float32", [1.0, 2.0, 3.0], [1.0, 2.0, 3.01], "output 0: element 2 is 3.0099"),
        ("bfloat16", [0.25, -1.5], [0.25, -1.0], "output 0: element 1 is -1.0, the CPU twin gives -1.5"),
        ("int32", [5, 6, 7], [5, 6, 8], "output 0: element 2 is 8, the CPU twin gives 7"),
        ("uint8", [5, 6, 7], [4, 6, 7], "output 0: element 0 is 4, the CPU twin gives 5"),
    ],
)
def test_samples_compare_decides_by_bits_then_by_value(dtype, want, got, why):
    """Equal bits agree at once; otherwise integers name the first element whose bits differ and floats the first
    outside the tolerance, with both values."""
    from cuplug.contract import dtypes
    from cuplug.runtime import samples
    from cuplug.runtime.hostbuf import HostBuffer

    def buf(values):
        b = HostBuffer(dtypes.from_name(dtype), (len(values),))
        b.fill(values)
        return b

    result = samples.compare([buf(got)], [buf(want)])
    assert result == why if why is None else result.startswith(why)


def test_samples_compare_names_outputs_of_another_shape_or_dtype():
    """Bytes that differ because the outputs are not alike are named as such, never a StopIteration."""
    from cuplug.contract import dtypes
    from cuplug.runtime import samples
    from cuplug.runtime.hostbuf import HostBuffer

    def buf(dtype, values):
        b = HostBuffer(dtypes.from_name(dtype), (len(values),))
        b.fill(values)
        return b

    assert samples.compare([buf("int32", [1, 2, 3])], [buf("int32", [1, 2])]) == (
        "output 0: int32[3], the CPU twin gives int32[2]"
    )
    assert samples.compare([buf("float32", [1.0])], [buf("int32", [1])]) == (
        "output 0: float32[1], the CPU twin gives int32[1]"
    )
    nan = buf("float32", [float("nan")])  # equal bits agree, a NaN too
    assert samples.compare([nan], [buf("float32", [float("nan")])]) is None


def test_samples_compare_names_a_bool_whose_byte_differs():
    """A bool of byte 2 reads as True like the twin's 1, yet its bits differ: the element is named, never a
    StopIteration out of the search for it."""
    from cuplug.contract import dtypes
    from cuplug.runtime import samples
    from cuplug.runtime.hostbuf import HostBuffer

    got, want = (HostBuffer(dtypes.from_name("bool"), (3,)) for _ in range(2))
    want.raw[:3], got.raw[:3] = b"\x00\x01\x01", b"\x00\x01\x02"
    assert samples.compare([got], [want]) == (
        "output 0: element 2 is True, the CPU twin gives True (bytes 02 against 01)"
    )
