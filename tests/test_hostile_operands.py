"""Hostile operands (issue 31): the DLPack / CUDA-array-interface / buffer boundary never crashes, never lies.

Each class of the issue has its tests here, each a ``reliability`` row of docs/reliability.md. The
producers are built field by field (tests/hostile_producers.py); the CUDA paths are reached by a
Backend over the CPU twin's library that claims a CUDA device (as tests/test_api_v2.py does), so
every check of the Python side is met without a GPU, and the twin itself refuses any CUDA pointer
that gets through (CUPLUG_E_WRONG_DEVICE): a lie that reaches C is seen in the spy's log.
The fuzz run (≥ 10,000 cases) and the leak check run in subprocesses: a crash there is a failure
with its output, not the end of the suite.
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np
import pytest

import cuplug
from conftest import HERE, ROOT, build_shared_library, env_for, needs_wheels, planted_site, run_py
from cuplug.contract import dtypes
from cuplug.contract.errors import BackendError, InvalidInputError, OutOfMemoryError
from cuplug.runtime import hostbuf, library
from hostile_producers import ExportsOneArrayNamesAnother, LyingCAI, LyingDLPack, cai
from test_api_v2 import STREAM, _over, b, cpu_only, spy  # noqa: F401  (its fixtures: the twin, its spy)

rel = pytest.mark.reliability
F32, I32 = (2, 32, 1), (0, 32, 1)


@pytest.fixture
def gpu(b, spy):
    """A Backend that claims cuda:0 over the CPU twin's library, every entry point seen by ``spy``."""
    with _over(b, spy, "12.4", device={"type": "cuda", "index": 0, "memory_total": 1 << 30}, stream=STREAM) as be:
        yield be


def _floats(n: int = 4) -> bytearray:
    return bytearray(np.arange(1, n + 1, dtype=np.float32).tobytes())


def refused(match: str):
    return pytest.raises(InvalidInputError, match=match)


def reached_c(spy) -> bool:
    return bool(spy.entries("call"))


# ---- 1. producer metadata read before it is bounded ------------------------------------------------------


METADATA_LIES = {
    "ndim-huge-short-shape": (dict(ndim=1 << 20), r"DLPack gives ndim 1048576; cuplug takes 0 to 32"),
    "ndim-33": (dict(ndim=33), r"ndim 33; cuplug takes 0 to 32"),
    "ndim-negative": (dict(ndim=-1), r"ndim -1"),
    "shape-null": (dict(shape_ptr=0), r"1 dimensions and a NULL shape pointer"),
    "offset-near-2^63": (dict(byte_offset=(1 << 63) - 16), r"outside any process's memory"),
    "offset-wraps": (dict(byte_offset=(1 << 64) - 8), r"outside any process's memory"),
    "extent-negative": (dict(shape=(-4,)), r"with a negative extent"),
    "extents-overflow-int64": (dict(shape=(1 << 32, 1 << 32, 16)), r"more than any address space holds"),
    "2^40-elements-of-16-bytes": (dict(shape=(1 << 40,)), r"not \(all\) memory of this process"),
    # 16 TiB past a heap or mapped buffer: beyond anything this process maps (1 GiB past could be another mapping)
    "offset-past-the-buffer": (dict(byte_offset=1 << 44), r"not \(all\) memory of this process"),
    "data-null-with-elements": (dict(data=0), r"NULL data pointer for 16 bytes"),
    "data-null-with-offset": (dict(data=0, byte_offset=64), r"NULL data pointer with byte_offset 64"),
    "data-unmapped-page": (dict(data=16), r"not \(all\) memory of this process"),
    "data-beyond-user-space": (dict(data=1 << 60), r"outside any process's memory"),
    "dtype-unknown": (dict(dtype=(3, 16, 1)), r"DLPack dtype \(code 3, 16 bits, 1 lanes\) is not a dtype"),
    "dtype-lanes": (dict(dtype=(2, 32, 4)), r"4 lanes\) is not a dtype"),
    "device-opencl": (dict(device=(4, 0)), r"DLPack device type 4 is neither the host nor CUDA"),
    "device-differs-from-dlpack_device": (
        dict(device=(1, 3), dlpack_device=(1, 0)),
        r"its capsule is on device \(1, 3\), __dlpack_device__\(\) said \(1, 0\)",
    ),
}


@rel(
    case="DLPack metadata that lies",
    how="capsules built field by field: ndim 2^20 over a 1-extent shape array, 33, -1; a NULL shape; byte_offset "
    "near 2^63 or wrapping; negative, overflowing or 2^40 extents over 16 bytes; NULL, unmapped or 2^60 data; "
    "unknown dtypes, lanes, devices; a capsule on another device than __dlpack_device__ says",
    expect="InvalidInputError naming the operand and the field, before any field past it is read and before "
    "any allocation; add and sum refuse alike; nothing reaches C",
)
@pytest.mark.parametrize("lie", list(METADATA_LIES))
@pytest.mark.parametrize("op", ["add", "sum"])
def test_dlpack_metadata_is_bounded_before_it_is_used(b, spy, lie, op):
    fields, match = METADATA_LIES[lie]
    fields = {"data": _floats(), **fields}
    cpu = _over(b, spy)
    operands = (LyingDLPack(**fields),) * (2 if op == "add" else 1)
    with cpu, refused(r"^" + op + r": x: .*" + match):
        cpu.run(op, *operands)
    assert not reached_c(spy) and not spy.entries("alloc")


