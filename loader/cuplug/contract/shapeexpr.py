"""Shape expressions of an op table: an operand's shape said from its inputs' dimensions, literals and attributes.

The same grammar is read by C (``cuplug_shape_expr`` in backends/common/cuplug_signature.h) and here, so a
call is checked alike on both sides; ``b.ops`` shows the text as the author wrote it.

    expr  := ""  |  term ("," term)*          "" (or "()") is a scalar: no dimensions
    term  := INT                              a literal extent, e.g. 4
           | NAME                             an int64 attribute's value (>= 0), e.g. bins
           | NAME "[" INT "]"                 dimension INT of input NAME (negative: from the end), e.g. x[-1]
           | NAME "[" [INT] ":" [INT] "]"     a run of input NAME's dimensions, as Python slices them, e.g. x[:-1]

Examples: LayerNorm's mean and rstd ``"x[:-1]"`` (``(B, T)`` of ``(B, T, C)``), its weight ``"x[-1]"``, a
histogram ``"bins"``, a fixed-size table ``"256"``, a transposed pair ``"a[1], a[0]"``. A NAME is an input when
the op has an input of that name (an earlier one, for an input's own shape), else an attribute.
"""

from __future__ import annotations

MAX_NDIM = 32


class Term:
    """One term: ``kind`` "lit" (``value``), "attr" (``name``), "dim" (``input``, ``index``) or "dims"
    (``input``, ``start``, ``stop``: None for an open end)."""

    __slots__ = ("index", "input", "kind", "name", "start", "stop", "value")

    kind: str
    value: int | None  # "lit"
    name: str | None  # "attr"
    input: int | None  # "dim", "dims": the input's position
    index: int | None  # "dim"
    start: int | None  # "dims"
    stop: int | None  # "dims"

    def __init__(self, kind: str, **fields: object) -> None:
        self.kind = kind
        self.value = self.name = self.input = self.index = self.start = self.stop = None
        for key, value in fields.items():
            setattr(self, key, value)


def _int(text: str, expr: str) -> int:
    digits = text[1:] if text.startswith("-") else text
    if not digits.isdigit() or not digits.isascii() or len(digits) > 18:
        raise ValueError(f"shape expression {expr!r}: {text!r} is not an integer")
    return int(text)


def parse(expr: str, inputs: list[str], attrs: list[str]) -> list[Term]:
    """The terms of ``expr``; ``inputs``: the names of the inputs it may read (in order), ``attrs``: the op's
    attribute names. ValueError names what is wrong (the loader refuses such a table)."""
    if not isinstance(expr, str):
        raise ValueError(f"shape expression {expr!r} is not a string")
    text = expr.replace(" ", "")
    if text in ("", "()"):
        return []
    terms: list[Term] = []
    for part in _split(text, expr):
        name, bracket, rest = part.partition("[")
        if not name.isidentifier():
            if bracket or not part.lstrip("-").isdigit():
                raise ValueError(f"shape expression {expr!r}: {part!r} is neither a name nor an integer")
            value = _int(part, expr)
            if value < 0:
                raise ValueError(f"shape expression {expr!r}: the extent {value} is negative")
            terms.append(Term("lit", value=value))
            continue
        if not bracket:
            if name in inputs:
                raise ValueError(f"shape expression {expr!r}: input {name} needs a dimension, e.g. {name}[0]")
            if name not in attrs:
                raise ValueError(f"shape expression {expr!r}: {name} is neither an input before it nor an attribute")
            terms.append(Term("attr", name=name))
            continue
        if name not in inputs:
            raise ValueError(f"shape expression {expr!r}: {name}[...] names no input before it ({', '.join(inputs)})")
        if not rest.endswith("]") or "[" in rest or "]" in rest[:-1]:
            raise ValueError(f"shape expression {expr!r}: {part!r} is not NAME[i] or NAME[a:b]")
        inner, k = rest[:-1], inputs.index(name)
        if ":" in inner:
            a, _, b = inner.partition(":")
            terms.append(Term("dims", input=k, start=_int(a, expr) if a else None, stop=_int(b, expr) if b else None))
        else:
            terms.append(Term("dim", input=k, index=_int(inner, expr)))
    return terms


def _split(text: str, expr: str) -> list[str]:
    parts = text[1:-1] if text.startswith("(") and text.endswith(")") else text
    items = parts.split(",")
    if parts.endswith(","):  # "(n,)": Python's one-tuple
        items = items[:-1]
    if any(not p for p in items):
        raise ValueError(f"shape expression {expr!r}: an empty term")
    return items


def attributes(terms: list[Term]) -> set[str]:
    """The attributes whose values the shape depends on (they key a prepared call)."""
    return {t.name for t in terms if t.kind == "attr" and t.name is not None}


def evaluate(
    terms: list[Term], shapes: list[tuple[int, ...]], values: dict[str, int | float], names: list[str]
) -> tuple[int, ...] | str:
    """The shape, or a message of what does not fit (the caller words the error): ``shapes`` of the inputs,
    ``values`` of the attributes, ``names`` of the inputs."""
    out: list[int] = []
    for t in terms:
        if t.kind == "lit":
            assert t.value is not None  # parse() sets each kind's fields
            out.append(t.value)
        elif t.kind == "attr":
            assert t.name is not None
            v = values[t.name]
            if isinstance(v, float) and not v.is_integer():
                return f"attribute {t.name} sizes a shape, so it must be a whole number, got {v}"
            if int(v) < 0:
                return f"attribute {t.name} sizes a shape, so it must be >= 0, got {int(v)}"
            out.append(int(v))
        else:
            assert t.input is not None
            shape = shapes[t.input]
            if t.kind == "dim":
                assert t.index is not None
                if not -len(shape) <= t.index < len(shape):
                    return f"{names[t.input]} has {len(shape)} dimension(s), so it has no dimension {t.index}"
                out.append(shape[t.index])
            else:
                out.extend(shape[t.start : t.stop])
    if len(out) > MAX_NDIM:
        return f"the shape would have {len(out)} dimensions; cuplug takes at most {MAX_NDIM}"
    return tuple(out)
