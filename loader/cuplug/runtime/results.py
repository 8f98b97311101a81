"""What a call returns: outputs from the caller's allocator (PyTorch, CuPy), host results of the caller's kind,
scalar results as Python numbers; and the rule that an ``out=`` array may not overlap another operand."""

from __future__ import annotations

import os
import sys

from ..contract import dtypes
from ..contract.errors import InvalidInputError
from . import operands, signature
from .operands import root as producer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .operands import Arg


def framework_empty(inputs: tuple[Any, ...], out_specs: list[Any]) -> tuple[list[Any], str, Any] | None:
    """Device outputs from the allocator of the first device input's framework: ``torch.empty`` on its device
    (PyTorch's caching allocator, stream-ordered on the current stream), ``cupy.empty`` (CuPy's pool); None
    for any other producer (the backend's own memory then). With the framework's name and that input."""
    for x in inputs:
        root = producer(x)
        mod = sys.modules.get(root)
        if mod is None:
            continue
        # (isinstance against a class mypy cannot see narrows x to object: union-attr below is that)
        if root == "torch" and isinstance(x, getattr(mod, "Tensor", ())) and x.is_cuda:  # type: ignore[union-attr]
            return [mod.empty(shape, dtype=getattr(mod, dt.name), device=x.device) for dt, shape in out_specs], root, x  # type: ignore[union-attr]
        if root == "cupy" and isinstance(x, getattr(mod, "ndarray", ())) and all(dt.typestr for dt, _ in out_specs):
            with mod.cuda.Device(x.device.id):  # type: ignore[union-attr]
                return [mod.empty(shape, dtype=dt.name) for dt, shape in out_specs], root, x
    return None


def host_bytes() -> int:
    """The machine's physical memory: no host result cuplug allocates can be larger."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return operands.ADDRESS_END


def refuse_overlap(sig: signature.OpSignature, args: list[Arg], out_args: list[Arg]) -> None:
    """An out= array may not share memory with an input or another output: the op would read what it has
    already written. The one exception: an elementwise op writing exactly over an input of its own dtype
    and shape (in place, element i read before it is written), as ``run("add", x, y, out=x)``."""
    for k, o in enumerate(out_args):
        lo, hi = o.addr, o.addr + o.nbytes
        if lo == hi:
            continue
        for j, a in enumerate((*args, *out_args)):
            if j == len(args) + k or not a.nbytes or a.addr >= hi or lo >= a.addr + a.nbytes:
                continue
            is_input = j < len(args)
            if (
                is_input
                and sig.elementwise
                and (a.addr, a.nbytes, a.dtype, a.shape) == (lo, o.nbytes, o.dtype, o.shape)
            ):
                continue
            if is_input:
                label = sig.inputs[j].name if j < len(sig.inputs) else str(j)
            else:
                label = sig.outputs[j - len(args)].name
            kind = "input" if is_input else "output"
            how = "partly overlaps" if (a.addr, a.nbytes) != (lo, o.nbytes) else "is the same memory as"
            why = (
                " (only an elementwise op may write exactly over one of its inputs)"
                if is_input and not sig.elementwise
                else ""
            )
            raise InvalidInputError(
                f"{sig.name}: out {sig.outputs[k].name} {how} {kind} {label}{why}; pass an out= array of its own memory"
            )


class HostKind:
    """What a host result is made like: the caller's framework and dtype, never the caller's array
    (a resident tensor made from a host array must not keep that array alive)."""

    __slots__ = ("dtype", "root")

    def __init__(self, root: str, dtype: Any) -> None:
        self.root, self.dtype = root, dtype

    @staticmethod
    def of(obj: Any) -> HostKind | None:
        if obj is None or isinstance(obj, HostKind):
            return obj
        return HostKind(producer(obj), getattr(obj, "dtype", None))


def new_host(template: Any, dt: dtypes.DType, shape: tuple[int, ...]) -> Any:
    """A host output of the caller's kind, its shape and dtype kept: NumPy for NumPy (a bfloat16 one where the
    caller's bfloat16 is NumPy's, ml_dtypes), PyTorch for PyTorch, ``array.array`` for ``array.array`` when the
    result is 1-D (or 0-d) of a type it holds; cuplug's own ``HostTensor`` otherwise (a producer of DLPack alone,
    a resident tensor's download, an N-D result of 1-D arrays), which exports DLPack, ``__array_interface__``
    and the buffer protocol."""
    from .hostbuf import HostTensor

    kind = HostKind.of(template)
    root = kind.root if kind is not None else ""
    if root == "torch" and "torch" in sys.modules:
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, dt.name))
    np = sys.modules.get("numpy")
    if root == "numpy" and np is not None:
        if dt.name != "bfloat16":
            return np.empty(shape, dtype=dt.name)
        tdt = kind.dtype if kind is not None else None  # a framework's bfloat16 (ml_dtypes) makes the array
        if getattr(tdt, "name", "") == "bfloat16" and not isinstance(tdt, dtypes.DType):
            return np.empty(shape, dtype=tdt)
        return HostTensor(dt, shape)
    if root == "array" and dt.array_code and len(shape) <= 1:
        import array  # here: importing it costs 2.8 ms (it registers with collections.abc), load() needs none

        return array.array(dt.array_code, bytes(dt.itemsize * signature.numel(shape)))
    return HostTensor(dt, shape)


def host_result(template: Any, dt: dtypes.DType, shape: tuple[int, ...], scalar: bool) -> Any:
    """A host output; a scalar one of a dtype array.array lacks (float16, bfloat16) in cuplug's own host
    memory, so ``run("sum", x)`` answers a Python number without NumPy."""
    if scalar and not dt.array_code:
        from .hostbuf import HostTensor

        return HostTensor(dt, shape)
    return new_host(template, dt, shape)


def scalar(result: Any) -> Any:
    """The one element of a host or resident scalar result, as a Python number (a resident one is read and freed
    through cuplug's own host memory: float16/bfloat16 need no NumPy)."""
    from .hostbuf import HostBuffer

    if hasattr(result, "to_host") and hasattr(result, "free"):  # a resident Tensor (tensor.py imports this module)
        host = HostBuffer(result.dtype, result.shape)
        result.to_host(out=host)
        result.free()
        result = host
    if isinstance(result, HostBuffer):
        value = result.values()[0]
        return value if result.dtype.is_float else int(value)
    return result.item() if hasattr(result, "item") else result[0]  # NumPy/PyTorch, or a 0-d array.array