@pytest.mark.parametrize(
    "answer",
    [None, "ab", "12", (1,), (1, 0, 0), (1.5, 0), ("1", "0"), (-1, 0), (1, 1 << 40), ZeroDivisionError("x"), 7],
    ids=lambda a: type(a).__name__ + ":" + repr(a)[:12],
)
def test_a_dlpack_device_that_is_no_device_is_refused(b, answer):
    """``__dlpack_device__`` returning None, a string, a pair of the wrong length or type, or raising."""
    with refused(r"^sum: x: __dlpack_device__\(\) (gave|failed)"):
        b.run("sum", LyingDLPack(_floats(), dlpack_device=(lambda: None) if answer is None else answer))


@pytest.mark.parametrize("max_version", [5, (1,), (1, 0, 0), ("1", "0"), (True, 0), "10"])
def test_a_max_version_that_is_no_pair_is_a_clear_error(b, max_version):
    t = b.buffer(np.ones(3, np.float32))
    with refused(r"^__dlpack__: max_version must be None or a \(major, minor\) pair"):
        t.__dlpack__(max_version=max_version)
    with refused(r"max_version must be None"):
        hostbuf.HostBuffer(dtypes.BY_NAME["float32"], (2,)).__dlpack__(max_version=5)
    assert t.__dlpack__(max_version=(1, 0)) is not None  # the honest forms still work
    assert np.from_dlpack(t).tolist() == [1.0, 1.0, 1.0]


# ---- 2. the memory the export gave, and only it ------------------------------------------------------------


@rel(
    case="a read-only buffer whose __array_interface__ names other memory",
    how="bytes [1, 2, 3, 4] (read-only) whose __array_interface__ points at a NumPy array of 200s, or at address 16",
    expect="sum reads the exported bytes: 10, never 800 and never a segfault",
)
@pytest.mark.parametrize("named", ["another-array", "unmapped"])
def test_the_pointer_is_the_exports_own(b, named):
    other = np.full(4, 200, np.uint8)
    address = other.ctypes.data if named == "another-array" else 16
    assert b.run("sum", ExportsOneArrayNamesAnother(bytes([1, 2, 3, 4]), address)) == 10
    assert b.run("add", ExportsOneArrayNamesAnother(bytes([1, 2]), address), np.array([5, 6], np.uint8)).tolist() == [
        6,
        8,
    ]


def test_read_only_buffers_are_read_in_place_and_released(b):
    """A read-only export is read without a copy (its own pointer) and let go after the call: the exporter can be
    resized again (a bytearray refuses while a view is held)."""
    ro = memoryview(bytearray(_floats())).toreadonly().cast("f")
    assert b.run("sum", ro) == 10.0
    buf = bytearray(_floats())
    assert b.run("sum", memoryview(buf).toreadonly().cast("f")) == 10.0
    buf.extend(b"\0" * 4)  # BufferError if cuplug still held an export


# ---- 3. versions and values ------------------------------------------------------------------------------------


@rel(
    case="DLPack capsules of another version, name or kind",
    how="versioned capsules of major 99 and 0; a capsule named 'used_dltensor' (consumed), 'garbage'; "
    "__dlpack__ returning an int, a str or None, or raising",
    expect="InvalidInputError naming the operand and what was wrong (no TypeError); no field of an unknown layout read",
)
@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(version=(99, 0)), r"DLPack capsule is version 99\.0; cuplug reads 1\.x"),
        (dict(version=(0, 8)), r"version 0\.8; cuplug reads 1\.x"),
        (dict(name=b"used_dltensor"), r"already consumed \('used_dltensor'\)"),
        (dict(version=(1, 0), name=b"used_dltensor_versioned"), r"already consumed"),
        (dict(name=b"garbage"), r"a capsule named b'garbage', not 'dltensor'"),
        (dict(capsule=12), r"__dlpack__\(\) returned a int, not a DLPack capsule"),
        (dict(capsule="dltensor"), r"returned a str, not a DLPack capsule"),
    ],
    ids=["major-99", "major-0", "consumed", "consumed-versioned", "wrong-name", "int", "str"],
)
def test_capsules_of_unknown_layouts_are_refused(b, fields, match):
    with refused(r"^sum: x: (its )?.*" + match):
        b.run("sum", LyingDLPack(_floats(), **fields))


def test_a_versioned_capsule_of_major_1_is_read_with_its_flags(b):
    assert b.run("sum", LyingDLPack(_floats(), version=(1, 3))) == 10.0
    with refused(r"^add: out out: the producer marks this tensor read-only$"):
        b.run(
            "add", np.ones(4, np.float32), np.ones(4, np.float32), out=LyingDLPack(_floats(), version=(1, 0), flags=1)
        )


def test_a_producer_whose_dlpack_raises_is_named(b):
    class Raising(LyingDLPack):
        def __dlpack__(self, stream=None, **_):
            raise RuntimeError("the producer broke")

    with pytest.raises(InvalidInputError, match=r"^sum: x: its __dlpack__\(\) failed: RuntimeError: the producer") as e:
        b.run("sum", Raising(_floats()))
    assert isinstance(e.value.__cause__, RuntimeError)


