"""The fast path's Python half: what ``_fastcall`` (loader/fastcall/fastcall.c) is taught.

``Backend.run`` is the whole path: every operand imported and checked, every error worded, a prepared
call per key (plan.py). Once it has made a call, ``learn`` hands the same call to the C dispatcher, which
reads the operands again with its own readers (exact ``torch.Tensor``/``Parameter``, exact
``numpy.ndarray``, exact ``cupy.ndarray``, cuplug's resident ``Tensor``), checks that they say what the plan says, and keeps the
plan's C descriptors. A later call with the same key is repeated in C: every check that can change
between two calls (addresses and their span, contiguity, layout, lazy views, read-only and
requires-grad outputs, overlaps, freed tensors, a closed or forked instance) is made again there; any
operand it does not read, any doubt, goes back to ``Backend.run``. Measured why, and against what:
docs/performance.md ("Why a C dispatcher").

``CUPLUG_FASTPATH=0`` turns it off (``Backend.run`` alone). The module is abi3 for CPython >= 3.11; on
another interpreter (PyPy, a free-threaded build) it is not imported and ``Backend.run`` serves alone.
"""

from __future__ import annotations

import ctypes
import os
import sys

from ..contract import dtypes
from . import policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Backend = Any  # (the module that defines it imports this one)

    from collections.abc import Callable

    from .plan import Plan
    from .signature import OpSignature

    # How the whole path made one output: (callable, args, kwargs), or (torch.empty_like, the input's index, None)
    Maker = tuple[Callable[..., Any], tuple[Any, ...] | int, dict[str, Any] | None]

ROW = {d: i for i, d in enumerate(dtypes.TABLE)}  # a dtype's row: how C names it (contract.dtypes.TABLE)
_state: dict[str, Any] = {}  # "module": the extension or None; "numpy"/"torch": taught once


def _module(resident: type) -> Any:
    """The extension, configured once (``resident``: cuplug's Tensor); None where this interpreter cannot load it
    (or it is not built)."""
    if "module" not in _state:
        mod = None
        if sys.implementation.name == "cpython" and sys.version_info >= (3, 11) and not _free_threaded():
            try:
                from . import _fastcall as mod  # type: ignore[attr-defined, no-redef]
            except ImportError:  # a source checkout without the build: Backend.run alone
                mod = None
        if mod is not None:
            rows = tuple((d, d.code, d.bits, d.itemsize) for d in dtypes.TABLE)
            mod.configure(rows, {f: ROW[d] for f, d in dtypes.BY_FORMAT.items()}, resident)
        _state["module"] = mod
    return _state["module"]


def _free_threaded() -> bool:
    import sysconfig

    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def dispatcher(backend: Backend, whole_path: Any, resident: type) -> Any:
    """The C dispatcher for ``backend`` (its ``run``; ``whole_path``: ``Backend.run``, ``resident``: ``Tensor``), or
    None: turned off (CUPLUG_FASTPATH=0, read by load()'s policy, else here), or no extension here."""
    chosen = getattr(getattr(backend.trace, "policy", None), "fastpath", None)
    if not (policy.fastpath(os.environ) if chosen is None else chosen):
        return None
    mod = _module(resident)
    if mod is None:
        return None
    core = backend._core
    entry = getattr(core.lib, "call_fast", None)
    # not a C function (ctypes' private base class, which typeshed does not export): a library stand-in (tests'
    # spies), and the whole path sees it all
    if not isinstance(entry, ctypes._CFuncPtr):  # type: ignore[attr-defined]
        return None
    address = ctypes.cast(entry, ctypes.c_void_p).value
    return mod.Dispatcher(
        backend, whole_path, core, address, backend.device_type == dtypes.DEVICE_CUDA, backend.device_index
    )


def _teach_frameworks(mod: Any) -> None:
    """numpy.ndarray, cupy.ndarray (and CuPy's current stream) and PyTorch's tensor types, once their modules are
    imported (by the caller: cuplug never imports them); taught again when another module object stands under the
    name (a test's stand-in)."""
    np = sys.modules.get("numpy")
    nd = getattr(np, "ndarray", None)
    if _state.get("numpy") is not np and isinstance(nd, type):
        mod.set_numpy(nd)
        _state["numpy"] = np
    cupy = sys.modules.get("cupy")
    array, current = getattr(cupy, "ndarray", None), getattr(getattr(cupy, "cuda", None), "get_current_stream", None)
    if _state.get("cupy") is not cupy and isinstance(array, type) and callable(current):
        mod.set_cupy(array, current)
        _state["cupy"] = cupy
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None)
    if (
        torch is not None
        and _state.get("torch") is not torch
        and isinstance(tensor, type)
        and hasattr(torch, "strided")
    ):
        from .operands import torch_dtypes, torch_reader

        _state["torch"] = torch
        reader = torch_reader(torch)
        if not reader.native:  # a stand-in without PyTorch's C accessors: the whole path reads it
            return
        param = getattr(getattr(torch, "nn", None), "Parameter", None)
        raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        pairs = tuple((tdt, ROW[d]) for tdt, d in torch_dtypes(torch).items())
        getsets = tuple(
            reader.getsets[n] for n in ("layout", "is_nested", "dtype", "requires_grad", "is_cuda", "is_cpu", "shape")
        )
        methods = tuple(reader.methods[n] for n in ("is_neg", "is_contiguous", "get_device", "data_ptr"))
        mode_on = getattr(torch._C, "_is_torch_function_mode_enabled", None)
        if not callable(mode_on):  # a PyTorch that cannot say: the whole path reads its tensors (modes off there)
            return
        mod.set_torch(
            tensor, param if isinstance(param, type) else tensor, torch.strided, pairs, raw, getsets, methods, mode_on
        )
        mod.set_torch_exchange(torch_exchange_table(torch))


