"""The manifest: ``manifest.json`` beside the artifacts of a backend package, one typed model.

The build kit writes it (:func:`write`), the loader reads it from an installed package
(:func:`read`), ``cuplug inspect`` and the wheel gate read it from a wheel
(:func:`parse`), and all of them compare a file with its entry through
:func:`mismatch`. Its JSON Schema is ``cuplug/schemas/manifest.schema.json`` (a test
checks that schema and this parser accept and refuse the same entries).

Every read is bounded (size, count, JSON depth) and every field is type- and
range-checked: a bad entry is a :class:`ManifestError` naming the field, never another
exception. Field checks use ``str`` methods, not ``re``: this runs on every
``cuplug.load()`` and ``re`` would cost more than the decision (see ``record``).
"""

from __future__ import annotations

import os
import stat

from . import cuda, jsontext
from .record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

SCHEMA = 1
FILE_NAME = "manifest.json"
ENTRY_POINT_GROUP = "cuplug.backends"  # a backend package registers itself here (name: module, value: package)
CPU_ENTRY_POINT_GROUP = "cuplug.cpu_backends"  # the owner of a backend name registers its CPU twin here

# Bounds on what is read from disk: a manifest is a few KiB, a RECORD a few hundred KiB.
MAX_MANIFEST_BYTES = 1 << 20
MAX_METADATA_BYTES = 4 << 20
MAX_ARTIFACTS = 256
MAX_TARGETS = 64
MIN_ARTIFACT_BYTES = 64  # an ELF header alone
MAX_ARTIFACT_BYTES = 1 << 31  # 2 GiB: read into a sealed in-memory file before dlopen
MAX_FILE_CHARS = 255
MAX_DRIVER = 999_999
MAX_ABI = 1_000_000

_LOWER = "abcdefghijklmnopqrstuvwxyz"
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"


class ManifestError(ValueError):
    """A manifest (or a dist-info file) is missing, unreadable, too large or malformed."""


# ---- field shapes (the JSON Schema's patterns, in str methods) -------------------------------------


def _made_of(text: object, chars: str, lo: int, hi: int, first: str | None = None) -> bool:
    """``text`` is a str of ``lo``..``hi`` characters, all in ``chars`` (the first one in ``first``)."""
    if not isinstance(text, str) or not lo <= len(text) <= hi:
        return False
    if first is not None and text and text[0] not in first:
        return False
    return not text.strip(chars)


def _dotted_numbers(text: object, parts: tuple[int, int], digits: int = 3) -> bool:
    """'12.4', '12.4.1', '8.4': ``parts`` numbers of 1..``digits`` ASCII digits joined by dots."""
    if not isinstance(text, str):
        return False
    pieces = text.split(".")
    return parts[0] <= len(pieces) <= parts[1] and all(_made_of(p, _DIGITS, 1, digits) for p in pieces)


def is_backend_name(text: object) -> bool:
    return _made_of(text, _LOWER + _DIGITS + "_", 1, 64, first=_LOWER)


def is_variant_name(text: object) -> bool:
    return _made_of(text, _LOWER + _DIGITS + "_", 1, 32, first=_LOWER + _DIGITS)


def is_cuda_major(text: object) -> bool:
    """'cuda12', 'cuda13', 'cuda14' ...: the name of a backend package's CUDA major."""
    return isinstance(text, str) and text.startswith("cuda") and _made_of(text[4:], _DIGITS, 1, 3)


def is_sha256(text: object) -> bool:
    return _made_of(text, _HEX, 64, 64)


def is_arch(text: object) -> bool:
    return _made_of(text, _LOWER + _DIGITS + "_", 1, 32)


def _show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# Field -> (check, what a good value looks like), for the entries' string fields.
_STRING_FIELDS: dict[str, tuple[Any, str]] = {
    "backend": (is_backend_name, "a name like vector ([a-z][a-z0-9_]{0,63})"),
    "variant": (is_variant_name, "a name like sm80 ([a-z0-9][a-z0-9_]{0,31})"),
    "sha256": (is_sha256, "64 hex digits"),
    "ptx_isa": (lambda v: _dotted_numbers(v, (2, 2)), "a PTX ISA like 8.4"),
    "cuda_version": (lambda v: _dotted_numbers(v, (1, 3)), "a CUDA version like 12.4"),
    "arch": (is_arch, "a CPU architecture like x86_64"),
}
_OPTIONAL = ("ptx_isa", "arch")


def _string(d: dict[str, Any], key: str) -> str | None:
    v = d.get(key)
    if v is None and key in _OPTIONAL:
        return None
    check, shape = _STRING_FIELDS[key]
    if not check(v):
        raise ManifestError(f"{key} {_show(v)} is not {'absent or ' if key in _OPTIONAL else ''}{shape}")
    return str(v)


def _int(d: dict[str, Any], key: str, lo: int, hi: int) -> int:
    v = d.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise ManifestError(f"{key} {_show(v)} is not an integer in [{lo}, {hi}]")
    return v


