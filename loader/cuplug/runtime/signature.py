"""Op signatures as data: parsed from a backend's ping JSON ("ops", see backends/common/cuplug_ops.h).

Python checks every call against them before anything reaches C (counts, dtypes,
shapes, attributes, size rules) and derives each output's dtype and shape from
them, so results are allocated here, never guessed.
"""

from __future__ import annotations

from ..contract import dtypes, shapeexpr
from ..contract.errors import InvalidInputError, cut, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

Shape = tuple[int, ...]


def numel(shape: Shape) -> int:
    """The number of elements of ``shape`` (1 for a scalar)."""
    n = 1
    for d in shape:
        n *= d
    return n


class Input:
    __slots__ = ("dtypes", "like", "name", "shape_rule")

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name = str(spec.get("name", "x"))
        like = spec.get("like")
        self.like: int | None = int(like) if like is not None else None
        self.dtypes = tuple(dtypes.BY_NAME[n] for n in spec.get("dtypes", ()) if n in dtypes.BY_NAME)
        self.shape_rule: dict[str, Any] | None = dict(spec["shape"]) if isinstance(spec.get("shape"), dict) else None


class Output:
    __slots__ = ("dtype_rule", "name", "shape_rule")

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name = str(spec.get("name", "out"))
        self.dtype_rule: dict[str, Any] = dict(spec.get("dtype") or {"like": 0})
        self.shape_rule: dict[str, Any] = dict(spec.get("shape") or {"like": 0})


class Attr:
    __slots__ = ("default", "kind", "name")

    def __init__(self, spec: dict[str, Any]) -> None:
        self.name = str(spec["name"])
        self.kind = "int64" if spec.get("kind") == "int64" else "float64"
        default = spec.get("default", 0)
        self.default: int | float = int(default) if self.kind == "int64" else float(default)

    def value_of(self, v: Any, op: str) -> int | float:
        """A caller's value (or the default) as C receives it; a bool, a non-number, a fraction for an int64
        attribute or an int64 out of range raise, naming ``op`` and the attribute."""
        a = self
        if type(v) is float and a.kind == "float64":  # the common cases first: no conversion to judge
            return v
        if type(v) is int and a.kind == "int64" and -(1 << 63) <= v < (1 << 63):
            return v
        try:
            vdt = getattr(v, "dtype", None)
            if isinstance(v, (bool, str, bytes)) or getattr(vdt, "kind", "") == "b" or str(vdt) == "torch.bool":
                raise TypeError  # a bool (Python's, NumPy's, a 0-d tensor's) is not a number here
            fv = float(v)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInputError(f"{op}: attribute {a.name} must be a number, got {shown(v)}") from None
        except Exception as exc:  # a value whose conversion breaks: named, its exception the cause
            raise InvalidInputError(
                f"{op}: attribute {a.name} must be a number, got {shown(v)} (reading it raised {type(exc).__name__})"
            ) from exc
        if a.kind == "float64":
            return fv
        try:
            iv = v.__index__() if hasattr(v, "__index__") else None
        except TypeError:  # e.g. a 0-d float tensor: judged by its value below
            iv = None
        except Exception as exc:
            raise InvalidInputError(
                f"{op}: attribute {a.name} is an integer, got {shown(v)} (reading it raised {type(exc).__name__})"
            ) from exc
        if iv is not None and not isinstance(iv, int):  # __index__ must give an int; a lying one is refused
            raise InvalidInputError(f"{op}: attribute {a.name}: {shown(v)}.__index__() gave no integer")
        if iv is None:
            if not fv.is_integer():
                raise InvalidInputError(f"{op}: attribute {a.name} is an integer, got {shown(v)}")
            iv = int(fv)
        if v is a.default and iv == 1 << 63:  # an INT64_MAX default written as a double
            iv = (1 << 63) - 1
        if not -(1 << 63) <= iv < (1 << 63):
            raise InvalidInputError(f"{op}: attribute {a.name}={iv} does not fit in int64")
        return iv