CAI_LIES = {
    "version-99": (cai(version=99), r"'version' is 99; it must be 0, 1, 2 or 3"),
    "version-str": (cai(version="3"), r"'version' is '3'"),
    "version-missing": ({k: v for k, v in cai().items() if k != "version"}, r"'version' is None"),
    "extent-true": (cai(shape=(True,)), r"whose extents are not all integers"),
    "extent-float": (cai(shape=(4.0,)), r"whose extents are not all integers"),
    "extent-negative": (cai(shape=(-2,)), r"with a negative extent"),
    "ndim-33": (cai(shape=(1,) * 33), r"gives 33 dimensions; cuplug takes at most 32"),
    "shape-str": (cai(shape="12"), r"'shape' is '12'; it must be a tuple"),
    "shape-missing": ({k: v for k, v in cai().items() if k != "shape"}, r"'shape' is None"),
    "extents-overflow": (cai(shape=(1 << 40, 1 << 40)), r"more than any address space holds"),
    "ptr-2^70": (cai(ptr=1 << 70), r"names the address 0x400000000000000000 \(\+16 bytes\)"),
    "ptr-negative": (cai(ptr=-16), r"names the address -0x10"),
    "ptr-null": (cai(ptr=0), r"NULL data pointer for 16 bytes"),
    "ptr-end-beyond-user-space": (cai(ptr=(1 << 56) - 8), r"outside any process's memory"),
    "ptr-str": (cai(data=("0xd000", False)), r"'data' is \('0xd000', False\); it must be a \(pointer, read-only"),
    "ptr-bool": (cai(data=(True, False)), r"'data' is \(True, False\)"),
    "data-short": (cai(data=(0xD000,)), r"'data' is \(53248,\)"),
    "data-flag-not-bool": (cai(data=(0xD000, "no")), r"'data' is \(53248, 'no'\)"),
    "data-missing": ({k: v for k, v in cai().items() if k != "data"}, r"'data' is None"),
    "typestr-int": (cai(typestr=4), r"'typestr' is 4; it must be a type string"),
    "typestr-unknown": (cai(typestr="<c8"), r"typestr '<c8' is not supported"),
    "strides-str": (cai(strides="4"), r"'strides' is '4'; it must be None or a tuple of integers"),
    "strides-float": (cai(strides=(4.0,)), r"'strides' is \(4\.0,\)"),
    "strides-not-itemsize": (cai(strides=(2,)), r"is not C-contiguous"),
    "strides-bytes-not-items": (cai(strides=(5,)), r"is not C-contiguous"),  # 5 // 4 == 1: only % 4 sees it
    "strides-count": (cai(strides=(4, 4)), r"gives 2 strides for 1 dimensions"),
    "data-triple": (cai(data=(0xD000, False, 1)), r"'data' is \(53248, False, 1\)"),
    "stream-str": (cai(stream="s"), r"'stream' is 's'"),
    "stream-negative": (cai(stream=-3), r"stream -3 is no CUDA stream"),
    "mask": (cai(mask=object()), r"masked arrays are not supported"),
    "not-a-dict": ([("shape", (4,))], r"__cuda_array_interface__ is a list, not a dict"),
    "property-raises": (KeyError("typestr"), r"reading __cuda_array_interface__ failed: KeyError"),
}


@rel(
    case="__cuda_array_interface__ dicts that lie",
    how="32 dicts: versions 99, '3' or none; True, 4.0, negative or overflowing extents, 33 dimensions, a "
    "str shape; data pointers of 2^70, -16, NULL, past 2^56, a str, a bool, short pairs; unknown typestrs; "
    "strides of floats, not of the item size, of another count; bad streams; a mask; not a dict; a raising "
    "property",
    expect="InvalidInputError naming the field and the value it had; none of them reaches C",
)
@pytest.mark.parametrize("lie", list(CAI_LIES))
def test_cuda_array_interface_fields_are_checked(gpu, spy, lie):
    interface, match = CAI_LIES[lie]
    with refused(r"^sum: x\b.*" + match):
        gpu.run("sum", LyingCAI(interface))
    assert not reached_c(spy)


def test_an_honest_cuda_array_interface_reaches_c(gpu, spy):
    """The control: a valid CAI v3 dict passes every check (the CPU twin then refuses the CUDA pointer)."""
    with refused(r"is a CUDA tensor"):
        gpu.run("sum", LyingCAI(cai()))
    assert reached_c(spy)
    for version in (0, 1, 2):  # older versions, lists where tuples are expected
        spy.log.clear()
        with refused(r"is a CUDA tensor"):
            gpu.run("sum", LyingCAI(cai(version=version, shape=[2, 2], data=[0xD000, False])))
        assert reached_c(spy)


# ---- 4. aliasing ------------------------------------------------------------------------------------------------


@rel(
    case="out= overlapping an input",
    how="add into a view one element off an input, into a view over both inputs, sum into an input's memory; "
    "an op of two outputs given overlapping out= arrays",
    expect="InvalidInputError naming the output and the input before anything runs; exact aliasing of an "
    "elementwise op (out=x) stays allowed and correct",
)
def test_partial_overlap_is_refused_and_exact_in_place_is_allowed(b):
    base = np.arange(9, dtype=np.float32)
    x, y = base[0:4], np.ones(4, np.float32)
    with refused(r"^add: out out partly overlaps input x; pass an out= array of its own memory$"):
        b.run("add", x, y, out=base[1:5])
    with refused(r"^add: out out partly overlaps input y"):
        b.run("add", y[:2], base[6:8], out=base[5:7])
    assert base.tolist() == list(range(9))  # nothing ran
    assert b.run("add", x, y, out=x) is x and base[:4].tolist() == [1, 2, 3, 4]  # in place: element by element
    s = np.zeros((), np.float32)
    with refused(r"^sum: out out partly overlaps input x \(only an elementwise op"):
        b.run("sum", base, out=base[3:4].reshape(()))
    assert b.run("sum", base, out=s) is s


