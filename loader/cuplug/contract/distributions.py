"""Installed distributions, read from their ``*.dist-info`` without ``importlib.metadata``.

What a wheel installer leaves (PyPA's "Recording installed projects": METADATA, RECORD,
entry_points.txt), read lazily and bounded, never raising: the runtime's trust rule
(``runtime.discovery``), ``cuplug doctor``'s variant report and the build kit's
``new-backend`` clash check all see the same distributions. ``importlib.metadata``
would do, but costs 13 ms to import on the 2-core CPU machine, on every ``cuplug.load()``.

Distributions are looked up in the directory the running cuplug is installed in, then
in the sys.path entries in order (the first of a name wins, as for
``importlib.metadata``), except the implicit ``sys.path[0]`` (the running script's
directory or the working directory), so a folder or a dist-info planted beside a
script cannot stand in for an installed package.
"""

from __future__ import annotations

import os
import sys

from . import manifest
from .manifest import ManifestError
from .record import Record

OWN_DISTRIBUTION = "cuplug"
MAX_DIRECTORY_ENTRIES = 100_000
# The site directory cuplug itself runs from: <site>/cuplug/contract/distributions.py.
OWN_SITE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def normalize(name: str) -> str:
    """PEP 503 name normalization, with '_' (the dist-info spelling): 'Cuplug-CUDA13' -> 'cuplug_cuda13'."""
    name = name.lower().replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name


class EntryPoint(Record):
    __slots__ = ("name", "value")
    name: str
    value: str


class Distribution:
    """One ``*.dist-info`` directory; its files are read lazily, bounded, and never raise."""

    def __init__(self, name: str, dist_info: str) -> None:
        self.name = name  # normalized
        self.dist_info = dist_info
        self.site = os.path.dirname(dist_info)
        self._entry_points: dict[str, list[EntryPoint]] | None = None
        self._entry_points_text = ""
        self._record: dict[str, tuple[str, str]] | None = None
        self.record_error: str | None = None

    def __repr__(self) -> str:
        return f"<Distribution {self.name} at {self.dist_info}>"

    @property
    def dist_info_name(self) -> str:
        return os.path.basename(self.dist_info)

    def _text(self, member: str) -> str | None:
        try:
            return manifest.read_bounded(os.path.join(self.dist_info, member), manifest.MAX_METADATA_BYTES).decode(
                "utf-8", "replace"
            )
        except ManifestError as exc:
            if member == "RECORD":
                self.record_error = str(exc)
            return None

    def entry_points(self, group: str) -> list[EntryPoint]:
        """The entries of one ``[group]`` of entry_points.txt (PyPA's INI format). Only that section is
        parsed: setuptools or pip list hundreds of console scripts the loader never needs."""
        if self._entry_points is None:
            self._entry_points = {}
            self._entry_points_text = self._text("entry_points.txt") or ""
        found = self._entry_points.get(group)
        if found is None:
            found = []
            text = self._entry_points_text
            if f"[{group}]" in text:
                section = None
                for line in text.splitlines():
                    line = line.strip()
                    if not line or line[0] in "#;":
                        continue
                    if line.startswith("[") and line.endswith("]"):
                        section = line[1:-1].strip()
                    elif section == group and "=" in line:
                        name, _, value = line.partition("=")
                        found.append(EntryPoint(name.strip(), value.strip()))
            self._entry_points[group] = found
        return found

    def _requires_dist(self) -> list[tuple[str, str]]:
        """METADATA's Requires-Dist headers: (the requirement, its marker after ";")."""
        text = self._text("METADATA") or ""
        head = text.split("\n\n", 1)[0]  # the headers; the description follows the first blank line
        found = []
        for line in head.splitlines():
            if line.lower().startswith("requires-dist:"):
                req, _, marker = line.split(":", 1)[1].partition(";")
                found.append((req.strip(), marker))
        return found

    def extras(self) -> dict[str, str]:
        """The distributions this one requires only under an extra (its optional backends):
        normalized name -> the extra's name, e.g. {'cuplug_cuda13': 'cuda13'}."""
        found: dict[str, str] = {}
        for req, marker in self._requires_dist():
            name, extra = _requirement_name(req), _extra_of(marker)
            if name and extra:
                found[normalize(name)] = extra
        return found

    def requirement(self, project: str) -> str | None:
        """What this distribution requires of ``project`` outside any extra ("pyelftools>=0.31"); None: nothing."""
        for req, marker in self._requires_dist():
            if _extra_of(marker) is None and normalize(_requirement_name(req)) == normalize(project):
                return req
        return None

    def record(self) -> dict[str, tuple[str, str]]:
        """RECORD: relative path -> (its hash field, its size field), as written."""
        if self._record is None:
            rows: dict[str, tuple[str, str]] = {}
            for line in (self._text("RECORD") or "").splitlines():
                parts = line.rsplit(",", 2)
                if len(parts) == 3 and parts[0]:
                    rows[parts[0].strip('"')] = (parts[1], parts[2])
            self._record = rows
        return self._record

    def recorded(self, path: str) -> tuple[str | None, int | None] | None:
        """(sha256 hex or None, size or None) that RECORD holds for ``path``; None when it does not list it."""
        entry = self.record().get(path)
        if entry is None:
            return None
        digest, size = entry
        return _record_sha256(digest), int(size) if size.isdigit() and len(size) < 16 else None


