"""The wheel file format's small facts: file names (PEP 427, with PEP 825's variant label) and RECORD lines."""

from __future__ import annotations

import base64
import hashlib


def split_label(filename: str) -> tuple[str, str | None]:
    """(the wheel file name without its variant label, the label or None), per PEP 825's grammar.

    5 dash-separated fields: no label; 7: build tag and label; 6: a label when the third field
    (then the Python tag) does not start with a digit, else a build tag.
    """
    if not filename.endswith(".whl"):
        return filename, None
    parts = filename[: -len(".whl")].split("-")
    if len(parts) == 7 or (len(parts) == 6 and not parts[2][:1].isdigit()):
        return "-".join(parts[:-1]) + ".whl", parts[-1]
    return filename, None


def wheel_tags(name: str) -> tuple[str, str, list[str]]:
    """(python tag, abi tag, platform tags) from a wheel file name (a PEP 825 variant label ignored)."""
    parts = split_label(name)[0][: -len(".whl")].split("-")
    return parts[-3], parts[-2], parts[-1].split(".")


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"
