"""Variant wheels (PEP 825 package format, PEP 850 providers): one small wheel per GPU architecture.

From one build directory (``python -m cuplug.kit variants``'s output) this
writes, beside today's all-variant wheel:

* one variant wheel per *dedicated* SASS artifact of the manifest (exactly one
  ``sm_XX``, no PTX: ``sm75``, ``sm80``, ``sm90`` ...), holding that cubin plus
  every PTX-only artifact as the fall-through the loader can JIT;
* a ``null`` variant holding the PTX-only artifacts alone (zero properties:
  PEP 825 makes it the always-compatible fallback an installer picks last);
* ``{name}-{version}-variants.json``, the index-level metadata of the set.

Every variant wheel carries its own ``manifest.json`` (the build's entries of
the files it holds, byte for byte) and ``*.dist-info/variant.json``. Its
properties are computed from that manifest, never typed in:

* ``sass`` ``sm_XX``       -> ``nvidia :: sm_arch :: XX_real``
* ``ptx``  ``compute_XX``  -> ``nvidia :: sm_arch :: XX_virtual``
* max ``min_driver`` (cuDriverGetVersion, e.g. 12040) -> ``nvidia :: cuda_version_lower_bound :: 12.4``

File layout, as PEP 825 specifies it (peps/pep-0825.rst, python/peps, 2026-08):

* file name ``{distribution}-{version}(-{build})?-{python}-{abi}-{platform}-{label}.whl``,
  label ``^[0-9a-z_.]+$``, ``null`` reserved for the zero-property variant;
* ``*.dist-info/variant.json``: ``$schema``, ``default-priorities.namespace``,
  ``variants`` with exactly one entry keyed by the file name's label, feature
  values as sorted lists;
* the index file holds the union of the wheels' ``variants``.

The ``providers`` key is PEP 850's (the namespace's provider plugin): uv 0.13.8
only asks its vendored NVIDIA provider when ``providers.nvidia`` names
``nvidia_variant_provider.plugin:NvidiaVariantPlugin`` (without it uv treats the
namespace as unknown and installs the ``null`` variant), hence the PEP 850
schema URL, one of the two uv 0.13.8 knows.

Variant wheels are made from the auditwheel-repaired wheel (auditwheel does not
parse variant labels): the label and ``variant.json`` are added afterwards and
the wheel's RECORD rewritten, with the fixed timestamps of ``wheel.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cuplug.contract import manifest
from cuplug.contract.cuda import version_str
from cuplug.contract.manifest import Artifact

from . import wheel as _wheel
from .wheelfile import record_line, split_label

SCHEMA_URL = "https://variants-schema.wheelnext.dev/peps/850/v0.2.0.json"
NAMESPACE = "nvidia"
# PEP 850 provider entry for the namespace; uv vendors this plugin (no install at resolve time).
PROVIDER = {
    "plugin-api": "nvidia_variant_provider.plugin:NvidiaVariantPlugin",
    "requires": ["nvidia-variant-provider>=0.0.1,<1.0.0"],
}
NULL_LABEL = "null"
LABEL_RE = re.compile(r"^[0-9a-z_.]+$")
NAME_RE = re.compile(r"^[a-z0-9_]+$")
VALUE_RE = re.compile(r"^[a-z0-9_.]+$")

Properties = dict[str, dict[str, list[str]]]  # {namespace: {feature: [values]}}, as in variant.json


class VariantError(_wheel.WheelError):
    """A variant wheel or its metadata cannot be made or is inconsistent."""


@dataclasses.dataclass(frozen=True)
class Planned:
    label: str
    artifacts: tuple[Artifact, ...]  # manifest entries


def _arch(target: str, prefix: str) -> str:
    if not target.startswith(prefix):
        raise VariantError(f"manifest target {target!r} is not of the form {prefix}XX")
    return target[len(prefix) :]


def properties_of(artifacts: Iterable[Artifact]) -> Properties:
    """The nvidia properties of a set of manifest entries (sass/ptx/min_driver, read from the files)."""
    arts = list(artifacts)
    if not arts:
        return {}
    # An LTO variant (docs/lto.md) serves any later GPU where nvJitLink is installed, a fact no nvidia property
    # says: it rides along in every wheel, as PTX-only ones do, and names no sm_arch of its own.
    defining = [a for a in arts if not a.lto]
    sm = {f"{_arch(s, 'sm_')}_real" for a in defining for s in a.sass}
    sm |= {f"{_arch(p, 'compute_')}_virtual" for a in defining for p in a.ptx}
    feats = {"cuda_version_lower_bound": [str(version_str(max(a.min_driver for a in arts)))]}
    if sm:
        feats["sm_arch"] = sorted(sm)
    return {NAMESPACE: feats}


def plan(arts: Sequence[Artifact]) -> list[Planned]:
    """One entry per dedicated SASS artifact (+ the PTX-only and LTO ones), then ``null`` (those alone)."""
    ptx_only = tuple(a for a in arts if (not a.sass and a.ptx) or a.lto)
    planned = []
    for a in sorted(arts, key=lambda a: a.variant):
        if len(a.sass) == 1 and not a.ptx and not a.lto:
            label = a.variant.lower()
            if not LABEL_RE.match(label) or label == NULL_LABEL:
                raise VariantError(f"variant name {a.variant!r} cannot be a PEP 825 variant label")
            planned.append(Planned(label, (a, *ptx_only)))
    if not planned:
        raise VariantError("the manifest has no dedicated SASS variant (one sm_XX, no PTX) to make a variant of")
    if ptx_only:
        planned.append(Planned(NULL_LABEL, ptx_only))
    return planned


def variant_json(label: str, properties: Properties) -> bytes:
    """``*.dist-info/variant.json`` for one wheel: exactly one entry, keyed by its label."""
    return _dump({label: properties})


def _dump(variants: dict[str, Properties]) -> bytes:
    namespaces = sorted({ns for props in variants.values() for ns in props}) or [NAMESPACE]
    doc = {
        "$schema": SCHEMA_URL,
        "default-priorities": {"namespace": namespaces},
        "providers": {ns: PROVIDER for ns in namespaces},
        "variants": {
            label: {ns: {f: sorted(v) for f, v in sorted(feats.items())} for ns, feats in sorted(props.items())}
            for label, props in sorted(variants.items())
        },
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def validate(doc: dict[str, Any], label: str | None = None) -> list[str]:
    """PEP 825's rules for a variant.json (label given) or an index file (label None): problems found."""
    problems = []
    if not isinstance(doc.get("$schema"), str):
        problems.append("$schema missing")
    ns_order = (doc.get("default-priorities") or {}).get("namespace")
    if not isinstance(ns_order, list) or not ns_order:
        problems.append("default-priorities.namespace must be a non-empty list")
        ns_order = []
    variants = doc.get("variants")
    if not isinstance(variants, dict):
        return [*problems, "variants must be an object"]
    if label is not None and list(variants) != [label]:
        problems.append(f"variants must hold exactly the file name's label {label!r}, holds {sorted(variants)}")
    for lab, props in variants.items():
        if not LABEL_RE.match(lab):
            problems.append(f"label {lab!r} does not match ^[0-9a-z_.]+$")
        if lab == NULL_LABEL and props:
            problems.append("the null variant must have zero properties")
        for ns, feats in props.items():
            if ns not in ns_order:
                problems.append(f"namespace {ns!r} missing from default-priorities.namespace")
            for name, values in feats.items():
                if not NAME_RE.match(ns) or not NAME_RE.match(name):
                    problems.append(f"feature {ns} :: {name} does not match ^[a-z0-9_]+$")
                if not values or values != sorted(set(values)) or not all(VALUE_RE.match(v) for v in values):
                    problems.append(f"{lab}: {ns} :: {name} values {values} are not a sorted set of ^[a-z0-9_.]+$")
    return problems