def _requirement_name(req: str) -> str:
    """The project a requirement names: "pyelftools" of "pyelftools>=0.31"."""
    for stop in " <>=!~[(@":
        req = req.split(stop, 1)[0]
    return req


def _extra_of(marker: str) -> str | None:
    """'extra == "cuda13"' (any spacing, either quote) -> 'cuda13'; None for any other marker."""
    text = marker.replace(" ", "")
    head, sep, rest = text.partition("extra==")
    if not sep or head not in ("", "(") or len(rest) < 3 or rest[0] not in "'\"":
        return None
    value, quote, _ = rest[1:].partition(rest[0])
    return normalize(value) if quote and value else None


def _record_sha256(field: str) -> str | None:
    """'sha256=<urlsafe base64, unpadded>' (PEP 376/427) -> hex; None for any other or a malformed hash."""
    import binascii

    algo, _, value = field.partition("=")
    if algo != "sha256" or not value:
        return None
    try:
        raw = binascii.a2b_base64(value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def search_path() -> list[str]:
    """Where distributions are looked up: the directory the running cuplug was installed into first,
    then the sys.path entries in order, except the implicit sys.path[0] (the script's directory, or
    the working directory for -c and -m). A bundle with cuplug installed beside its script (pip
    install --target .) still finds its backends there; a dist-info planted beside some other
    script or in the working directory is never read."""
    entries = list(sys.path)
    if entries and not getattr(sys.flags, "safe_path", False):
        entries = entries[1:]
    seen, found = {os.path.realpath(OWN_SITE)}, [OWN_SITE]
    for e in entries:
        if e and (real := os.path.realpath(e)) not in seen:
            seen.add(real)
            found.append(e)
    return found


class Installed:
    """The distributions visible to this process, first of each name on the search path."""

    def __init__(self, path: list[str] | None = None) -> None:
        self.dists: dict[str, Distribution] = {}
        for entry in search_path() if path is None else path:
            try:
                with os.scandir(entry) as it:
                    names = []
                    for i, e in enumerate(it):
                        if i >= MAX_DIRECTORY_ENTRIES:
                            break
                        if e.name.endswith(".dist-info"):
                            names.append(e.name)
            except (OSError, ValueError):
                continue
            for meta in sorted(names):
                name = normalize(meta[: -len(".dist-info")].split("-")[0])
                if name and name not in self.dists:
                    self.dists[name] = Distribution(name, os.path.join(os.path.abspath(entry), meta))

    def entry_points(self, group: str) -> list[tuple[Distribution, EntryPoint]]:
        return [(d, ep) for d in self.dists.values() for ep in d.entry_points(group)]


def own_distribution() -> Distribution | None:
    """cuplug's own dist-info: beside the package that is running (never looked up elsewhere)."""
    try:
        names = sorted(n for n in os.listdir(OWN_SITE) if n.endswith(".dist-info"))
    except OSError:
        return None
    for meta in names:
        if normalize(meta[: -len(".dist-info")].split("-")[0]) == OWN_DISTRIBUTION:
            return Distribution(OWN_DISTRIBUTION, os.path.join(OWN_SITE, meta))
    return None
