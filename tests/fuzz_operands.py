"""The fuzz run of tests/test_hostile_operands.py: seeded random operands, honest or lying, given to run().

Each case is built from an honest NumPy array of small integers (so every result is exact in every dtype)
and then told zero to three lies, each of a kind that a correct boundary always detects. The oracle:
  - an honest case on the CPU twin gives NumPy's result;
  - an honest case on the CUDA-claiming Backend reaches C, which refuses the host or made-up pointer with a
    cuplug error (CUPLUG_E_WRONG_DEVICE): the Python side let it through, as it must;
  - a lying case raises a cuplug error before anything reaches C.
Anything else (another exception, a wrong result, a lie accepted or reaching C) is recorded in ``bad``.
``main()`` prints one JSON line: the counts, ``bad`` (the first 20), RSS and fd growth after a warm-up.
"""

from __future__ import annotations

import json
import os
import random

import numpy as np

import cuplug
from cuplug.runtime import api
from hostile_producers import ExportsOneArrayNamesAnother, LyingCAI, LyingDLPack, cai

DTYPES = {  # numpy name -> DLPack (code, bits)
    "float16": (2, 16),
    "float32": (2, 32),
    "float64": (2, 64),
    "int8": (0, 8),
    "uint8": (1, 8),
    "int32": (0, 32),
    "int64": (0, 64),
}
TYPESTR = {
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
    "int8": "|i1",
    "uint8": "|u1",
    "int32": "<i4",
    "int64": "<i8",
}


class CountingLib:
    """A backend library whose call() is counted: a lie must never get that far."""

    def __init__(self, lib):
        self.lib, self.path, self.calls = lib, lib.path, 0

    def __getattr__(self, name):
        real = getattr(self.lib, name)
        if name not in ("call", "call_fast"):
            return real

        def call(*args):
            self.calls += 1
            return real(*args)

        return call


