"""A backend's ops as PyTorch operators, generated from its op signatures (``torch.library``).

``cuplug.torch.register(backend, "mylib")`` defines, for every op of ``backend``,
``torch.ops.mylib.<op>`` (results allocated by PyTorch) and ``torch.ops.mylib.<op>.out`` (results
written into the caller's keyword ``out`` tensors, declared mutated; it returns nothing, as PyTorch asks
of a custom op that writes its arguments), with

- a schema from the op table: one ``Tensor`` per input, ``int``/``float`` attributes with their
  defaults, one ``Tensor`` per output;
- the kernel for the backend's device (``CPU`` or ``CUDA``): outputs from ``torch.empty`` on the
  input's device, the call on PyTorch's current stream (so it orders with the caller's work and
  can be captured in a CUDA graph);
- a fake (meta) kernel computed from the shape rules, so ``torch.compile`` traces through the op
  without running it, dynamic shapes included.

PyTorch stays optional: this module imports it when ``register`` is called, never before, and
nothing else in cuplug imports this module.
"""

from __future__ import annotations

import keyword

from ..contract import dtypes
from ..contract.errors import ConfigError, InvalidInputError
from ..runtime.operands import torch_dtypes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..runtime.api import Backend
    from ..runtime.signature import OpSignature

# namespace -> (torch.library.Library, {op name: the dispatch keys implemented}); a Library must stay alive
# for its definitions to stay registered.
_LIBRARIES: dict[str, tuple[Any, dict[str, set[str]]]] = {}


def _name(text: str, what: str, sig: OpSignature) -> str:
    if not text.isidentifier() or keyword.iskeyword(text) or text in ("self", "out"):
        raise ConfigError(f"cuplug.torch: op {sig.name!r}: its {what} {text!r} cannot be a PyTorch schema name")
    return text


def _attr_default(kind: str, value: int | float) -> str:
    if kind == "int64":
        return str(int(value))
    text = repr(float(value))
    return text if text not in ("inf", "-inf", "nan") else "0.0"  # _validate() keeps defaults finite


def output_names(sig: OpSignature) -> list[str]:
    """The out= variant's argument names: ``out`` for one output, else ``out_<name>`` per output."""
    if len(sig.outputs) == 1:
        return ["out"]
    return [f"out_{_name(o.name, 'output', sig)}" for o in sig.outputs]


def schemas(sig: OpSignature) -> tuple[str, str]:
    """The functional and the out= schema of ``sig``, e.g. ``add(Tensor x, Tensor y) -> Tensor`` and
    ``add.out(Tensor x, Tensor y, *, Tensor(a!) out) -> Tensor(a!)``."""
    params = [f"Tensor {_name(i.name, 'input', sig)}" for i in sig.inputs]
    params += [
        f"{'int' if a.kind == 'int64' else 'float'} {_name(a.name, 'attribute', sig)}={_attr_default(a.kind, a.default)}"
        for a in sig.attrs
    ]
    n_out = len(sig.outputs)
    returns = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    aliases = [f"{chr(ord('a') + k)}!" for k in range(n_out)]
    outs = [f"Tensor({alias}) {name}" for alias, name in zip(aliases, output_names(sig), strict=True)]
    functional = f"{sig.name}({', '.join(params)}) -> {returns}"
    # returns nothing: a custom op's outputs may not alias its inputs (functionalization, torch.compile)
    out_variant = f"{sig.name}.out({', '.join(params)}, *, {', '.join(outs)}) -> ()"
    return functional, out_variant


def register(backend: Backend, namespace: str = "cuplug") -> Any:
    """Defines every op of ``backend`` as ``torch.ops.<namespace>.<op>`` (and ``.out``); returns
    ``torch.ops.<namespace>``. A second backend of the other device (a CPU twin beside a CUDA variant) adds its
    kernels to the same ops; two backends for one device in one namespace are refused (ConfigError)."""
    import torch

    if not namespace.isidentifier():
        raise ConfigError(f"cuplug.torch.register: namespace {namespace!r} is not an identifier")
    key = "CUDA" if backend.device_type == dtypes.DEVICE_CUDA else "CPU"
    lib, done = _LIBRARIES.get(namespace) or (torch.library.Library(namespace, "FRAGMENT"), {})
    _LIBRARIES[namespace] = (lib, done)
    for name, sig in backend.ops.items():
        keys = done.get(name)
        if keys is None:
            functional, out_variant = schemas(sig)
            lib.define(functional)
            lib.define(out_variant)
            torch.library.register_fake(f"{namespace}::{name}", _fake(backend, sig, torch), lib=lib)
            torch.library.register_fake(f"{namespace}::{name}.out", _fake_out(sig), lib=lib)
            keys = done[name] = set()
        if key in keys:
            raise ConfigError(
                f"cuplug.torch.register: {namespace}::{name} already has a {key} kernel (from another backend); "
                "register this backend under another namespace"
            )
        lib.impl(name, _kernel(backend, sig, torch), key)
        lib.impl(f"{name}.out", _kernel_out(backend, sig, torch), key)
        keys.add(key)
    return getattr(torch.ops, namespace)