def test_two_outputs_over_the_same_memory_are_refused(b, spy):
    ops = {
        "split": {
            "inputs": [{"name": "x", "dtypes": ["float32"]}],
            "outputs": [{"name": "lo", "shape": {"like": 0}}, {"name": "hi", "shape": {"like": 0}}],
            "elementwise": True,
        }
    }
    spy.answers["call"] = 0
    with _over(b, spy, ops=ops) as two:
        mem = np.zeros(8, np.float32)
        with refused(r"^split: out lo partly overlaps output hi"):
            two.run("split", np.ones(4, np.float32), out=(mem[0:4], mem[2:6]))
        with refused(r"^split: out lo is the same memory as output hi"):
            two.run("split", np.ones(4, np.float32), out=(mem[0:4], mem[0:4]))
        assert not reached_c(spy)
        two.run("split", np.ones(4, np.float32), out=(mem[0:4], mem[4:8]))
        assert reached_c(spy)


# ---- 5. a backend that lies -------------------------------------------------------------------------------------


@rel(
    case="a backend answering statuses, ids and descriptors the ABI does not define",
    how="call() returning +7 or +1; alloc() returning 0; tensor() describing another ndim, shape or dtype, or "
    "a pointer past 2^56; last_error() claiming 2 GiB",
    expect="BackendError naming the status and the backend (never success with unwritten outputs); the outputs "
    "it allocated freed; the message cut at 4 KiB, never a 2 GiB allocation",
)
@pytest.mark.parametrize("status", [7, 1, 1 << 30])
def test_an_undocumented_positive_status_is_an_error(b, spy, status):
    spy.answers["call"] = status
    with _over(b, spy) as liar:
        with pytest.raises(BackendError, match=rf"^add: the backend returned status {status}, which the ABI"):
            liar.run("add", np.ones(4, np.float32), np.ones(4, np.float32))
        t = liar.buffer(np.ones(4, np.float32))
        with pytest.raises(BackendError, match=r"status"):
            liar.run("add", t, t)
        assert len(liar._core.live) == 1  # only t: the failed call freed the output it allocated


def test_an_alloc_that_answers_0_is_no_tensor(b, spy):
    spy.answers["alloc"] = 0
    with _over(b, spy) as liar, pytest.raises(BackendError, match=r"^alloc: the backend returned 0, which is no"):
        liar.empty(4)


@pytest.mark.parametrize(
    "lie", [dict(ndim=40), dict(ndim=2), dict(extent=9), dict(code=0), dict(data=1 << 60), dict(strides=True)]
)
def test_a_descriptor_that_differs_from_the_allocation_is_refused(b, spy, lie):
    real_tensor = b._core.lib.tensor

    def lying_tensor(h, buffer_id, out):
        rc = real_tensor(h, buffer_id, out)
        d = out._obj
        if "ndim" in lie:
            d.ndim = lie["ndim"]
        if "extent" in lie:
            d.shape[0] = lie["extent"]
        if "code" in lie:
            d.dtype.code = lie["code"]
        if "data" in lie:
            d.data = lie["data"]
        if "strides" in lie:
            d.strides = d.shape
        return rc

    spy.answers["tensor"] = lying_tensor
    with _over(b, spy) as liar:
        t = liar.empty(4)
        with pytest.raises(BackendError, match=r"^tensor: the backend describes tensor 0x[0-9a-f]+ otherwise than"):
            liar.run("sum", t)


def test_a_message_claiming_2_gib_is_cut_not_allocated():
    calls = []

    def liar(buf, size):
        calls.append(size)
        ctypes.memmove(buf, b"partial message\0", 16)
        return (1 << 31) - 1

    text = library._read_text(liar)
    assert text == "partial message [the backend claims a 2147483647-byte message; cut at 15 bytes]"
    assert calls == [4096]  # asked once, with the first buffer: nothing sized by the claim


def test_a_message_longer_than_the_first_buffer_is_read_whole():
    msg = b"x" * 10_000

    def honest(buf, size):
        n = min(size - 1, len(msg))
        ctypes.memmove(buf, msg[:n] + b"\0", n + 1)
        return len(msg)

    assert library._read_text(honest) == msg.decode()


@rel(
    case="an op table that points at what is not there, or sizes a huge output",
    how="a planted library (tests/fake_backends/lying_backend.c) in place of cuda13/fatbin whose ping declares an "
    "output like input 3 of 1, a fixed dtype 'float7', a size rule on input 9; one whose output is sized by an "
    "attribute of default 2^50; one whose call() returns +7",
    expect="a bad table: that candidate refused at load (load-failed, naming the op and the rule), the next "
    "tried, the CPU answering; a huge output: OutOfMemoryError before any allocation; +7: BackendError",
)
@needs_wheels
@pytest.mark.parametrize(
    ("ops", "needle"),
    [
        (
            {"f": {"inputs": [{"name": "x", "dtypes": ["float32"]}], "outputs": [{"name": "o", "shape": {"like": 3}}]}},
            "output o's shape names input 3",
        ),
        (
            {
                "f": {
                    "inputs": [{"name": "x", "dtypes": ["float32"]}],
                    "outputs": [{"name": "o", "dtype": {"fixed": "float7"}}],
                }
            },
            "the dtype 'float7'",
        ),
        (
            {"f": {"inputs": [{"name": "x", "dtypes": ["float32"]}], "size_rules": [{"input": 9, "min": 1}]}},
            "a size rule names input 9",
        ),
    ],
    ids=["output-like-3", "fixed-float7", "size-rule-9"],
)
def test_a_backend_with_a_bad_op_table_is_rejected_at_load(site, fake_driver_dir, liar_site, ops, needle):
    env = env_for(liar_site, fake_driver_dir, LYING_OPS=json.dumps(ops))
    got = json.loads(run_py(DECIDE, env).stdout.strip().splitlines()[-1])
    label, code, reason = got["attempts"][0]
    assert (label, code) == ("cuda13/fatbin", "load-failed") and needle in reason and "malformed signature" in reason
    assert got["variant"] == "cpu" and got["sum"] == 10.0