def _is_code(text: object, images: tuple[str, ...]) -> bool:
    from .targets import parse

    return cuda.is_target(text) and parse(str(text)).kind.image in images


# The target lists of an entry: which kinds of code each holds, and a good value ("lto" is optional: LTO variants).
_TARGET_LISTS: dict[str, tuple[tuple[str, ...], str]] = {
    "sass": (("sass", "ptx"), "targets like sm_80 / compute_75"),
    "ptx": (("sass", "ptx"), "targets like sm_80 / compute_75"),
    "lto": (("lto",), "LTO-IR targets like lto_75"),
}


def _targets(d: dict[str, Any], key: str) -> tuple[str, ...]:
    v = d.get(key, [] if key == "lto" else None)
    images, shape = _TARGET_LISTS[key]
    if not isinstance(v, list) or len(v) > MAX_TARGETS or not all(_is_code(t, images) for t in v):
        raise ManifestError(f"{key} {_show(v)} is not a list of up to {MAX_TARGETS} {shape}")
    return tuple(v)


def _file(d: dict[str, Any]) -> str:
    v = d.get("file")
    if not isinstance(v, str) or not 0 < len(v) <= MAX_FILE_CHARS or "\0" in v or "\\" in v:
        raise ManifestError(f"file {_show(v)} is not a relative path of 1 to {MAX_FILE_CHARS} characters without NUL")
    return v


def outside_problem(relative: str) -> str | None:
    """Why a manifest's ``file`` cannot name a file inside its package (absolute, '..'); None: it can.
    (Symbolic links are the reader's to resolve: ``runtime.verify`` does.)"""
    if not relative or "\0" in relative or relative.startswith("/") or ".." in relative.split("/"):
        return f"manifest file {relative!r} must be a relative path inside the package"
    return None


class Artifact(Record):
    """One built library: what it is (backend, variant), where (file), what it holds and needs."""

    __slots__ = (
        "backend",
        "variant",
        "file",
        "sha256",
        "size",
        "sass",
        "ptx",
        "ptx_isa",
        "cuda_version",
        "min_driver",
        "abi",
        "cuda",
        "package_dir",
        "arch",
        "lto",
    )
    _defaults: ClassVar[dict[str, Any]] = {"cuda": "", "package_dir": "", "arch": "", "lto": ()}
    backend: str
    variant: str
    file: str  # relative to the package directory
    sha256: str  # lowercase hex
    size: int
    sass: tuple[str, ...]  # e.g. ("sm_80",)
    ptx: tuple[str, ...]  # e.g. ("compute_75",)
    ptx_isa: str | None  # e.g. "8.4"
    cuda_version: str  # toolkit, e.g. "12.4"
    min_driver: int  # cuDriverGetVersion the artifact needs, e.g. 12000
    abi: int
    cuda: str  # the package's CUDA major, e.g. "cuda12" (not written: the manifest's own "cuda")
    package_dir: str  # absolute directory the manifest was read from (not written)
    arch: str  # CPU architecture from the file's ELF header ("" in manifests from before the field)
    lto: tuple[str, ...]  # LTO-IR inside (an LTO variant, docs/lto.md), e.g. ("lto_75",); absent: ()

    @property
    def path(self) -> str:
        return os.path.join(self.package_dir, self.file)

    @property
    def cuda_major(self) -> int:
        """The major of the toolkit that built it: 13 for "13.0" (an LTO variant's nvJitLink must be of it)."""
        return int(self.cuda_version.partition(".")[0])

    @classmethod
    def from_json(cls, d: object, cuda: str = "", package_dir: str = "") -> Artifact:
        """One manifest entry, every field checked for type and range (ManifestError names the first bad one)."""
        if not isinstance(d, dict):
            raise ManifestError(f"artifact entry {_show(d)} is not an object")
        return cls(
            backend=_string(d, "backend"),
            variant=_string(d, "variant"),
            file=_file(d),
            sha256=str(_string(d, "sha256")).lower(),
            size=_int(d, "size", MIN_ARTIFACT_BYTES, MAX_ARTIFACT_BYTES),
            sass=_targets(d, "sass"),
            ptx=_targets(d, "ptx"),
            ptx_isa=_string(d, "ptx_isa"),
            cuda_version=_string(d, "cuda_version"),
            min_driver=_int(d, "min_driver", 0, MAX_DRIVER),
            abi=_int(d, "abi", 0, MAX_ABI),
            arch=_string(d, "arch") or "",
            lto=_targets(d, "lto"),
            cuda=cuda,
            package_dir=package_dir,
        )

    def to_json(self) -> dict[str, Any]:
        """The manifest entry, in the order the build writes it."""
        d: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__ if k not in ("cuda", "package_dir")}
        d["sass"], d["ptx"], d["lto"] = list(self.sass), list(self.ptx), list(self.lto)
        if not self.arch:
            del d["arch"]
        if not self.lto:
            del d["lto"]
        return d