# ---- kernels


def _split(sig: OpSignature, args: tuple) -> tuple[tuple, dict[str, Any]]:
    n = len(sig.inputs)
    return args[:n], {a.name: v for a, v in zip(sig.attrs, args[n:], strict=False)}


def _specs(tensors: tuple, torch: Any) -> list[tuple[dtypes.DType, tuple]]:
    known = torch_dtypes(torch)
    specs = []
    for t in tensors:
        dt = known.get(t.dtype)
        if dt is None:
            raise InvalidInputError(
                f"PyTorch dtype {t.dtype} is not a dtype cuplug knows ({', '.join(dtypes.BY_NAME)})"
            )
        specs.append((dt, tuple(t.shape)))
    return specs


def _outputs(sig: OpSignature, tensors: tuple, attrs: dict[str, Any], torch: Any, device: Any) -> list[Any]:
    specs = _specs(tensors, torch)
    values = sig.attr_values(attrs)
    sig.check_inputs(specs, values)
    return [
        torch.empty(shape, dtype=getattr(torch, dt.name), device=device)
        for dt, shape in sig.output_specs(specs, values)
    ]


def _device(backend: Backend, tensors: tuple, torch: Any) -> Any:
    if tensors:
        return tensors[0].device
    return torch.device("cuda", backend.device_index) if backend.device_type == dtypes.DEVICE_CUDA else "cpu"


def _call(backend: Backend, sig: OpSignature, tensors: tuple, attrs: dict[str, Any], outs: list[Any], torch: Any):
    stream = None
    if backend.device_type == dtypes.DEVICE_CUDA:  # PyTorch's current stream: a graph capture's too
        stream = torch.cuda.current_stream(backend.device_index).cuda_stream
    backend.run(sig.name, *tensors, out=outs[0] if len(outs) == 1 else tuple(outs), stream=stream, **attrs)


def _kernel(backend: Backend, sig: OpSignature, torch: Any) -> Any:
    cuda = backend.device_type == dtypes.DEVICE_CUDA

    def kernel(*args: Any) -> Any:
        tensors, attrs = _split(sig, args)
        if cuda and tensors:  # run() itself: torch.empty results on PyTorch's current stream, the C dispatcher's
            return backend.run(sig.name, *tensors, **attrs)  # path once learned (a Python number never: device)
        outs = _outputs(sig, tensors, attrs, torch, _device(backend, tensors, torch))
        _call(backend, sig, tensors, attrs, outs, torch)  # host ops: tensors even for a scalar result
        return outs[0] if len(outs) == 1 else tuple(outs)

    return kernel


def _kernel_out(backend: Backend, sig: OpSignature, torch: Any) -> Any:
    names = output_names(sig)
    cuda = backend.device_type == dtypes.DEVICE_CUDA

    def kernel(*args: Any, **kwargs: Any) -> None:
        tensors, attrs = _split(sig, args)
        outs = [kwargs[n] for n in names]
        if cuda:  # run() launches on PyTorch's current stream when no stream is named
            backend.run(sig.name, *tensors, out=outs[0] if len(outs) == 1 else tuple(outs), **attrs)
        else:
            _call(backend, sig, tensors, attrs, outs, torch)

    return kernel


def _fake(backend: Backend, sig: OpSignature, torch: Any) -> Any:
    def fake(*args: Any) -> Any:
        tensors, attrs = _split(sig, args)
        outs = _outputs(sig, tensors, attrs, torch, _device(backend, tensors, torch))
        return outs[0] if len(outs) == 1 else tuple(outs)

    return fake


def _fake_out(sig: OpSignature) -> Any:
    def fake(*args: Any, **kwargs: Any) -> None:  # writes its out= tensors: nothing to make
        return None

    return fake