def torch_exchange_table(torch: Any) -> Any:
    """DLPack's C exchange table on PyTorch's tensor type (DLPack >= 1.2; PyTorch >= 2.10), or None: through it the
    dispatcher reads a tensor's pointer, device, dtype, shape and strides, and the current stream, in one C call
    each instead of an accessor per fact (docs/performance.md). Looked up on the type, as DLPack says."""
    tensor = getattr(torch, "Tensor", None)
    for name in ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__"):  # (the early name; a capsule too)
        table = getattr(tensor, name, None)
        if table is not None:
            return table
    return None


def _spec(dt: dtypes.DType, device: tuple[int, int], shape: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
    return (ROW[dt], device[0], device[1], tuple(shape))


def _makers(sig: OpSignature, p: Plan, made_by: str, like: Any) -> tuple[Maker, ...] | None:
    """How the whole path made this call's outputs, as (callable, args, kwargs) per output: ``torch.empty`` on
    ``like``'s device (PyTorch CUDA inputs), ``cupy.empty`` (CuPy inputs: on CuPy's current device; an output on
    another device than the plan's goes back to the whole path), ``np.empty`` / ``torch.empty`` like the caller's
    host array; None where the C path does not make them (backend-owned results, ``array.array``, cuplug's host
    buffers)."""
    torch, np, cupy = sys.modules.get("torch"), sys.modules.get("numpy"), sys.modules.get("cupy")
    specs = p.out_specs
    if made_by == "torch" and torch is not None:
        return _torch_makers(torch, p, {"device": like.device})
    if made_by == "cupy" and cupy is not None:  # CuPy's pool on its current device: C reads the device back
        return tuple((cupy.empty, (s,), {"dtype": dt.name}) for dt, s in specs)
    if made_by != "host" or like is None:
        return None
    if any(o.shape_rule.get("scalar") and not dt.array_code for (dt, _), o in zip(specs, sig.outputs, strict=True)):
        return None  # a float16/bfloat16 scalar: cuplug's own host buffer (_host_result)
    if np is not None and type(like) is getattr(np, "ndarray", ...) and all(dt.format for dt, _ in specs):
        return tuple((np.empty, (s,), {"dtype": dt.name}) for dt, s in specs)
    if torch is not None and type(like) in _torch_types(torch):
        return _torch_makers(torch, p, {})
    return None


def _torch_makers(torch: Any, p: Plan, where: dict[str, Any]) -> tuple[Maker, ...]:
    """``torch.empty`` per output, as the whole path makes them; but an output of an input's dtype and shape is
    made by ``torch.empty_like`` of that input: the same tensor for a contiguous input (the only kind the C path
    reads), for ~0.5 us less a call (VM: 1.43 against 0.83). C checks at each call that the input is a PyTorch
    tensor, and reads what it made as any output (a surprise goes to the whole path)."""
    ins = [(dt, tuple(shape)) for dt, shape, *_ in p.in_specs]
    return tuple(
        (torch.empty_like, ins.index((dt, tuple(s))), None)
        if (dt, tuple(s)) in ins
        else (torch.empty, (s,), {"dtype": getattr(torch, dt.name), **where})
        for dt, s in p.out_specs
    )


def _torch_types(torch: Any) -> tuple[type, ...]:
    found = (getattr(torch, "Tensor", None), getattr(getattr(torch, "nn", None), "Parameter", None))
    return tuple(t for t in found if isinstance(t, type))


def learn(
    run: Any,
    sig: OpSignature,
    p: Plan,
    op: str,
    inputs: tuple[Any, ...],
    out: Any,
    stream: Any,
    given: dict[str, Any],
    made_by: str,
    like: Any,
) -> bool:
    """Hands a call ``Backend.run`` has just made to the dispatcher ``run`` (True when kept). ``given``: the
    attributes as the caller gave them; ``made_by``: who allocated the outputs ("out", "torch", "host",
    "backend", "cupy"), ``like``: what they were made like (the PyTorch input, the caller's host array)."""
    mod = _state.get("module")
    if mod is None or not isinstance(run, mod.Dispatcher):
        return False
    _teach_frameworks(mod)
    how = (made_by, type(like), getattr(like, "device", None) if made_by == "torch" else None)
    facts = p.fast.get(how)
    if facts is None:
        facts = p.fast[how] = _facts(sig, p, made_by, like)
    if not facts:  # outputs the C path does not make
        return False
    return bool(run.learn((op, *inputs), {**given, "out": out, "stream": stream}, facts))


def _facts(sig: OpSignature, p: Plan, made_by: str, like: Any) -> tuple[Any, ...]:
    """What the C dispatcher keeps of a plan (fastcall.c, Dispatcher_learn); () where it cannot repeat it."""
    makers = None
    if made_by != "out":
        makers = _makers(sig, p, made_by, like)
        if makers is None:
            return ()
    in_specs = tuple(_spec(dt, dev, shape) for dt, shape, dev, *_ in p.in_specs)
    out_specs = tuple(_spec(dt, dev, shape) for (dt, shape), dev in zip(p.out_specs, p.out_devices, strict=True))
    slot_of = {name: i for i, (name, _, _) in enumerate(p.attr_values)}
    floats = {name for name, kind, _ in p.attr_values if kind == "float64"}
    rows = tuple((name.encode(), name in floats, value) for name, _, value in p.attr_values)
    named = tuple((n, slot_of[n], n in floats, n in sig.shape_attrs) for n in p.given)
    scalars = tuple(
        bool(o.shape_rule.get("scalar")) and made_by != "out" and (p.host or p.resident) for o in sig.outputs
    )
    return (p.op, sig.elementwise, in_specs, out_specs, rows, named, makers, scalars)