DECIDE = (
    "import json, cuplug, array; b = cuplug.load(); t = b.trace; "
    "r = b.run('sum', array.array('f', [1, 2, 3, 4])); "
    "print(json.dumps({'variant': b.variant, 'sum': r, 'attempts': [[f'{a.cuda}/{a.variant}', a.code, a.reason] "
    "for a in t.attempts]}))"
)


@pytest.fixture(scope="module")
def liar_site(site, tmp_path_factory):
    """The installed backends with tests/fake_backends/lying_backend.c planted as cuda13/fatbin (manifest agreeing)."""
    out = tmp_path_factory.mktemp("liar")
    so = build_shared_library(
        HERE / "fake_backends" / "lying_backend.c",
        out / "liar.so",
        "-fvisibility=hidden",
        f"-I{ROOT / 'backends' / 'include'}",
    )
    return planted_site(site, out / "site", "cuplug_cuda13/fatbin/libcuplug_vector.so", so.read_bytes())


@needs_wheels
def test_a_lying_backend_that_loads_is_held_to_the_abi(site, fake_driver_dir, liar_site):
    """The liar's table is valid, so it serves; then its +7, its huge output and its 2 GiB message meet the checks."""
    ops = {
        "add": {
            "inputs": [{"name": "x", "dtypes": ["float32"]}, {"name": "y", "like": 0}],
            "outputs": [{"name": "out"}],
            "elementwise": True,
        },
        "iota": {
            "inputs": [],
            "outputs": [{"name": "out", "dtype": {"fixed": "float32"}, "shape": {"attr": "n"}}],
            "attrs": [{"name": "n", "kind": "int64", "default": 1 << 50}],
        },
    }
    code = (
        "import json, cuplug, array\n"
        "b = cuplug.load(); out = {'variant': b.variant}\n"
        "x = array.array('f', [1, 2])\n"
        "for what, call in (('add', lambda: b.run('add', x, x)), ('iota', lambda: b.run('iota')),\n"
        "                   ('iota-small', lambda: b.run('iota', n=3))):\n"
        "    try: call(); out[what] = 'ran'\n"
        "    except cuplug.CuplugError as e: out[what] = [type(e).__name__, str(e)]\n"
        "print(json.dumps(out))"
    )
    env = env_for(  # its self-test would reject it (its call writes nothing): the ABI's checks are what is tested
        liar_site,
        fake_driver_dir,
        LYING_OPS=json.dumps(ops),
        LYING_CALL_STATUS="7",
        LYING_DEVICE="cpu",
        CUPLUG_SELFTEST="0",
    )
    got = json.loads(run_py(code, env).stdout.strip().splitlines()[-1])
    assert got["variant"] == "fatbin"
    assert got["add"][0] == "BackendError" and "returned status 7" in got["add"][1]
    assert got["iota"][0] == "OutOfMemoryError" and "output out would be float32[1125899906842624]" in got["iota"][1]
    assert got["iota-small"][0] == "BackendError"  # allocated (3 elements), then +7
    env.update(LYING_CALL_STATUS="-5", LYING_ERROR_CLAIM=str((1 << 31) - 1))
    got = json.loads(run_py(code, env).stdout.strip().splitlines()[-1])
    assert got["add"] == [
        "BackendError",
        "add: the liar says no [the backend claims a 2147483647-byte message; cut at 16 bytes]",
    ]


def test_a_huge_declared_output_is_refused_before_allocation(b, spy):
    ops = {
        "iota": {
            "inputs": [{"name": "like", "dtypes": ["float32"]}],
            "outputs": [{"name": "out", "dtype": {"fixed": "float32"}, "shape": {"attr": "n"}}],
            "attrs": [{"name": "n", "kind": "int64", "default": 1 << 40}],
        }
    }
    with _over(b, spy, ops=ops) as big, pytest.raises(OutOfMemoryError, match=r"^iota: output out would be float32\["):
        big.run("iota", np.ones(1, np.float32))
    with _over(b, spy, "12.4", ops=ops, device={"type": "cuda", "index": 0, "memory_total": 1 << 20}) as dev:
        t = dev.empty(1)
        spy.log.clear()
        with pytest.raises(OutOfMemoryError, match=r"more than the device's memory \(1048576 bytes\)"):
            dev.run("iota", t, n=1 << 20)
        with pytest.raises(OutOfMemoryError, match=r"more than the device's memory"):
            dev.run("iota", t, n=1 << 30)
        with pytest.raises(OutOfMemoryError, match=r"float32\[9223372036854775807\] \(36893488147419103228 bytes\)"):
            dev.run("iota", t, n=(1 << 63) - 1)
        assert not spy.entries("alloc")


# ---- 6. leftovers ----------------------------------------------------------------------------------------------


def test_a_long_op_or_attribute_name_is_cut_in_the_message(b):
    with pytest.raises(cuplug.UnknownOpError) as e:
        b.run("x" * 10_000_000)
    assert len(str(e.value)) < 300 and "(10000002 characters)" in str(e.value)
    with refused(r"unknown attribute\(s\) y{100}\.\.\. \(5000000 characters\); it takes alpha, beta") as e:
        b.run("scale_add", np.ones(2, np.float32), **{"y" * 5_000_000: 1.0})
    assert len(str(e.value)) < 300
    with refused(r"attribute alpha must be a number, got 'aaa.*\(2000002 characters\)$"):
        b.run("scale_add", np.ones(2, np.float32), alpha="a" * 2_000_000)


