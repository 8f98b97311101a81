"""A prepared call: what ``Backend.run`` checks and builds once per (op, operand dtypes, shapes and
devices, attributes given), and then only fills with addresses and attribute values on each call.

The signature checks (counts, dtypes, shapes, size rules, the attributes that size a shape), the
output specs, the room check of allocated outputs and the C descriptor arrays are made on the
first call of a key; a later call with the same key writes its operands' addresses and the
values of its other attributes into those arrays, under the instance lock, and calls. Every
operand is still imported and checked on every call (``operands``): what can change between two
calls with one key (an address, an attribute's value, an overlap) is checked each time.

This is the whole path, the one that words every error. Once it has made a call, the C dispatcher
(fastpath.py, loader/fastcall/fastcall.c) repeats that call for the operands it can read itself.
"""

from __future__ import annotations

import ctypes

from ..contract import abi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..contract import dtypes
    from .signature import OpSignature

MAX_PLANS = 512  # per backend instance; a workload with more distinct shapes starts over, it never grows


def _descriptors(specs: list[tuple[dtypes.DType, tuple[int, ...], tuple[int, int]]]) -> tuple[Any, list[Any], Any]:
    """A C array of descriptors for ``specs`` (dtype, shape, device), addresses left 0; its element views
    (each write goes straight into the array) and the shape arrays they point into."""
    array = (abi.CTensor * max(len(specs), 1))()
    shapes = []
    for i, (dt, shape, device, *_) in enumerate(specs):  # a resident operand's spec says so in a 4th item
        extents = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        shapes.append(extents)
        t = array[i]
        t.device_type, t.device_id, t.ndim = device[0], device[1], len(shape)
        t.dtype = abi.CDtype(dt.code, dt.bits, 1)
        t.shape = ctypes.cast(extents, ctypes.POINTER(ctypes.c_int64))
    return array, [array[i] for i in range(len(specs))], shapes


class Plan:
    """One prepared call. ``out_specs``: each output's (dtype, shape); ``host``: a host call; the C side:
    ``c_in``/``c_out`` (descriptors), ``c_attrs`` (defaults and the shape attributes' values filled),
    ``per_call``: (slot, Attr) of the given attributes whose values are written on each call."""

    __slots__ = (
        "_keep",
        "attr_values",
        "c_attrs",
        "c_in",
        "c_op",
        "c_out",
        "fast",
        "given",
        "host",
        "in_items",
        "in_specs",
        "n_attrs",
        "op",
        "out_devices",
        "out_devices_per_call",
        "out_items",
        "out_specs",
        "per_call",
        "resident",
        "tensors",
    )

    def __init__(
        self,
        sig: OpSignature,
        in_specs: list[Any],
        out_specs: list[tuple[dtypes.DType, tuple[int, ...]]],
        out_devices: list[tuple[int, int]],
        attr_values: list[tuple[str, str, int | float]],
        per_call: tuple[str, ...],
        host: bool,
    ) -> None:
        self.op = sig.name.encode()
        self.c_op = ctypes.c_char_p(self.op)  # what call_fast takes as it is
        self.out_specs = out_specs
        self.host = host
        self.in_specs, self.out_devices, self.attr_values = in_specs, out_devices, attr_values  # (fastpath.learn)
        self.c_in, self.in_items, in_shapes = _descriptors(in_specs)
        outs = [(dt, shape, dev) for (dt, shape), dev in zip(out_specs, out_devices, strict=True)]
        self.c_out, self.out_items, out_shapes = _descriptors(outs)
        self.n_attrs = len(attr_values)
        self.c_attrs = (abi.CAttr * max(self.n_attrs, 1))()
        names = [name.encode() for name, _, _ in attr_values]
        slots = {}
        for i, (name, kind, value) in enumerate(attr_values):
            slots[name] = i
            self.c_attrs[i].name = names[i]
            set_attr(self.c_attrs[i], kind, value)
        by_name = {a.name: a for a in sig.attrs}
        self.per_call = tuple((self.c_attrs[slots[n]], by_name[n]) for n in per_call)
        self._keep = (in_shapes, out_shapes, names)
        self.resident = False  # every input a backend-owned Tensor (Backend._plan sets these three)
        self.tensors = False  # any operand a Tensor: its liveness is checked at each call
        self.out_devices_per_call = False
        self.given: tuple[str, ...] = per_call  # the attributes given, in the caller's order (Backend._plan sets it)
        # what fastpath.learn tells the C dispatcher, per way of making outputs (made_by, like's type, its device)
        self.fast: dict[tuple[str, type, Any], tuple[Any, ...]] = {}

    def fill(self, args: list[Any], out_args: list[Any], attrs: dict[str, Any], op: str) -> None:
        """This call's addresses and attribute values (checked: Attr.value_of raises on a bad one)."""
        for item, a in zip(self.in_items, args, strict=False):  # as many as the key's specs
            item.data = a.addr
        if self.out_devices_per_call:  # an allocated output's device, as its backend describes it
            for item, a in zip(self.out_items, out_args, strict=False):
                item.data = a.addr
                item.device_type, item.device_id = a.device
        else:
            for item, a in zip(self.out_items, out_args, strict=False):
                item.data = a.addr
        for slot, attr in self.per_call:  # converted (and checked) once by run(): Attr.value_of
            set_attr(slot, attr.kind, attrs[attr.name])


def set_attr(slot: Any, kind: str, value: int | float) -> None:
    if kind == "int64":
        slot.kind, slot.value.i = abi.ATTR_INT64, value
    else:
        slot.kind, slot.value.f = abi.ATTR_FLOAT64, value