class Manifest(Record):
    """A whole manifest: its CUDA major, the usable entries, and one problem per refused entry."""

    __slots__ = ("cuda", "artifacts", "problems")
    cuda: str
    artifacts: tuple[Artifact, ...]
    problems: tuple[str, ...]


# ---- reading -------------------------------------------------------------------------------------


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ManifestError otherwise.

    Opened non-blocking, so a FIFO never hangs the caller; a device (/dev/zero), a
    directory or anything larger than ``limit`` is refused before it is read whole.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError as exc:
        raise ManifestError(f"{path} is missing") from exc
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ManifestError(f"{path} cannot be opened: {_why(exc)}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ManifestError(f"{path} is {st.st_size} bytes, more than the {limit} this reader accepts")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ManifestError(f"{path} grew past {limit} bytes while it was read")
        return b"".join(chunks)
    except OSError as exc:
        raise ManifestError(f"{path} cannot be read: {_why(exc)}") from exc
    finally:
        os.close(fd)


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _no_constant(name: str) -> Any:
    raise ManifestError(f"{name} is not valid JSON (NaN and Infinity are not numbers a manifest may hold)")


def parse_json(data: bytes, where: str) -> Any:
    """JSON with every error (bad UTF-8, syntax, NaN/Infinity, nesting too deep) a ManifestError."""
    try:
        return jsontext.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except ManifestError as exc:
        raise ManifestError(f"{where}: {exc}") from None
    except RecursionError:
        raise ManifestError(f"{where}: JSON nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"{where} is not valid JSON: {exc}") from None


def parse(data: bytes, where: str, cuda: str = "", package_dir: str = "") -> Manifest:
    """A manifest's bytes: the document must be usable (schema, list, bounds: else ManifestError);
    each entry is checked on its own, a refused one becomes a problem and the rest are used.
    ``cuda`` is the major to assume when the manifest does not say (older manifests)."""
    doc = parse_json(data, where)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        schema = doc.get("schema") if isinstance(doc, dict) else "?"
        raise ManifestError(f"{where}: schema {_show(schema)} is not {SCHEMA}; upgrade cuplug or reinstall the backend")
    entries = doc.get("artifacts", [])
    if not isinstance(entries, list):
        raise ManifestError(f"{where}: artifacts {_show(entries)} is not a list")
    if len(entries) > MAX_ARTIFACTS:
        raise ManifestError(f"{where}: {len(entries)} artifacts, more than {MAX_ARTIFACTS}")
    declared = doc.get("cuda")
    if declared is not None:
        if not is_cuda_major(declared):
            raise ManifestError(f"{where}: cuda {_show(declared)} is not like cuda13")
        cuda = declared
    good, bad = [], []
    for i, entry in enumerate(entries):
        try:
            good.append(Artifact.from_json(entry, cuda, package_dir))
        except ManifestError as exc:
            label = entry.get("variant") if isinstance(entry, dict) and isinstance(entry.get("variant"), str) else None
            bad.append(f"manifest entry {i}" + (f" ({_show(label)})" if label else "") + f": {exc}")
    return Manifest(cuda, tuple(good), tuple(bad))


def read(directory: str | os.PathLike[str], cuda: str = "") -> Manifest:
    """The manifest of a package or build directory (bounded read)."""
    directory = os.fspath(directory)
    path = os.path.join(directory, FILE_NAME)
    return parse(read_bounded(path, MAX_MANIFEST_BYTES), path, cuda, directory)


def read_strict(directory: str | os.PathLike[str], cuda: str = "") -> tuple[Artifact, ...]:
    """Every artifact of a manifest; any refused entry is a ManifestError (for the build kit and tools)."""
    found = read(directory, cuda)
    if found.problems:
        raise ManifestError(f"{os.path.join(os.fspath(directory), FILE_NAME)}: {found.problems[0]}")
    return found.artifacts


# ---- writing and checking ------------------------------------------------------------------------


def dumps(cuda: str, artifacts: tuple[Artifact, ...] | list[Artifact]) -> str:
    """The manifest document as the build writes it (two-space indent, a final newline)."""
    import json

    if not is_cuda_major(cuda):
        raise ManifestError(f"cuda {_show(cuda)} is not like cuda13")
    doc = {"schema": SCHEMA, "cuda": cuda, "artifacts": [a.to_json() for a in artifacts]}
    return json.dumps(doc, indent=2) + "\n"


def write(directory: str | os.PathLike[str], cuda: str, artifacts: tuple[Artifact, ...] | list[Artifact]) -> str:
    """Writes ``directory/manifest.json``; returns its path."""
    path = os.path.join(os.fspath(directory), FILE_NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(cuda, artifacts))
    return path


def sha256_hex(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def mismatch(artifact: Artifact, size: int, sha256: str) -> str | None:
    """Why a file of ``size`` bytes and digest ``sha256`` is not ``artifact`` (None: it is)."""
    if size != artifact.size:
        return f"size {size} != manifest {artifact.size} (truncated or replaced)"
    if sha256.lower() != artifact.sha256:
        return "sha256 differs from the manifest (file altered)"
    return None
