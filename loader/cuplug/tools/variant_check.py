"""Which variant wheel of a backend is installed, and whether the installer's choice still fits the device.

An installer with wheel-variant support (uv 0.13.8 with ``--preview-features
wheel-variants``) picks a backend wheel for the machine it runs on: ``sm90`` for
an H200, ``null`` (PTX only) where no variant matched. The environment can
outlive that choice (copied to another GPU, a driver downgrade). ``check`` tells,
from the installed distribution's ``*.dist-info/variant.json`` (PEP 825; absent
for the all-variant wheel) and the probed device, what was installed and what
the loader will do with it now. It never raises: an unreadable file is a status.

The loader itself needs none of this: it reads the package's manifest, which
lists what the wheel holds, and falls through (SASS -> PTX JIT -> next
package -> CPU) as always. This module only explains.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..contract import targets
from ..contract.cuda import version_str
from ..contract.manifest import ENTRY_POINT_GROUP
from ..runtime import discovery

NULL_LABEL = "null"


@dataclasses.dataclass(frozen=True)
class VariantStatus:
    distribution: str  # e.g. "cuplug_cuda13"
    version: str
    label: str | None  # None: not a variant wheel (the all-variant wheel)
    properties: tuple[str, ...]  # "nvidia :: sm_arch :: 90_real", ...
    code: str  # plain | fits | fallthrough | no-fit | no-device | unreadable
    reason: str
    fallthrough: str | None = None  # what the loader will use instead: "ptx compute_75", "cpu", ...

    @property
    def fits(self) -> bool | None:
        """True: the variant's own SASS serves this device; False: it does not; None: nothing to judge."""
        return {"fits": True, "fallthrough": False, "no-fit": False}.get(self.code)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "properties": list(self.properties), "fits": self.fits}


def _flat(props: dict[str, Any]) -> tuple[str, ...]:
    return tuple(
        f"{ns} :: {f} :: {v}" for ns, feats in sorted(props.items()) for f, vs in sorted(feats.items()) for v in vs
    )


def _target(value: str, prefix: str) -> targets.Target | None:
    """'90_real' / '90a_real' -> sm_90 / sm_90a ('_virtual': compute_); 'sm_90a' as it is; None when not an arch."""
    for suffix in ("_real", "_virtual"):
        value = value.removesuffix(suffix)
    try:
        return targets.parse(value if value.startswith(("sm_", "compute_")) else f"{prefix}_{value}")
    except ValueError:
        return None


def _driver(value: str) -> int | None:
    """'12.4' -> 12040 (the inverse of version_str); None for anything else."""
    major, dot, minor = value.partition(".")
    if not (dot and major.isdigit() and minor.isdigit() and major.isascii() and minor.isascii()):
        return None
    return int(major) * 1000 + int(minor) * 10