def merge(docs: Sequence[dict[str, Any]]) -> bytes:
    """The index file from the wheels' variant.json (PEP 825: union of variants, same label = same properties)."""
    variants: dict[str, Properties] = {}
    for doc in docs:
        for label, props in doc["variants"].items():
            if variants.setdefault(label, props) != props:
                raise VariantError(f"label {label!r} maps to two property sets: {variants[label]} and {props}")
    return _dump(variants)


def add_variant(repaired: Path, label: str, metadata: bytes, out_dir: Path) -> Path:
    """Copies a repaired wheel to ``out_dir`` with the label in its name and variant.json in its dist-info."""
    base, existing = split_label(repaired.name)
    if existing is not None:
        raise VariantError(f"{repaired.name} already carries the variant label {existing!r}")
    out = out_dir / f"{base[: -len('.whl')]}-{label}.whl"
    with zipfile.ZipFile(repaired) as zin:
        infos = zin.infolist()
        dist_info = next(i.filename.split("/")[0] for i in infos if i.filename.endswith(".dist-info/RECORD"))
        files = {i.filename: zin.read(i) for i in infos}
        attrs = {i.filename: i.external_attr for i in infos}
    record_name = f"{dist_info}/RECORD"
    vname = f"{dist_info}/variant.json"
    files.pop(vname, None)
    files.pop(record_name)
    files[vname] = metadata
    # RECORD lists files only (auditwheel's directory entries stay in the archive, unlisted, as it wrote them).
    record = [record_line(n, data) for n, data in files.items() if not n.endswith("/")]
    files[record_name] = ("\n".join([*record, f"{record_name},,"]) + "\n").encode()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for n, data in files.items():
            info = zipfile.ZipInfo(n, date_time=_wheel._REPRODUCIBLE_DATE)
            info.external_attr = attrs.get(n) or (0o644 << 16)
            info.compress_type = zipfile.ZIP_STORED if n.endswith("/") else zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return out


