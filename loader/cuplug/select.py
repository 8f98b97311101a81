"""Selection: one pure function from facts to an ordered candidate list.

No I/O here. Inputs are the device's capability, the driver's CUDA version,
the installed artifacts (from manifests) and the policy; the output lists every
artifact, accepted ones first in the order they should be tried, each rejected
one with the reason a person would want to read, and the CPU backend last.

Order (NVIDIA's compatibility rules):
  1. SASS for exactly the device's arch; a dedicated variant before a fatbin
     (smaller file).
  2. SASS of the same major and a lower minor (the highest minor first).
  3. PTX with a target <= the device's arch whose ISA the driver can JIT.
  4. The CPU backend.
Within a tier the newer CUDA toolkit wins (its runtime has the later fixes),
then the smaller file, then the variant name, so the order is deterministic
with both extras installed. Artifacts whose runtime needs a newer driver are
rejected first. ``sm_XXa`` SASS runs only on exactly XX.
"""

from __future__ import annotations

import dataclasses
import re

from . import reasons
from .manifest import Artifact

MIN_CAPABILITY = (7, 5)

# PTX ISA version -> the CUDA version (cuDriverGetVersion) whose driver JITs it.
PTX_ISA_DRIVER: dict[str, int] = {
    "7.0": 11000,
    "7.1": 11010,
    "7.2": 11020,
    "7.3": 11030,
    "7.4": 11040,
    "7.5": 11050,
    "7.6": 11060,
    "7.7": 11070,
    "7.8": 11080,
    "8.0": 12000,
    "8.1": 12010,
    "8.2": 12020,
    "8.3": 12030,
    "8.4": 12040,
    "8.5": 12050,
    "8.6": 12070,
    "8.7": 12080,
    "8.8": 12090,
    "9.0": 13000,
    "9.1": 13010,
    "9.2": 13020,
}

TIER_EXACT_SASS, TIER_LOWER_MINOR_SASS, TIER_PTX, TIER_CPU, TIER_FORCED = 1, 2, 3, 4, 0
TIER_REJECTED = 99  # rejected candidates sort after every accepted one


@dataclasses.dataclass(frozen=True)
class Candidate:
    variant: str
    cuda: str | None  # None for the CPU backend
    accepted: bool
    code: str  # reason code: ok, forced, or why it was rejected
    reason: str
    tier: int
    artifact: Artifact | None = None

    @property
    def label(self) -> str:
        return f"{self.cuda}/{self.variant}" if self.cuda else self.variant


def fmt_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def ptx_driver_needed(isa: str | None) -> int | None:
    """The driver version that can JIT this PTX ISA, or None if unknown (newer than the table)."""
    return PTX_ISA_DRIVER.get(isa or "")


def _arch(target: str) -> tuple[int, int, bool]:
    """'sm_86' -> (8, 6, False); 'sm_90a' -> (9, 0, True); 'compute_75' -> (7, 5, False)."""
    m = re.fullmatch(r"(?:sm|compute)_(\d+?)(\d)([af]?)", target)
    if not m:
        raise ValueError(f"not a CUDA arch: {target!r}")
    return int(m.group(1)), int(m.group(2)), bool(m.group(3))


def _sass_tier(artifact: Artifact, cc: tuple[int, int]) -> tuple[int, str] | None:
    best: tuple[int, int, str] | None = None  # (tier, -minor, target)
    for target in artifact.sass:
        major, minor, specific = _arch(target)
        if (major, minor) == cc:
            best = min(best or (99, 0, ""), (TIER_EXACT_SASS, -minor, target))
        elif major == cc[0] and minor < cc[1] and not specific:
            best = min(best or (99, 0, ""), (TIER_LOWER_MINOR_SASS, -minor, target))
    return (best[0], best[2]) if best else None


def _why_no_sass(artifact: Artifact, cc: tuple[int, int]) -> str:
    if not artifact.sass:
        return "no SASS"
    parts = []
    for target in artifact.sass:
        major, minor, specific = _arch(target)
        if major != cc[0]:
            parts.append(f"{target} SASS cannot run on CC {cc[0]}.{cc[1]}: different major")
        elif specific:
            parts.append(f"{target} SASS runs only on exactly CC {major}.{minor}")
        else:
            parts.append(f"{target} SASS needs CC >= {major}.{minor}")
    return "; ".join(parts[:3]) + ("; ..." if len(parts) > 3 else "")