def _facts_from_manifest(package_dir: Path | None) -> tuple[list[str], list[str], int | None]:
    """(sm_XX list, compute_XX list, max min_driver) of the installed package's manifest."""
    try:
        data = json.loads(((package_dir or Path("/nonexistent")) / "manifest.json").read_text())
        arts = data.get("artifacts", [])
        return (
            sorted({s for a in arts for s in a.get("sass", [])}),
            sorted({p for a in arts for p in a.get("ptx", [])}),
            max((int(a["min_driver"]) for a in arts), default=None),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return [], [], None


def check(
    dist_info: Path,
    capability: tuple[int, int] | None,
    driver_version: int | None,
    package_dir: Path | None = None,
) -> VariantStatus:
    """What is installed from ``dist_info`` and how it fits a device of ``capability`` under ``driver_version``.

    ``package_dir`` (the backend package beside the dist-info) supplies the manifest for the
    ``null`` variant, which by PEP 825 has no properties; default: found from the dist-info's RECORD.
    """
    dist_info = Path(dist_info)
    dist, _, version = dist_info.name[: -len(".dist-info")].partition("-")
    if package_dir is None:
        package_dir = _package_dir(dist_info)
    vpath = dist_info / "variant.json"
    if not vpath.is_file():
        return VariantStatus(
            dist, version, None, (), "plain",
            "the all-variant wheel (installed by an installer without wheel variants, or asked for by name): "
            "the loader chooses among all of its variants",
        )  # fmt: skip
    try:
        doc = json.loads(vpath.read_text())
        ((label, props),) = doc["variants"].items()
        flat = _flat(props)
        feats = props.get("nvidia", {})
        real = [t for v in feats.get("sm_arch", []) if v.endswith("_real") and (t := _target(v, "sm"))]
        virtual = [t for v in feats.get("sm_arch", []) if v.endswith("_virtual") and (t := _target(v, "compute"))]
        bounds = [b for b in map(_driver, feats.get("cuda_version_lower_bound", [])) if b is not None]
        need = max(bounds) if bounds else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return VariantStatus(dist, version, None, (), "unreadable", f"{vpath}: {exc.__class__.__name__}: {exc}")
    if label == NULL_LABEL:  # zero properties by definition: judge by what the manifest lists
        sass, ptx, need = _facts_from_manifest(package_dir)
        real = [t for v in sass if (t := _target(v, "sm"))]
        virtual = [t for v in ptx if (t := _target(v, "compute"))]
    what = f"variant {label}" + (f" ({', '.join(flat)})" if flat else " (no properties: PTX only)")
    if capability is None:
        return VariantStatus(dist, version, label, flat, "no-device", f"{what}; no CUDA device to check it against")
    cc = f"{capability[0]}.{capability[1]}"
    reinstall = (
        f"reinstall it on this machine to get the matching variant "
        f"(uv pip install --preview-features wheel-variants --reinstall-package {dist.replace('_', '-')} ...)"
    )
    if need is not None and driver_version is not None and driver_version < need:
        return VariantStatus(
            dist, version, label, flat, "no-fit",
            f"{what} needs a driver for CUDA >= {version_str(need)}; this driver is {version_str(driver_version)}: "
            f"nothing in it can load; the loader falls through to another backend package or the CPU; {reinstall} "
            "or update the driver",
            "another package or cpu",
        )  # fmt: skip
    # the contract's rules (contract/targets.py), as the loader's selection applies them
    best = targets.best_sass([t.text for t in real], capability)
    if best is not None:
        exact = "exact" if best.cc == capability else "same-major"
        return VariantStatus(dist, version, label, flat, "fits", f"{what}: {exact} SASS {best.text} for CC {cc}")
    ptx_ok = [t for t in virtual if targets.runs_on(t, capability)]
    if label == NULL_LABEL and ptx_ok:
        p = max(ptx_ok, key=lambda t: t.cc)
        return VariantStatus(
            dist, version, label, flat, "fits",
            f"{what}: PTX {p.text} JIT-compiled for CC {cc} (no variant wheel matched this machine "
            "when it was installed; `cuplug warmup` fills the JIT cache)",
            f"ptx {p.text}",
        )  # fmt: skip
    built_for = ", ".join(t.text for t in real) or "no SASS"
    if ptx_ok:
        p = max(ptx_ok, key=lambda t: t.cc)
        return VariantStatus(
            dist, version, label, flat, "fallthrough",
            f"{what} was chosen for another GPU: its {built_for} cannot run on CC {cc}; the loader falls through "
            f"to its PTX {p.text} (JIT, slower first launch); {reinstall}",
            f"ptx {p.text}",
        )  # fmt: skip
    return VariantStatus(
        dist, version, label, flat, "no-fit",
        f"{what} was chosen for another GPU: its {built_for} cannot run on CC {cc} and it has no PTX this device "
        f"can JIT; the loader falls through to another backend package or the CPU; {reinstall}",
        "another package or cpu",
    )  # fmt: skip


def _package_dir(dist_info: Path) -> Path | None:
    """The backend package a dist-info installed: its cuplug.backends entry point's module, beside it."""
    dist = discovery.Distribution("", str(dist_info))
    for ep in dist.entry_points(ENTRY_POINT_GROUP):
        module = discovery.module_dir(ep.value)
        if module is not None:
            return Path(dist.site) / module
    return None


def backend_dist_infos(paths: list[str] | None = None) -> list[Path]:
    """The dist-info of every installed distribution registering a ``cuplug.backends`` entry point
    (first of a name on the loader's search path wins, as for the loader)."""
    installed = discovery.Installed(paths)
    return [Path(d.dist_info) for d in installed.dists.values() if d.entry_points(ENTRY_POINT_GROUP)]


def report(
    probe: Any, device: int | None = 0, paths: list[str] | None = None, packages: Any = None
) -> list[dict[str, Any]]:
    """One ``VariantStatus.to_json()`` per installed backend distribution, for ``cuplug doctor``.

    ``probe`` is a ``cuplug.driver.ProbeResult`` (or anything with ``devices`` and ``driver_version``;
    None: no device); ``device`` is the index of the device the loader will use (None: the first);
    ``packages``, if given, limits the report to those package directories (``trace.packages``:
    objects with ``.directory``, or paths), i.e. to the backend doctor was asked about.
    """
    devices = list(getattr(probe, "devices", ()) or ())
    dev = next((d for d in devices if getattr(d, "index", None) == device), devices[0] if devices else None)
    cap = tuple(dev.capability) if dev is not None else None
    wanted = None
    if packages is not None:
        wanted = {Path(getattr(p, "directory", p)).resolve() for p in packages}
    out = []
    for di in backend_dist_infos(paths):
        if wanted is not None and (_package_dir(di) or Path("/nonexistent")).resolve() not in wanted:
            continue
        try:
            status = check(di, cap, getattr(probe, "driver_version", None))  # type: ignore[arg-type]
        except Exception as exc:
            status = VariantStatus(di.name, "", None, (), "unreadable", f"{exc.__class__.__name__}: {exc}")
        out.append(status.to_json())
    return out


def format_report(rows: list[dict[str, Any]]) -> list[str]:
    """Doctor's text lines, e.g. ``variant wheel cuplug_cuda13: sm90 fits — exact SASS sm_90 for CC 9.0``."""
    return [
        f"variant wheel {r['distribution']}: {r['label'] or 'all-variant'} {r['code']} - {r['reason']}" for r in rows
    ]