def build_variant_wheels(
    build_dir: Path,
    out_dir: Path,
    *,
    name: str,
    version: str,
    requires: str | Sequence[str],
    summary: str = "",
    run: Callable[..., object] | None = None,
    log: Callable[[str], None] = print,
    exclude: Sequence[str] = (),
) -> list[Path]:
    """Variant wheels (repaired, labelled) and ``{name}-{version}-variants.json`` into ``out_dir``."""
    try:
        found = manifest.read(build_dir)
        if found.problems:
            raise manifest.ManifestError(found.problems[0])
    except manifest.ManifestError as exc:
        raise VariantError(f"{exc}; run `python -m cuplug.kit variants` first") from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    docs = []
    # The CPU the manifest's artifacts are for (x86_64 for manifests from before the field): aarch64
    # variant wheels from a cross build get manylinux_2_17_aarch64 like the all-variant wheel.
    arch = next((a.arch for a in found.artifacts if a.arch), "x86_64")
    for p in plan(found.artifacts):
        props = {} if p.label == NULL_LABEL else properties_of(p.artifacts)
        metadata = variant_json(p.label, props)
        with tempfile.TemporaryDirectory() as tmp:
            sub = Path(tmp) / "build"
            sub.mkdir()
            manifest.write(sub, found.cuda, p.artifacts)
            for a in p.artifacts:
                (sub / a.file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(build_dir / a.file, sub / a.file)
            raw = _wheel.build_backend_wheel(
                sub,
                Path(tmp) / "raw",
                name=name,
                version=version,
                requires=requires,
                summary=f"{summary or name} [variant {p.label}]",
                tag=_wheel.raw_tag(arch),
            )
            repaired = _wheel.repair_wheel(
                raw, Path(tmp) / "repaired", run=run, plat=_wheel.target_plat(arch), exclude=exclude
            )
            for old in out_dir.glob(f"{repaired.name[: -len('.whl')]}-{p.label}.whl"):
                old.unlink()
            made.append(add_variant(repaired, p.label, metadata, out_dir))
        docs.append(json.loads(metadata))
        flat = ", ".join(f"{ns} :: {f} :: {v}" for ns, fs in props.items() for f, vs in fs.items() for v in vs)
        log(f"variant {p.label}: {', '.join(a.variant for a in p.artifacts)} ({flat or 'no properties'})")
    index = out_dir / f"{_normalized(name)}-{version}-variants.json"
    index.write_bytes(merge(docs))
    return [*made, index]


def _normalized(name: str) -> str:
    """Distribution name as in wheel file names (PEP 427/503 normalization, '-' -> '_')."""
    return re.sub(r"[-_.]+", "_", name).lower()


def check_variant(wheel: Path) -> list[str]:
    """The variant part of the gate: label, variant.json by PEP 825, properties = the manifest's facts."""
    _, label = split_label(wheel.name)
    if label is None:
        return []
    problems = []
    if not LABEL_RE.match(label):
        problems.append(f"variant label {label!r} does not match ^[0-9a-z_.]+$")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        vfiles = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/variant.json")]
        if len(vfiles) != 1:
            return [*problems, f"a variant wheel needs exactly one *.dist-info/variant.json, has {len(vfiles)}"]
        try:
            doc = json.loads(zf.read(vfiles[0]))
        except ValueError as exc:
            return [*problems, f"{vfiles[0]}: not JSON ({exc})"]
        problems += [f"{vfiles[0]}: {p}" for p in validate(doc, label)]
        manifests = [n for n in names if n.endswith(f"/{manifest.FILE_NAME}") and n.count("/") == 1]
        try:
            arts = [a for m in manifests for a in manifest.parse(zf.read(m), m).artifacts]
        except manifest.ManifestError as exc:
            return [*problems, str(exc)]
        record_name = vfiles[0].rsplit("/", 1)[0] + "/RECORD"
        want_record = {record_line(n, zf.read(n)) for n in names if not n.endswith("/") and n != record_name}
        got_record = (
            set(zf.read(record_name).decode().splitlines()) - {f"{record_name},,"} if record_name in names else set()
        )
        if got_record != want_record:
            problems.append(f"{record_name} does not list exactly the files of the wheel with their digests")
    want = {} if label == NULL_LABEL else properties_of(arts)
    got = (doc.get("variants") or {}).get(label)
    if got != want:
        problems.append(f"variant.json properties {got} differ from the manifest's facts {want}")
    return problems