LEAK_CHECK = r"""
import ctypes, gc, os, json, array, cuplug
import numpy as np
import cuplug.runtime.api as api
trim = ctypes.CDLL(None).malloc_trim  # glibc: give freed memory back, so RSS is what is still held
def rss():
    gc.collect(); trim(0)
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
def fds(): return len(os.listdir('/proc/self/fd'))
def use(b):
    x = np.ones(1 << 16, np.float32)
    b.run('add', x, x)
    t = b.buffer(x); r = b.run('add', t, t); b.run('sum', r)
    np.from_dlpack(b.run('add', t, t)).sum()
    t.__dlpack__()  # a capsule nobody consumes
    try: b.run('add', x, x[:3])
    except cuplug.InvalidInputError: pass
def backends(n):
    for _ in range(n):
        b = cuplug.load(); use(b); del b
backends(20)  # the allocator's high-water mark settles first: growth after it is a leak
r0, f0 = rss(), fds()
backends(60)
r1 = rss()
print(json.dumps({'cores': len(api._cores), 'open': sum(c.handle is not None for c in api._cores),
                  'rss_mib': (r1 - r0) / 2**20, 'fds': fds() - f0}))
"""


@rel(
    case="backends dropped without close()",
    how="60 backends loaded, used (host and resident calls, a DLPack export consumed and one not, a failing "
    "call) and dropped without close(), after 20 more of the same; then gc.collect() and malloc_trim",
    expect="no backend instance or core object left, fds unchanged, RSS within 4 MiB of where the first 20 left it",
)
def test_dropped_backends_leave_nothing_behind(monkeypatch):
    got = json.loads(run_py(LEAK_CHECK, dict(__import__("os").environ)).stdout.strip().splitlines()[-1])
    assert got["cores"] == 0 and got["open"] == 0 and got["fds"] == 0, got
    assert got["rss_mib"] < 4, got


# ---- the fuzz run ------------------------------------------------------------------------------------------------


