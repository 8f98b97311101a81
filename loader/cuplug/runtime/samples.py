"""Sample calls from op signatures: what ``cuplug probe``, ``cuplug warmup`` and load()'s self-test run on any backend.

An op's sample is derived from its signature alone (``sample_n`` elements, float32
where the op takes it, the declared attribute defaults), filled with small
multiples of 1/4 that every dtype holds exactly and every summation order adds
exactly; so a CUDA result can be compared with the CPU twin's bit for bit, and a
float result within 1e-3 of the largest magnitude where an op's math differs.
No NumPy: host memory is cuplug's own, exported through DLPack.
"""

from __future__ import annotations

import ctypes

from ..contract import dtypes
from .hostbuf import HostBuffer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .signature import OpSignature


def _pattern(dt: dtypes.DType, n: int) -> list[float]:
    if dt.is_float:
        return [((i % 13) - 6) * 0.25 for i in range(n)]
    if dt.code == dtypes.DL_BOOL:
        return [float(i % 3 == 0) for i in range(n)]
    if dt.code == dtypes.DL_UINT:
        return [float(i % 13) for i in range(n)]
    return [float((i % 13) - 6) for i in range(n)]


_PATTERN_BYTES: dict[tuple[dtypes.DType, int], bytes] = {}  # a dict, not functools.lru_cache: importing
# functools (with collections, operator, itertools) would add their import to load()'s self-test


def _pattern_bytes(dt: dtypes.DType, n: int) -> bytes:
    """The pattern's bytes, made once per dtype and size: load()'s self-test fills two buffers per input and op,
    and packing 1024 Python floats each time was most of a sample's host time."""
    made = _PATTERN_BYTES.get((dt, n))
    if made is None:
        buf = HostBuffer(dt, (n,))
        buf.fill(_pattern(dt, n))
        made = _PATTERN_BYTES[(dt, n)] = buf.tobytes()
    return made


def sample_inputs(sig: OpSignature) -> tuple[list[HostBuffer], dict[str, Any]]:
    """Host inputs and attributes for one call of ``sig``: ``sample_n`` elements each, 1-D, except inputs
    whose signature gives their shape (e.g. per-block scales)."""
    inputs: list[HostBuffer] = []
    values = {name: value for name, _, value in sig.attr_values({})}
    for i, inp in enumerate(sig.inputs):
        dt = inputs[inp.like].dtype if inp.like is not None and inp.like < i else sig.sample_dtype(i)
        shape: tuple[int, ...] = (sig.sample_n,)
        if inp.shape_rule is not None:  # e.g. per-block scales: their count follows from input k
            shape = sig._rule_shape(inp.shape_rule, [(b.dtype, b.shape) for b in inputs], values)
        buf = HostBuffer(dt, shape)
        data = _pattern_bytes(dt, buf.n)
        ctypes.memmove(buf.raw, data, len(data))
        inputs.append(buf)
    return inputs, {}


def run_sample(backend: Any, sig: OpSignature) -> list[HostBuffer]:
    """One call of the op's sample on ``backend``; the outputs, in host memory."""
    inputs, attrs = sample_inputs(sig)
    specs = [(b.dtype, b.shape) for b in inputs]
    outs = [HostBuffer(dt, shape) for dt, shape in sig.output_specs(specs, sig.attr_values(attrs))]
    backend.run(sig.name, *inputs, out=tuple(outs) if len(outs) > 1 else outs[0], **attrs)
    return outs


def compare(got: list[HostBuffer], want: list[HostBuffer]) -> str | None:
    """None when each output agrees (bits for integers, 1e-3 of the largest magnitude for floats)."""
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        gb, wb = g.tobytes(), w.tobytes()
        if gb == wb:  # the usual case, decided without a Python number per element
            continue
        if g.dtype is not w.dtype or g.shape != w.shape:  # (the op's signature makes both alike: a broken twin)
            return f"output {k}: {g.dtype.name}{list(g.shape)}, the CPU twin gives {w.dtype.name}{list(w.shape)}"
        gv, wv = g.values(), w.values()
        if not g.dtype.is_float:
            # the first element whose bits differ (bools of other bytes than 0/1 read alike as values)
            size = g.dtype.itemsize
            i = next(j for j in range(g.n) if gb[j * size : (j + 1) * size] != wb[j * size : (j + 1) * size])
            ga, wa = gb[i * size : (i + 1) * size], wb[i * size : (i + 1) * size]
            bits = f" (bytes {ga.hex()} against {wa.hex()})" if gv[i] == wv[i] else ""
            return f"output {k}: element {i} is {gv[i]}, the CPU twin gives {wv[i]}{bits}"
        scale = max([1.0] + [abs(v) for v in wv])
        for i, (a, b) in enumerate(zip(gv, wv, strict=True)):
            if not abs(a - b) <= 1e-3 * scale:
                return f"output {k}: element {i} is {a}, the CPU twin gives {b}"
    return None
