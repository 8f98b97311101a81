"""A small immutable record: named fields, equality, ``repr``, ``_replace`` and ``_asdict``.

The standard library's ``dataclasses`` and ``typing.NamedTuple`` would do, but importing
them costs 19 and 10 ms on the 2-core CPU machine (``nox -s decision_bench``), more than
the whole decision: every ``cuplug.load()`` would pay it. Subclasses list their fields
in ``__slots__`` (the order of positional arguments), annotate them for type checkers,
and give defaults in ``_defaults``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    R = TypeVar("R", bound="Record")


class Record:
    __slots__: tuple[str, ...] = ()
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields, got {len(args)}")
        values = dict(zip(names, args, strict=False))  # fewer values than fields: the rest by name or default
        for key, value in kwargs.items():
            if key not in names or key in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated field {key!r}")
            values[key] = value
        for name in names:
            if name in values:
                object.__setattr__(self, name, values[name])
            elif name in self._defaults:
                object.__setattr__(self, name, self._defaults[name])
            else:
                raise TypeError(f"{type(self).__name__}: missing field {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; use _replace()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def _replace(self: R, **changes: Any) -> R:
        return type(self)(**{**self._asdict(), **changes})

    def _asdict(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.__slots__}

    def __reduce__(self) -> tuple[Any, ...]:  # pickling (probe_isolated passes results as JSON, tests copy them)
        return (type(self), self._values())