def _array(rng: random.Random, dtype: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    if shape is None:
        shape = tuple(rng.randint(0 if rng.random() < 0.1 else 1, 5) for _ in range(rng.randint(0, 3)))
    n = int(np.prod(shape)) if shape else 1
    return np.array([rng.randint(0, 9) for _ in range(n)], dtype=dtype).reshape(shape)


def _honest_capsule(rng: random.Random, a: np.ndarray) -> dict:
    addr = a.ctypes.data
    fields = dict(data=addr, shape=a.shape, dtype=(*DTYPES[a.dtype.name], 1))
    if rng.random() < 0.3 and a.ndim:  # explicit C-contiguous strides (in elements)
        fields["strides"] = tuple(s // a.itemsize for s in a.strides)
    if rng.random() < 0.3:  # the first element given as base + byte_offset
        off = a.itemsize * rng.randint(1, 4)
        fields.update(data=addr - off, byte_offset=off)
    if rng.random() < 0.3:
        fields["version"] = (1, rng.randint(0, 3))
    return fields


def _lie(rng: random.Random, f: dict, a: np.ndarray) -> str:
    """Changes ``f`` by one lie a correct boundary always refuses; returns its name."""
    n = a.size
    kinds = [
        "ndim",
        "null-shape",
        "negative",
        "overflow",
        "offset-high",
        "data-high",
        "dtype",
        "device",
        "version",
        "name",
        "not-capsule",
        "dlpack-device",
    ]
    if n:
        kinds += ["huge", "offset-past", "data-null", "data-unmapped"]
    if a.ndim >= 2 and all(d >= 2 for d in a.shape):
        kinds.append("fortran")
    kind = rng.choice(kinds)
    if kind == "ndim":
        f["ndim"] = rng.choice([33, 64, 1 << 20, (1 << 31) - 1, -1, -(1 << 31)])
    elif kind == "null-shape":
        f["shape"], f["shape_ptr"] = f["shape"] or (1,), 0
        f.pop("strides", None)
        if not a.shape:
            f["ndim"] = 1
    elif kind == "negative":
        shape = list(f["shape"] or (1,))
        shape[rng.randrange(len(shape))] = -rng.randint(1, 1 << 40)
        f["shape"] = tuple(shape)
        f.pop("strides", None)
    elif kind == "overflow":
        f["shape"] = (1 << 31,) * rng.randint(3, 6)
        f.pop("strides", None)
    elif kind == "huge":
        shape = [max(d, 1) for d in (f["shape"] or (1,))]
        shape[rng.randrange(len(shape))] = rng.choice([1 << 36, 1 << 40, 1 << 44])
        f["shape"] = tuple(shape)
        f.pop("strides", None)
    elif kind == "offset-high":
        f["byte_offset"] = rng.choice([(1 << 63) - 8, (1 << 64) - 8, 1 << 57, 1 << 56])
    elif kind == "offset-past":
        f["byte_offset"] = f.get("byte_offset", 0) + (1 << 44)  # 16 TiB past: nothing this process maps is there
    elif kind == "data-high":
        f["data"] = rng.choice([1 << 56, 1 << 60, (1 << 64) - 64])
    elif kind == "data-null":
        f["data"], f["byte_offset"] = 0, 0
    elif kind == "data-unmapped":
        f["data"], f["byte_offset"] = rng.choice([16, 4096, 0x1000 * 7]), 0
    elif kind == "dtype":
        f["dtype"] = rng.choice([(3, 16, 1), (2, 8, 1), (2, 32, 2), (0, 1, 1), (5, 64, 1), (4, 32, 1), (2, 128, 1)])
    elif kind == "device":
        f["device"] = rng.choice([(4, 0), (7, 0), (99, 0), (1, 3)])
        f["dlpack_device"] = f["device"] if f["device"] != (1, 3) else (1, 0)  # (1, 3): the two disagree
    elif kind == "version":
        f["version"] = rng.choice([(99, 0), (0, 1), (2, 0)])
    elif kind == "name":
        f["name"] = rng.choice([b"used_dltensor", b"junk", b"dltensor_versioned_", b""])
        if f["name"] == b"dltensor_versioned_":
            f.pop("version", None)
    elif kind == "not-capsule":
        f["capsule"] = rng.choice([1, "dltensor", b"x", 2.5, object()])
    elif kind == "dlpack-device":
        f["dlpack_device"] = rng.choice([None, "ab", (1,), (1, 0, 0), (1.5, 0), ValueError("no"), (-1, 0)])
        if f["dlpack_device"] is None:
            f["dlpack_device"] = lambda: None
    elif kind == "fortran":
        strides, acc = [], 1
        for d in a.shape:  # column-major: never the C-contiguous strides when every extent is >= 2
            strides.append(acc)
            acc *= d
        f["strides"] = tuple(strides)
    return kind


def _cai_lie(rng: random.Random, d: dict) -> str:
    kind = rng.choice(["version", "extent", "ptr", "data", "typestr", "strides", "stream", "mask", "shape"])
    if kind == "version":
        d["version"] = rng.choice([4, 99, -1, "3", None, 3.0])
    elif kind == "extent":
        d["shape"] = rng.choice([(True,), (2.0,), (-1,), (1 << 40, 1 << 40), (1,) * 33, ("4",)])
    elif kind == "ptr":
        d["data"] = (rng.choice([1 << 70, -16, 1 << 56, 1 << 60, 0]), False)
        if d["data"][0] == 0 and 0 in d["shape"]:
            d["shape"] = (1,)
    elif kind == "data":
        d["data"] = rng.choice([None, (0xD000,), ("0xd000", False), (0xD000, "no"), (True, False), 0xD000, "p"])
    elif kind == "typestr":
        d["typestr"] = rng.choice([4, None, "<c8", "<f16", "f4", "<b1", "|O"])
    elif kind == "strides":
        d["strides"] = rng.choice(["4", (4.0,), (3,), (4, 4, 4, 4, 4), (-4,)])
        d["shape"] = (5,)
    elif kind == "stream":
        d["stream"] = rng.choice(["s", -2, 2.0, -1])
    elif kind == "mask":
        d["mask"] = object()
    elif kind == "shape":
        d["shape"] = rng.choice(["12", None, 12, {"a": 1}])
    return kind


def _expected(op: str, xs: list[np.ndarray], attrs: dict) -> np.ndarray:
    x = xs[0]
    with np.errstate(over="ignore"):
        if op == "add":
            return (x + xs[1]).astype(x.dtype)
        if op == "scale_add":
            if x.dtype.kind in "iu":
                return (x.astype(np.int64) * int(attrs["alpha"]) + int(attrs["beta"])).astype(x.dtype)
            return (x * x.dtype.type(attrs["alpha"]) + x.dtype.type(attrs["beta"])).astype(x.dtype)
    return np.array(x.astype(np.float64 if x.dtype.kind == "f" else np.int64).sum()).astype(
        x.dtype if x.dtype.kind == "f" else np.int64
    )


def _same(result: object, want: np.ndarray) -> bool:
    if isinstance(result, (int, float)):
        return want.shape == () and float(result) == float(want)
    if isinstance(result, np.ndarray):
        got = result
    else:  # array.array, or cuplug's HostTensor (its shape must be the result's)
        raw = bytes(result.raw)[: result.nbytes] if hasattr(result, "raw") else memoryview(result).cast("B")
        got = np.frombuffer(raw, dtype=want.dtype)
        if hasattr(result, "raw") and tuple(result.shape) != want.shape:
            return False
    return got.size == want.size and bool(np.all(got.reshape(-1) == want.reshape(-1)))


def main(n_cases: int, seed: int) -> None:
    rng = random.Random(seed)
    cpu = cuplug.load()
    counted = CountingLib(cpu._core.lib)
    host = api.Backend(counted, counted.lib.create(None), dict(cpu._info))
    gpu = api.Backend(
        counted,
        counted.lib.create(None),
        {**cpu._info, "device": {"type": "cuda", "index": 0}, "stream": 0x5000},
        cuda="12.4",
    )
    counts = {"cases": 0, "honest_correct": 0, "honest_reached_c": 0, "lies_refused": 0}
    bad: list[list[str]] = []
    rss0 = fd0 = 0
    for i in range(n_cases):
        if i == n_cases // 10:
            rss0, fd0 = _rss(), _fds()
        counts["cases"] += 1
        op = rng.choice(["add", "scale_add", "sum"])
        dtype = rng.choice(list(DTYPES))
        attrs = {"alpha": 2.0, "beta": 1.0} if op == "scale_add" else {}
        a = _array(rng, dtype)
        xs = [a, _array(rng, dtype, a.shape)] if op == "add" else [a]
        route = rng.random()
        lies: list[str] = []
        out = None
        backend = host
        if route < 0.55:  # DLPack capsules over the arrays
            operands = []
            for x in xs:
                f = _honest_capsule(rng, x)
                if (rng.random() < 0.6 and not lies) or rng.random() < 0.1:
                    for _ in range(rng.randint(1, 3)):
                        lies.append(_lie(rng, f, x))
                operands.append(LyingDLPack(**f))
        elif route < 0.75:  # the buffer protocol: honest arrays, and the ones it must refuse
            operands = list(xs)
            pick = rng.random()
            if pick < 0.15 and a.ndim and a.size and a.shape[-1] >= 2:
                operands[0] = np.repeat(a, 2, axis=-1)[..., ::2]
                lies.append("non-contiguous")
            elif pick < 0.25:
                operands[0] = a.astype(rng.choice([bool, np.complex64, object]))
                lies.append("unknown-format")
            elif pick < 0.35 and op == "sum" and a.size:
                elsewhere = np.full(a.size, 200, np.uint8)
                operands[0] = ExportsOneArrayNamesAnother(a.astype(np.uint8).tobytes(), elsewhere.ctypes.data)
                xs = [a.astype(np.uint8)]
        elif route < 0.9:  # CAI dicts to the CUDA-claiming backend
            backend = gpu
            d = cai(ptr=0x7F0000000000, shape=a.shape, typestr=TYPESTR[dtype])
            if rng.random() < 0.7:
                lies.append(_cai_lie(rng, d))
            operands = [LyingCAI(d)] + (
                [LyingCAI(cai(ptr=0x7F0000100000, shape=a.shape, typestr=TYPESTR[dtype]))] if op == "add" else []
            )
        else:  # out= arrays: honest, read-only, overlapping or lying
            operands = list(xs)
            want_shape = a.shape if op != "sum" else ()
            kind = rng.choice(["honest", "read-only", "overlap", "lying-capsule", "wrong-shape"])
            out_dtype = np.int64 if op == "sum" and a.dtype.kind in "iu" else a.dtype  # sum: the accumulator's
            if kind == "honest" or (kind == "overlap" and a.size < 2):
                out = np.zeros(want_shape, out_dtype)
            elif kind == "read-only":
                out = np.zeros(want_shape, out_dtype)
                out.setflags(write=False)
                lies.append(kind)
            elif kind == "overlap":
                big = np.concatenate([a.reshape(-1), np.zeros(2, a.dtype)])
                operands[0] = big[: a.size].reshape(a.shape)
                out = big[1 : a.size + 1].reshape(a.shape) if op != "sum" else big[:1].reshape(())
                lies.append(kind)
            elif kind == "lying-capsule":
                target = np.zeros(want_shape, a.dtype)
                f = _honest_capsule(rng, target)
                lies.append(_lie(rng, f, target))
                out = LyingDLPack(**f)
            else:
                out = np.zeros(tuple(d + 1 for d in want_shape) or (2,), a.dtype)
                lies.append(kind)
        before = counted.calls
        try:
            result = backend.run(op, *operands, out=out, **attrs)
        except cuplug.CuplugError as exc:
            reached = counted.calls > before
            if lies and reached:
                bad.append([f"{op} {lies}", f"reached C: {exc}"])
            elif lies:
                counts["lies_refused"] += 1
            elif backend is gpu and reached:
                counts["honest_reached_c"] += 1
            else:
                bad.append([f"{op} {dtype}{list(a.shape)} honest", f"{type(exc).__name__}: {exc}"])
            continue
        except Exception as exc:
            bad.append([f"{op} {lies or 'honest'}", f"{type(exc).__name__}: {exc}"])
            continue
        if lies:
            bad.append([f"{op} {lies}", "accepted"])
        elif backend is gpu:
            bad.append([f"{op} CAI honest", "ran on a made-up device pointer"])
        elif _same(result if out is None else out, _expected(op, xs, attrs)):
            counts["honest_correct"] += 1
        else:
            bad.append([f"{op} {dtype}{list(a.shape)}", f"wrong result {result!r}"])
    counts.update(bad=bad[:20], n_bad=len(bad), rss_growth_mib=(_rss() - rss0) / 2**20, fd_growth=_fds() - fd0)
    print(json.dumps(counts))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))