@rel(
    case="random lying operands, fuzzed",
    how="a seeded generator: 12,000 DLPack capsules, CAI dicts and buffers, each honest or with one to three "
    "lies (metadata, pointers, versions, names, devices, dtypes, strides, read-only outputs), given to run() "
    "as inputs and out= of add, scale_add and sum, on the CPU twin and on a CUDA-claiming Backend over it",
    expect="every case a cuplug error or the result NumPy gives; no lie reaches C; no crash; RSS and fds flat",
)
def test_fuzz_lying_operands():
    proc = run_py(
        f"import sys; sys.path.insert(0, {str(HERE)!r}); import fuzz_operands; fuzz_operands.main(12000, 31)",
        dict(__import__("os").environ, CUPLUG_BACKEND="cpu"),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["cases"] >= 10_000 and report["bad"] == [], report["bad"][:5]
    assert report["honest_correct"] > 1000 and report["lies_refused"] > 5000, report
    assert report["rss_growth_mib"] < 32 and report["fd_growth"] == 0, report


# ---- the C check, met directly -------------------------------------------------------------------------------


C_WRAP = r"""
import ctypes, json, sys
from cuplug.contract import abi
from cuplug.runtime.library import BackendLibrary
lib = BackendLibrary(sys.argv[1]); h = lib.create(None); seen = []
for data, offset in json.loads(sys.argv[2]):
    shape = (ctypes.c_int64 * 1)(4)
    t = abi.CTensor()
    t.data, t.device_type, t.device_id, t.ndim, t.byte_offset = data, 1, 0, 1, offset
    t.dtype = abi.CDtype(2, 32, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    result = ctypes.c_float()
    c_out = (abi.CTensor * 1)()
    c_out[0].data, c_out[0].device_type, c_out[0].ndim = ctypes.addressof(result), 1, 0
    c_out[0].dtype = abi.CDtype(2, 32, 1)
    rc = lib.call(h, b"sum", (abi.CTensor * 1)(t), 1, c_out, 1, None, 0, 0)
    seen.append([rc, lib.last_error(h)])
print(json.dumps(seen))
"""


def test_the_c_check_refuses_a_descriptor_that_wraps_the_address_space(cpu_lib_path):
    """A C caller that skips the Python checks (another binding, a framework calling the ABI) meets the same
    bound in the twin's own check: data + byte_offset + nbytes must not wrap (in a subprocess: a miss is a crash)."""
    cases = [(0x1000, (1 << 64) - 8), ((1 << 64) - 8, 0), ((1 << 64) - 64, 60)]  # the offset, the data, the bytes
    proc = run_py_args(C_WRAP, str(cpu_lib_path), json.dumps(cases))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rc, message in json.loads(proc.stdout.strip().splitlines()[-1]):
        assert rc == -1 and "run past the end of the address space" in message, message


def run_py_args(code: str, *args: str):
    import os
    import subprocess

    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


# ---- behaviours hand-written mutants changed unseen (issue 31's list, the operand side) ----------------------


@pytest.mark.parametrize(
    ("x", "y"), [("float32", "int32"), ("float16", "bfloat16"), ("int8", "uint8"), ("int64", "float64")]
)
def test_an_input_of_another_dtype_of_the_same_size_is_refused(b, spy, x, y):
    """dtypes are compared as dtypes, never by item size (float32 and int32 are both 4 bytes)."""
    dt = dtypes.BY_NAME
    with _over(b, spy) as cpu:
        tx, ty = cpu.empty(4, dt[x]), cpu.empty(4, dt[y])
        spy.log.clear()
        with refused(
            rf"^add: y must match x in dtype and shape \(dtypes or shapes differ\): y is {y}\[4\], x is {x}\[4\]$"
        ):
            cpu.run("add", tx, ty)
        if x != "float16":  # host arrays too (NumPy has no bfloat16)
            with refused(r"^add: y must match x"):
                cpu.run("add", np.ones(4, x), np.ones(4, y))
    assert not reached_c(spy)


def test_resident_inputs_are_checked_against_the_signature_too(b, spy):
    """All-resident calls skip no check: a shape, count or attribute error is Python's, before C."""
    with _over(b, spy) as cpu:
        t4, t5 = cpu.empty(4), cpu.empty(5)
        spy.log.clear()
        with refused(r"^add: y must match x in dtype and shape \(lengths differ\)"):
            cpu.run("add", t4, t5)
        with refused(r"^add takes 2 input\(s\) \(x, y\), got 1$"):
            cpu.run("add", t4)
        with refused(r"^scale_add: unknown attribute\(s\) gamma"):
            cpu.run("scale_add", t4, gamma=1.0)
        with refused(r"^sum: out has 4 elements"):
            cpu.run("sum", t4, out=cpu.empty(4))
    assert not reached_c(spy)


def test_the_producer_stream_of_an_out_array_is_waited_for(gpu, spy):
    """A CAI v3 out= array written by its producer on stream S: the launch waits for S first, as for inputs."""
    spy.answers["call"] = 0
    x = LyingCAI(cai(ptr=0xD000))
    out = LyingCAI(cai(ptr=0xE000, stream=0x7000))
    gpu.run("add", x, x, out=out)
    before, launch, _after = spy.waits_around_the_call()
    assert (0, 0x7000) in before and launch == 0


def test_a_sum_of_resident_cuda_tensors_is_a_python_number(gpu):
    t = gpu.buffer(np.arange(1, 5, dtype=np.float32))
    s = gpu.run("sum", t)
    assert type(s) is float and s == 10.0
    i = gpu.run("sum", gpu.buffer(np.arange(1, 5, dtype=np.int32)))
    assert type(i) is int and i == 10


def test_a_tensor_used_in_calls_is_freed_when_its_last_reference_goes(b, spy):
    """No reference cycle holds a resident tensor (or its backend): its memory is freed the moment the caller
    drops it, not at the next garbage collection (device memory must not wait for gc)."""
    import gc

    gc.disable()
    try:
        with _over(b, spy) as cpu:
            t = cpu.empty(4)
            r = cpu.run("add", t, t)
            cpu.run("add", t, t, out=r)
            ids = {t.id, r.id}
            del t, r
            assert not ids & set(cpu._core.live), "a tensor outlived its last reference"
            assert len(spy.entries("free")) == 2
    finally:
        gc.enable()


# ---- the bounds at their edges (what operands.py's mutants changed unseen)


def test_the_address_space_bound_is_2_to_the_56(gpu, spy):
    """A CAI range ending exactly at 2^56 reaches C; one byte past, or starting at 2^56, is refused; a 2^55
    address is an address; 32 dimensions are allowed, 33 not; an empty array may have a NULL pointer."""
    for ptr, shape in [((1 << 56) - 16, (4,)), (1 << 55, (4,)), (0xD000, (1,) * 32), (0, (0,)), (0, (3, 0))]:
        spy.log.clear()
        with refused(r"is a CUDA tensor"):  # through every check to the twin, which refuses CUDA memory
            gpu.run("sum", LyingCAI(cai(ptr=ptr, shape=shape)))
        assert reached_c(spy), (ptr, shape)
    for ptr, shape, match in [
        ((1 << 56) - 12, (4,), r"names the address 0xfffffffffffff4 \(\+16 bytes\), outside"),
        (1 << 56, (0,), r"names the address 0x100000000000000 \(\+0 bytes\), outside"),
        (1 << 60, (0,), r"names the address 0x1000000000000000 \(\+0 bytes\), outside"),  # empty, still no address
        (-1, (0,), r"names the address -0x1 \(\+0 bytes\), outside"),
        (0xD000, (1 << 54,), r"\(72057594037927936 bytes\), more than any address space holds"),
    ]:
        with refused(match):
            gpu.run("sum", LyingCAI(cai(ptr=ptr, shape=shape)))


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ((1, (1 << 31) - 1), None),  # the largest int32 device id: a host capsule's id means nothing, it is read
        ((1, 1 << 31), r"__dlpack_device__\(\) gave \(1, 2147483648\), not a \(device type, device id\) pair"),
        ((1 << 31, 0), r"__dlpack_device__\(\) gave \(2147483648, 0\)"),
        (((1 << 31) - 1, 0), r"DLPack device type 2147483647 is neither the host nor CUDA"),
        ((0, 0), r"DLPack device type 0 is neither the host nor CUDA"),
        ((1, -1), r"__dlpack_device__\(\) gave \(1, -1\)"),
    ],
)
def test_a_dlpack_device_is_a_pair_of_int32s(b, answer, match):
    x = LyingDLPack(_floats(), device=answer if answer[0] == 1 and answer[1] >= 0 else (1, 0), dlpack_device=answer)
    if match is None:
        assert b.run("sum", x) == 10.0
    else:
        with refused(match):
            b.run("sum", x)


def test_a_capsule_of_another_device_type_is_named_as_such(b):
    """__dlpack_device__ says the host, the capsule says OpenCL (4): refused naming the capsule's device type."""
    with refused(r"^sum: x: DLPack device type 4 is neither the host nor CUDA$"):
        b.run("sum", LyingDLPack(_floats(), device=(4, 0), dlpack_device=(1, 0)))


def test_a_stream_whose_index_raises_type_error_is_no_stream(b):
    class Odd:
        def __index__(self):
            raise TypeError("not today")

    t = b.buffer(np.ones(2, np.float32))
    with refused(r"^__dlpack__: stream must be None or an integer, got <"):
        t.__dlpack__(stream=Odd())