class SizeRule:
    __slots__ = ("input", "max", "min", "multiple_of")

    def __init__(self, spec: dict[str, Any]) -> None:
        self.input = int(spec.get("input", 0))
        self.multiple_of = int(spec.get("multiple_of") or 0)
        self.min = int(spec.get("min") or 0)
        self.max = int(spec.get("max") or 0)

    def __str__(self) -> str:
        parts = []
        if self.multiple_of:
            parts.append(f"a multiple of {self.multiple_of}")
        if self.min:
            parts.append(f"at least {self.min}")
        if self.max:
            parts.append(f"at most {self.max}")
        return " and ".join(parts)


class OpSignature:
    """One op: ``inputs``, ``outputs``, ``attrs``, ``size_rules``, ``elementwise``, ``sample_n``."""

    def __init__(self, name: str, spec: dict[str, Any]) -> None:
        self.name = name
        self.inputs = [Input(s) for s in spec.get("inputs", ())]
        self.outputs = [Output(s) for s in spec.get("outputs", ())]
        self.attrs = [Attr(s) for s in spec.get("attrs", ())]
        self.size_rules = [SizeRule(s) for s in spec.get("size_rules", ())]
        self.elementwise = bool(spec.get("elementwise", False))
        self.sample_n = int(spec.get("sample_n") or 1024)
        for i, inp in enumerate(self.inputs):  # "like" inputs take their model's dtypes
            if inp.like is not None and not inp.dtypes and 0 <= inp.like < i:
                inp.dtypes = self.inputs[inp.like].dtypes
        self._validate()
        # What a prepared call (plan.Plan) needs: the messages' operand names, the attributes by name,
        # and those that size a shape (their values key a plan: the shapes they give are checked once).
        self.input_labels = [f"{name}: {i.name}" for i in self.inputs]
        self.output_labels = [f"{name}: out {o.name}" for o in self.outputs]
        self.attr_by_name = {a.name: a for a in self.attrs}
        rules = [o.shape_rule for o in self.outputs] + [i.shape_rule for i in self.inputs if i.shape_rule]
        named = {r["attr"] for r in rules if "attr" in r and not r.get("scalar")}
        self.shape_attrs = frozenset(named.union(*(shapeexpr.attributes(r["terms"]) for r in rules if "expr" in r)))

    def _validate(self) -> None:
        """Every index and name a rule uses exists, once, at load: a backend whose table points at an input,
        attribute or dtype that is not there is refused with this reason instead of failing every call."""
        n_in = len(self.inputs)
        attrs = [a.name for a in self.attrs]
        if len(set(attrs)) != len(attrs):
            raise ValueError(f"attribute names repeat: {attrs}")
        for a in self.attrs:
            if a.default != a.default or a.default in (float("inf"), float("-inf")):
                raise ValueError(f"attribute {a.name} has the default {a.default}, not a finite number")

        def index(value: object, what: str, below: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < below:
                raise ValueError(f"{what} names input {value!r}; the op has {n_in} input(s)")

        def shape(rule: dict[str, Any], what: str, known: int) -> None:
            if rule.get("scalar"):
                return
            if "expr" in rule:  # parsed once here: the terms are what _rule_shape evaluates
                try:
                    rule["terms"] = shapeexpr.parse(rule["expr"], [i.name for i in self.inputs[:known]], attrs)
                except ValueError as exc:
                    raise ValueError(f"{what}: {exc}") from None
                return
            if "attr" in rule and rule["attr"] not in attrs:
                raise ValueError(f"{what} is sized by attribute {rule['attr']!r}, which the op does not declare")
            if "blocks_of" in rule:
                index(rule["blocks_of"], what, n_in)
                if "attr" not in rule:
                    raise ValueError(f"{what} counts blocks of input {rule['blocks_of']} but names no attribute")
            elif "attr" not in rule:
                index(rule.get("like", 0), what, n_in)

        for i, inp in enumerate(self.inputs):
            if inp.like is not None:
                index(inp.like, f"input {inp.name} (like)", i)  # an earlier input: the model is checked first
            if inp.shape_rule is not None:
                shape(inp.shape_rule, f"input {inp.name}'s shape", i)
        for o in self.outputs:
            dr = o.dtype_rule
            if "fixed" in dr:
                if dr["fixed"] not in dtypes.BY_NAME:
                    raise ValueError(f"output {o.name} has the dtype {dr['fixed']!r}, which this cuplug does not know")
            else:
                index(dr.get("accum_of", dr.get("like", 0)), f"output {o.name}'s dtype", n_in)
            shape(o.shape_rule, f"output {o.name}'s shape", n_in)
        for rule in self.size_rules:
            index(rule.input, "a size rule", n_in)
            if min(rule.multiple_of, rule.min, rule.max) < 0:
                raise ValueError(f"a size rule of input {rule.input} has a negative bound ({rule})")

    def __repr__(self) -> str:
        def shaped(name: str, rule: dict[str, Any] | None) -> str:
            return f"{name}[{rule['expr']}]" if rule and "expr" in rule else name

        ins = ", ".join(f"{shaped(i.name, i.shape_rule)}: {'|'.join(d.name for d in i.dtypes)}" for i in self.inputs)
        outs = ", ".join(shaped(o.name, o.shape_rule) for o in self.outputs)
        attrs = "".join(f", {a.name}={a.default!r}" for a in self.attrs)
        return f"{self.name}({ins}{attrs}) -> ({outs})"

    # ---- checks, before anything reaches C
    def check_inputs(
        self, specs: list[tuple[dtypes.DType, Shape]], attrs: list[tuple[str, str, int | float]] | None = None
    ) -> None:
        """``specs``: (dtype, shape) per input; ``attrs`` from attr_values() (defaults if None).
        Raises InvalidInputError naming the op and the operand."""
        if len(specs) != len(self.inputs):
            names = ", ".join(i.name for i in self.inputs)
            raise InvalidInputError(f"{self.name} takes {len(self.inputs)} input(s) ({names}), got {len(specs)}")
        for i, (inp, (dt, shape)) in enumerate(zip(self.inputs, specs, strict=True)):
            if inp.like is not None and 0 <= inp.like < len(specs):
                model = self.inputs[inp.like]
                mdt, mshape = specs[inp.like]
                if dt is not mdt or shape != mshape:
                    what = "lengths differ" if numel(shape) != numel(mshape) else "dtypes or shapes differ"
                    raise InvalidInputError(
                        f"{self.name}: {inp.name} must match {model.name} in dtype and shape ({what}): "
                        f"{inp.name} is {dt.name}{list(shape)}, {model.name} is {mdt.name}{list(mshape)}"
                    )
            elif dt not in inp.dtypes:
                allowed = ", ".join(d.name for d in inp.dtypes) or "no dtype this cuplug knows"
                raise InvalidInputError(f"{self.name}: {inp.name} (input {i}) is {dt.name}; it takes {allowed}")
        values = {name: value for name, _, value in (attrs if attrs is not None else self.attr_values({}))}
        for i, inp in enumerate(self.inputs):
            if inp.shape_rule is not None:
                want = self._rule_shape(inp.shape_rule, specs, values)
                if specs[i][1] != want:
                    raise InvalidInputError(
                        f"{self.name}: {inp.name} has shape {list(specs[i][1])}; it must be {list(want)}"
                    )
        for rule in self.size_rules:  # rule.input is an input of the op (_validate)
            n = numel(specs[rule.input][1])
            name = self.inputs[rule.input].name
            if (
                (rule.multiple_of and n % rule.multiple_of)
                or (rule.min and n < rule.min)
                or (rule.max and n > rule.max)
            ):
                raise InvalidInputError(f"{self.name}: {name} has {n} elements; it must have {rule}")

    def attr_values(self, given: dict[str, Any]) -> list[tuple[str, str, int | float]]:
        """(name, kind, value) per declared attribute, defaults filled; unknown or ill-typed ones raise."""
        known = {a.name for a in self.attrs}
        unknown = sorted(set(given) - known)
        if unknown:
            listed = ", ".join(sorted(known)) or "none"
            raise InvalidInputError(
                f"{self.name}: unknown attribute(s) {', '.join(cut(u) for u in unknown)}; it takes {listed}"
            )
        return [(a.name, a.kind, a.value_of(given.get(a.name, a.default), self.name)) for a in self.attrs]

    def output_specs(
        self, specs: list[tuple[dtypes.DType, Shape]], attrs: list[tuple[str, str, int | float]]
    ) -> list[tuple[dtypes.DType, Shape]]:
        """Each output's (dtype, shape) from its rules."""
        values = {name: value for name, _, value in attrs}
        result = []
        for out in self.outputs:
            dr, sr = out.dtype_rule, out.shape_rule
            if "fixed" in dr:
                dt = dtypes.BY_NAME[dr["fixed"]]
            else:
                src = specs[int(dr.get("accum_of", dr.get("like", 0)))][0]
                dt = dtypes.BY_NAME["int64"] if "accum_of" in dr and not src.is_float else src
            result.append((dt, self._rule_shape(sr, specs, values)))
        return result

    def _rule_shape(
        self, rule: dict[str, Any], specs: list[tuple[dtypes.DType, Shape]], values: dict[str, Any]
    ) -> Shape:
        """The shape a rule gives: like input k, a scalar, ceil(numel(k) / attr), attr elements, or an expression
        of the inputs' dimensions, literals and attributes (contract/shapeexpr.py)."""
        if rule.get("scalar"):
            return ()
        if "terms" in rule:
            got = shapeexpr.evaluate(rule["terms"], [sp[1] for sp in specs], values, [i.name for i in self.inputs])
            if isinstance(got, str):
                raise InvalidInputError(f"{self.name}: shape {rule['expr']!r}: {got}")
            return got
        if "blocks_of" not in rule and "attr" not in rule:
            return specs[int(rule.get("like", 0))][1]
        name = str(rule.get("attr"))
        v = values[name]  # declared: _validate() refused a table naming an attribute it lacks
        if isinstance(v, float) and not v.is_integer():  # a float64 attribute sizing a shape: nan, inf, 2.5
            raise InvalidInputError(
                f"{self.name}: attribute {name} sizes a shape, so it must be a whole number, got {v}"
            )
        n = int(v)
        if "blocks_of" in rule:
            if n <= 0:
                raise InvalidInputError(f"{self.name}: attribute {name} must be > 0, got {n}")
            return (-(-numel(specs[int(rule["blocks_of"])][1]) // n),)
        if n < 0:
            raise InvalidInputError(f"{self.name}: attribute {name} must be >= 0, got {n}")
        return (n,)

    def sample_dtype(self, index: int) -> dtypes.DType:
        """The dtype a sample input uses: float32 where allowed, else the first allowed."""
        allowed = self.inputs[index].dtypes
        return dtypes.BY_NAME["float32"] if dtypes.BY_NAME["float32"] in allowed else allowed[0]


def parse(ops: object) -> dict[str, OpSignature]:
    """The "ops" object of a ping; raises ValueError on a malformed one (the loader turns that into a reason)."""
    if not isinstance(ops, dict):
        raise ValueError(f"'ops' must be an object, got {type(ops).__name__}")
    result = {}
    for name, spec in ops.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("inputs", []), list):
            raise ValueError(f"op {name!r}: malformed signature")
        try:
            result[str(name)] = OpSignature(str(name), spec)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"op {name!r}: malformed signature ({exc})") from exc
    return result
