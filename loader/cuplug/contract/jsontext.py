"""JSON text to Python, through CPython's own C scanner, without importing ``json``.

``json.loads`` is that scanner plus a regular expression that skips white space, and
``import json`` brings ``re`` (8 ms on the 2-core CPU machine, half the import budget
of ``cuplug.explain()``). Here the white space is skipped with ``str.strip``; any
text the scanner does not take whole is handed to ``json.loads``, so every error is
json's own ``JSONDecodeError`` with its message. Without ``_json`` (another Python),
``json.loads`` does it all.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WHITESPACE = " \t\n\r"  # JSON's white space (RFC 8259), the set json.decoder skips


def _constant_as_none(name: str) -> None:
    return None


class _Options:
    """The attributes the C scanner reads from a ``json.JSONDecoder``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    def __init__(self, parse_constant: Callable[[str], Any]) -> None:
        self.parse_constant = parse_constant
        self.memo: dict[str, str] = {}


def loads(text: str, parse_constant: Callable[[str], Any] = _constant_as_none) -> Any:
    """The value of a JSON document; ``parse_constant`` gets NaN/Infinity/-Infinity (default: None)."""
    try:
        import _json

        make_scanner = getattr(_json, "make_scanner", None)
    except ImportError:  # pragma: no cover - CPython always has it
        make_scanner = None
    if make_scanner is not None:
        start = len(text) - len(text.lstrip(_WHITESPACE))
        try:
            value, end = make_scanner(_Options(parse_constant))(text, start)
        except (StopIteration, ValueError) as exc:
            if type(exc) is not StopIteration and not type(exc).__name__ == "JSONDecodeError":
                raise  # parse_constant's own error
        else:
            if not text[end:].strip(_WHITESPACE):
                return value
    import json

    return json.loads(text, parse_constant=parse_constant)