def test_host_capsules_at_odd_or_empty_addresses(b):
    """An empty tensor at an unmapped address reads nothing and is fine; an unmapped odd address (uint8: no
    alignment to catch it) is refused by the mapping check; a capsule whose base is unmapped but whose base +
    byte_offset is the real first element is read correctly (the check is of the first element, not the base)."""
    assert b.run("sum", LyingDLPack(16, shape=(0,))) == 0.0
    with refused(r"which are not \(all\) memory of this process"):
        b.run("sum", LyingDLPack(0x1001, shape=(4,), dtype=(1, 8, 1)))
    real = np.arange(1, 5, dtype=np.float32)
    assert b.run("sum", LyingDLPack(16, shape=(4,), byte_offset=real.ctypes.data - 16)) == 10.0


def test_a_cai_data_field_is_exactly_a_pair(gpu, spy):
    with refused(r"'data' is \(53248, False, 1\); it must be a \(pointer, read-only flag\) pair"):
        gpu.run("sum", LyingCAI(cai(data=(0xD000, False, 1))))
    assert not reached_c(spy)


def test_pytorch_cpu_tensors_their_device_and_their_bytes(b, spy):
    """A PyTorch CPU tensor reaches C as device (1, 0); its byte size (numel * itemsize) is what the overlap
    check compares; a tensor on the meta device is named as such."""
    torch = pytest.importorskip("torch")
    with _over(b, spy) as cpu:
        x = torch.arange(4, dtype=torch.float32)
        spy.log.clear()
        assert torch.equal(cpu.run("add", x, x), x + x)
        assert [t["device"] for t in spy.entries("call")[0][1]] == [(1, 0), (1, 0)]
        base = torch.zeros(12, dtype=torch.float32)
        with refused(r"^add: out out partly overlaps input x"):
            cpu.run("add", base[0:8], torch.ones(8), out=base[4:12])
        with refused(r"is on PyTorch device meta, neither the host nor CUDA"):
            cpu.run("sum", torch.empty(4, device="meta"))


def test_more_edges_of_the_dlpack_import(b):
    """32 dimensions read; a first element given as an odd base + 1 (the sum is of the real element, not of
    base | offset); device type 0 and a capsule on a lower device id than declared refused; a device type of
    2^32 refused by the pair check."""
    real = np.arange(1, 5, dtype=np.float32)
    assert b.run("sum", LyingDLPack(bytearray(real.tobytes()), shape=(1,) * 28 + (2, 1, 2, 1))) == 10.0
    assert b.run("sum", LyingDLPack(real.ctypes.data - 1, shape=(4,), byte_offset=1)) == 10.0
    with refused(r"^sum: x: DLPack device type 0 is neither the host nor CUDA$"):
        b.run("sum", LyingDLPack(_floats(), device=(0, 0), dlpack_device=(1, 0)))
    with refused(r"its capsule is on device \(1, 0\), __dlpack_device__\(\) said \(1, 3\)"):
        b.run("sum", LyingDLPack(_floats(), device=(1, 0), dlpack_device=(1, 3)))
    with refused(r"__dlpack_device__\(\) gave \(4294967296, 0\)"):
        b.run("sum", LyingDLPack(_floats(), dlpack_device=(1 << 32, 0)))


def test_a_host_range_running_into_an_unmapped_page_is_refused(b):
    """Two pages mapped, the second unmapped again: 16 bytes starting 8 before the gap are not all memory."""
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long],
    )
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = mmap.PAGESIZE
    base = libc.mmap(None, 2 * page, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    try:
        assert libc.munmap(base + page, page) == 0
        assert b.run("sum", LyingDLPack(base + page - 16, shape=(4,))) == 0.0  # inside the mapped page
        with refused(r"which are not \(all\) memory of this process"):
            b.run("sum", LyingDLPack(base + page - 8, shape=(4,)))
    finally:
        libc.munmap(base, page)


def _pages(n: int) -> tuple[int, object]:
    """n fresh anonymous pages (address, libc); the caller unmaps what it likes."""
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    base = libc.mmap(None, n * mmap.PAGESIZE, prot, flags, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    return base, libc


def test_the_mapping_check_measures_the_range_it_is_given():
    """A mapped range crossing into the next mapped page, with an unmapped page after it, is read: the check
    asks for exactly [page start, end), not more (a longer range would refuse honest memory)."""
    import mmap

    page = mmap.PAGESIZE
    base, libc = _pages(4)
    try:
        first = base if base & page else base + page  # a page whose address has the page-size bit set
        libc.munmap(first + 2 * page, page)  # the page after the next one: unmapped
        with cuplug.load() as b:
            assert b.run("sum", LyingDLPack(first + page - 8, shape=(4,))) == 0.0  # 16 bytes across two pages
    finally:
        libc.munmap(base, 4 * page)


def test_the_first_element_is_base_plus_offset_for_every_check():
    """A base in unmapped page 0 with an offset to real memory just after an unmapped page: the address
    checked (range and mapping) and read is base + offset, never a near miss of it."""
    import mmap

    page = mmap.PAGESIZE
    base, libc = _pages(2)
    try:
        libc.munmap(base, page)  # the page before the data: unmapped
        real = base + page
        ctypes.memmove(real, np.arange(1, 5, dtype=np.float32).tobytes(), 16)
        with cuplug.load() as b:
            assert b.run("sum", LyingDLPack(0x7FF, shape=(4,), byte_offset=real - 0x7FF)) == 10.0
            with refused(r"names the address 0x100000000000010 \(\+16 bytes\), outside any process's memory"):
                b.run("sum", LyingDLPack((1 << 56) - 16, shape=(4,), byte_offset=0x20))
    finally:
        libc.munmap(base + page, page)