def judge(artifact: Artifact, cc: tuple[int, int], driver: int) -> Candidate:
    """Accepts or rejects one artifact for a device of capability ``cc`` on a driver of version ``driver``."""

    def reject(code: str, why: str) -> Candidate:
        return Candidate(artifact.variant, artifact.cuda, False, code, why, TIER_REJECTED, artifact)

    if driver < artifact.min_driver:
        return reject(
            reasons.DRIVER_TOO_OLD,
            f"built with the CUDA {artifact.cuda_version} runtime, which needs a driver for CUDA "
            f">= {fmt_version(artifact.min_driver)}; the driver is {fmt_version(driver)}",
        )
    sass = _sass_tier(artifact, cc)
    if sass:
        tier, target = sass
        how = "exact SASS" if tier == TIER_EXACT_SASS else "SASS of a lower minor"
        return Candidate(
            artifact.variant, artifact.cuda, True, reasons.OK, f"{how} {target} for CC {cc[0]}.{cc[1]}", tier, artifact
        )
    no_sass = _why_no_sass(artifact, cc)
    for target in artifact.ptx:
        major, minor, _ = _arch(target)
        if (major, minor) > cc:
            continue
        need = ptx_driver_needed(artifact.ptx_isa)
        if need is None or driver < need:
            shown = f"CUDA {fmt_version(need)}" if need else "a newer CUDA than this cuplug knows"
            return reject(
                reasons.DRIVER_TOO_OLD,
                f"{no_sass}; PTX ISA {artifact.ptx_isa} needs driver {shown}, driver is {fmt_version(driver)}",
            )
        return Candidate(
            artifact.variant,
            artifact.cuda,
            True,
            reasons.OK,
            f"PTX {target} (ISA {artifact.ptx_isa}) JIT-compiled for CC {cc[0]}.{cc[1]}; first launch pays the JIT",
            TIER_PTX,
            artifact,
        )
    ptx = f"; PTX {', '.join(artifact.ptx)} needs a higher CC" if artifact.ptx else "; no PTX"
    return reject(reasons.NO_COMPATIBLE_ARTIFACT, no_sass + ptx)


def _order_key(c: Candidate) -> tuple[object, ...]:
    a = c.artifact
    cuda_version = tuple(int(p) for p in a.cuda_version.split(".")) if a else (0,)
    return (c.tier, tuple(-p for p in cuda_version), a.size if a else 0, c.variant, c.cuda or "")


def cpu_candidate(code: str = reasons.OK, reason: str = "CPU backend: always available") -> Candidate:
    return Candidate("cpu", None, True, code, reason, TIER_CPU)


def rank(
    artifacts: list[Artifact] | tuple[Artifact, ...],
    capability: tuple[int, int] | None,
    driver_version: int | None,
    *,
    forced: str | None = None,
    forced_cuda: str | None = None,
    device_problem: tuple[str, str] | None = None,
    unusable_packages: list[tuple[str, str]] | tuple[tuple[str, str], ...] = (),
) -> list[Candidate]:
    """Every artifact judged and ordered, the CPU backend last.

    ``device_problem`` (code, text) rejects every CUDA artifact for one reason
    (no driver, no device...). ``forced`` puts that variant first, accepted with
    code ``forced`` whatever the rules say (it is still verified and pinged, and
    the rest follow as the fall-through); ``forced="cpu"`` keeps only the CPU.
    ``unusable_packages`` (cuda, why) are installed packages whose manifest could
    not be read: each is a rejected ``manifest`` candidate (artifact-corrupt), so it shows.
    """
    broken = [
        Candidate("manifest", cuda, False, reasons.ARTIFACT_CORRUPT, why, TIER_REJECTED)
        for cuda, why in unusable_packages
    ]
    if forced == "cpu":
        return [*broken, cpu_candidate(reasons.FORCED, "CUPLUG_BACKEND=cpu")]
    if device_problem is None and capability is not None and capability < MIN_CAPABILITY:
        device_problem = (
            reasons.CAPABILITY_TOO_LOW,
            f"CC {capability[0]}.{capability[1]} is below the minimum {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}",
        )
    judged: list[Candidate] = []
    for a in artifacts:
        if device_problem is not None or capability is None or driver_version is None:
            code, why = device_problem or (reasons.NO_DEVICE, "no device facts")
            c = Candidate(a.variant, a.cuda, False, code, why, TIER_REJECTED, a)
        else:
            c = judge(a, capability, driver_version)
        if forced and a.variant == forced and (forced_cuda in (None, a.cuda)) and device_problem is None:
            c = dataclasses.replace(
                c,
                accepted=True,
                code=reasons.FORCED,
                tier=TIER_FORCED,
                reason=f"CUPLUG_BACKEND={forced}: forced ({'would be accepted: ' if c.accepted else 'rules say: '}{c.reason})",
            )
        judged.append(c)
    accepted = sorted((c for c in judged if c.accepted), key=_order_key)
    rejected = sorted((c for c in judged if not c.accepted), key=lambda c: (c.cuda or "", c.variant))
    return [*accepted, *rejected, *broken, cpu_candidate()]
