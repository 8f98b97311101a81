"""Selection: the whole decision, one pure function from facts to a :class:`Decision`.

No I/O here. Inputs are the policy (environment knobs), the driver's facts (or None when
the driver was not asked), and what discovery found installed (manifests, refused
registrations, the owner's extras); the output lists every candidate, the accepted ones
first in the order ``load()`` tries them, each rejected one with the reason a person
would want to read, the CPU backend last, and the code and reason of the decision
itself: the chosen candidate's, or why it is the CPU. ``load()`` executes it as it is.

The order is :data:`TIERS` (NVIDIA's compatibility rules; an LTO variant's LTO-IR, linked at load by nvJitLink,
after every SASS and before PTX); within a tier the newer CUDA
target kind wins (contract/targets.py: ``sm_90a`` before ``sm_90``, made for the device more
narrowly), then the newer CUDA toolkit (its runtime has the later fixes), then the smaller file,
then the variant name, so the order is deterministic with several extras installed. Artifacts
whose runtime needs a newer driver are rejected first. Which GPU a target runs on is the
contract's table (``sm_XX``, ``sm_XXa``, ``sm_XXf``, ``compute_XX[a|f]``, Tegra's exception).
Nothing here knows a CUDA major: ``cuda14`` is ranked like ``cuda13``.
"""

from __future__ import annotations

from ..contract import reasons, targets
from ..contract.cuda import MIN_CAPABILITY, ptx_driver_needed, version_str
from ..contract.errors import ConfigError
from ..contract.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, ClassVar

    from ..contract.manifest import Artifact
    from .discovery import Discovery
    from .driver import Device, ProbeResult
    from .policy import Policy


class Tier(Record):
    __slots__ = ("number", "name", "rule")
    number: int
    name: str
    rule: str


# The order candidates are tried in: the tier, then (newer CUDA, smaller file, variant name).
TIERS: tuple[Tier, ...] = (
    Tier(0, "forced", "CUPLUG_BACKEND names it: tried first, whatever the rules below say (still verified)"),
    Tier(1, "exact SASS", "SASS for exactly the device's architecture (a dedicated variant before a fatbin)"),
    Tier(2, "SASS of a lower minor", "SASS of the same major and a lower minor, the highest minor first"),
    Tier(
        3,
        "LTO-IR",
        "LTO-IR for a target <= the device's, linked for exactly it at load by an installed nvJitLink (the first "
        "load pays the link; the image is cached)",
    ),
    Tier(4, "PTX", "PTX for a target <= the device's, whose ISA the driver can JIT (the first launch pays the JIT)"),
    Tier(5, "CPU", "the CPU twin of the backend: always there, always last"),
)
TIER_FORCED, TIER_EXACT_SASS, TIER_LOWER_MINOR_SASS, TIER_LTO, TIER_PTX, TIER_CPU = (t.number for t in TIERS)
TIER_REJECTED = 99  # rejected candidates sort after every accepted one
# When every CUDA artifact is rejected, the decision names the most actionable reason first.
FALLBACK_PRIORITY: tuple[str, ...] = (
    reasons.CAPABILITY_TOO_LOW,
    reasons.DRIVER_TOO_OLD,
    reasons.NVJITLINK_UNAVAILABLE,
    reasons.NO_COMPATIBLE_ARTIFACT,
    reasons.ARTIFACT_CORRUPT,
)


class Candidate(Record):
    __slots__ = ("variant", "cuda", "accepted", "code", "reason", "tier", "artifact", "specificity", "link_for")
    _defaults: ClassVar[dict[str, Any]] = {"artifact": None, "specificity": 9, "link_for": None}
    variant: str
    cuda: str | None  # None for the CPU backend
    accepted: bool
    code: str  # reason code: ok, forced, or why it was rejected
    reason: str
    tier: int
    artifact: Artifact | None
    specificity: int  # the kind of the target that serves (targets.Kind.specificity): sm_90a before sm_90
    link_for: int | None  # an LTO variant served linked: the SM to link its LTO-IR for (90); None: as built

    @property
    def label(self) -> str:
        return f"{self.cuda}/{self.variant}" if self.cuda else self.variant


class Decision(Record):
    """The complete decision: every candidate in order (the CPU last), and what it says before any load."""

    __slots__ = ("backend", "candidates", "code", "reason")
    backend: str
    candidates: tuple[Candidate, ...]
    code: str  # the chosen candidate's code, or why the CPU serves (no-driver, driver-too-old, ...)
    reason: str

    @property
    def to_try(self) -> tuple[Candidate, ...]:
        """The accepted CUDA candidates, in the order load() tries them before the CPU."""
        return tuple(c for c in self.candidates if c.accepted and c.artifact is not None)

    @property
    def cpu(self) -> Candidate:
        return self.candidates[-1]

    @property
    def chosen(self) -> Candidate:
        """The candidate the decision names: the first to try, or the CPU."""
        first = self.candidates[0]
        if first.accepted and (first.artifact is not None or first.code == reasons.FORCED):
            return first
        return self.cpu

    @property
    def forced(self) -> Candidate | None:
        """The candidate CUPLUG_BACKEND forced, if any."""
        first = self.candidates[0]
        return first if first.code == reasons.FORCED else None


def _sass_match(artifact: Artifact, cc: tuple[int, int]) -> tuple[int, int, str] | None:
    """The artifact's best SASS for ``cc`` by the contract's rules (targets.best_sass): (tier, specificity, target)."""
    t = targets.best_sass(artifact.sass, cc)
    if t is None:
        return None
    return (TIER_EXACT_SASS if t.cc == cc else TIER_LOWER_MINOR_SASS), t.kind.specificity, t.text


def _why_no_sass(artifact: Artifact, cc: tuple[int, int]) -> str:
    if not artifact.sass:
        return "no SASS"
    parts = [targets.why_not(targets.parse(t), cc) for t in artifact.sass]
    return "; ".join(parts[:3]) + ("; ..." if len(parts) > 3 else "")


def judge(
    artifact: Artifact, cc: tuple[int, int], driver: int, jitlink: Mapping[int, tuple[int, int] | str] | None = None
) -> Candidate:
    """Accepts or rejects one artifact for a device of capability ``cc`` on a driver of version ``driver``;
    ``jitlink`` maps a CUDA major to the version of the nvJitLink installed for it (none: absent), or to why no
    LTO-IR can be linked here although it is (what reads the LTO-IR out of the library is missing)."""

    def reject(code: str, why: str) -> Candidate:
        return Candidate(artifact.variant, artifact.cuda, False, code, why, TIER_REJECTED, artifact)

    def accept(tier: int, why: str, specificity: int) -> Candidate:
        return Candidate(artifact.variant, artifact.cuda, True, reasons.OK, why, tier, artifact, specificity)

    if driver < artifact.min_driver:
        return reject(
            reasons.DRIVER_TOO_OLD,
            f"built with the CUDA {artifact.cuda_version} runtime, which needs a driver for CUDA "
            f">= {version_str(artifact.min_driver)}; the driver is {version_str(driver)}",
        )
    sass = _sass_match(artifact, cc)
    if sass:
        tier, specificity, target = sass
        return accept(tier, f"{TIERS[tier].name} {target} for CC {cc[0]}.{cc[1]}", specificity)
    no_sass = _why_no_sass(artifact, cc)
    no_lto = None
    lto = [t for t in map(targets.parse, artifact.lto) if targets.runs_on(t, cc)]
    if lto:
        found = (jitlink or {}).get(artifact.cuda_major)
        no_lto = found if isinstance(found, str) else targets.jitlink_problem(artifact.cuda_version, found, cc)
        if no_lto is None and isinstance(found, tuple):  # (None found is a problem: jitlink_problem says it)
            return accept(
                TIER_LTO,
                f"LTO-IR {lto[0].text} linked for sm_{cc[0]}{cc[1]} at load by nvJitLink {found[0]}.{found[1]}; "
                "the first load pays the link (cached)",
                lto[0].kind.specificity,
            )._replace(link_for=cc[0] * 10 + cc[1])
        no_sass = f"{no_sass}; {no_lto}"
    ptx = [t for t in map(targets.parse, artifact.ptx) if targets.runs_on(t, cc)]
    for t in sorted(ptx, key=lambda t: (t.kind.specificity, -t.major, -t.minor)):
        need = ptx_driver_needed(artifact.ptx_isa)
        if need is None or driver < need:
            shown = f"CUDA {version_str(need)}" if need else "a newer CUDA than this cuplug knows"
            return reject(
                reasons.DRIVER_TOO_OLD,
                f"{no_sass}; PTX ISA {artifact.ptx_isa} needs driver {shown}, driver is {version_str(driver)}",
            )
        return accept(
            TIER_PTX,
            f"PTX {t.text} (ISA {artifact.ptx_isa}) JIT-compiled for CC {cc[0]}.{cc[1]}; first launch pays the JIT",
            t.kind.specificity,
        )
    why_ptx = "; ".join(targets.why_not(targets.parse(p), cc) for p in artifact.ptx) if artifact.ptx else "no PTX"
    return reject(reasons.NVJITLINK_UNAVAILABLE if no_lto else reasons.NO_COMPATIBLE_ARTIFACT, f"{no_sass}; {why_ptx}")


def _order_key(c: Candidate) -> tuple[object, ...]:
    a = c.artifact
    cuda_version = tuple(int(p) for p in a.cuda_version.split(".")) if a else (0,)
    return (c.tier, c.specificity, tuple(-p for p in cuda_version), a.size if a else 0, c.variant, c.cuda or "")


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
    jitlink: Mapping[int, tuple[int, int] | str] | None = None,
) -> list[Candidate]:
    """Every artifact judged and ordered, the CPU backend last.

    ``device_problem`` (code, text) rejects every CUDA artifact for one reason
    (no driver, no device...). ``forced`` puts that variant first, accepted with
    code ``forced`` whatever the rules say (it is still verified and pinged, and
    the rest follow as the fall-through); ``forced="cpu"`` keeps only the CPU.
    ``unusable_packages`` (cuda, why) are installed packages whose manifest could
    not be read: each is a rejected ``manifest`` candidate (artifact-corrupt), so it shows.
    ``jitlink``: the nvJitLink version installed per CUDA major (LTO variants, judge()).
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
            c = judge(a, capability, driver_version, jitlink)
        if forced and a.variant == forced and forced_cuda in (None, a.cuda) and device_problem is None:
            rules = "would be accepted: " if c.accepted else "rules say: "
            c = c._replace(
                accepted=True,
                code=reasons.FORCED,
                tier=TIER_FORCED,
                reason=f"CUPLUG_BACKEND={forced}: forced ({rules}{c.reason})",
            )
        judged.append(c)
    accepted = sorted((c for c in judged if c.accepted), key=_order_key)
    rejected = sorted((c for c in judged if not c.accepted), key=lambda c: (c.cuda or "", c.variant))
    return [*accepted, *rejected, *broken, cpu_candidate()]


def device_facts(probe: ProbeResult, index: int) -> tuple[Device | None, tuple[str, str] | None]:
    """The device the policy names, or (code, why) it cannot be used."""
    if probe.code != reasons.OK:
        return None, (probe.code, probe.reason)
    dev = next((d for d in probe.devices if d.index == index), None)
    if dev is None:
        return None, (reasons.NO_DEVICE, f"CUPLUG_DEVICE={index} but the driver shows {len(probe.devices)} device(s)")
    if dev.capability is None:  # a fact the driver failed to give is unknown, never 0.0
        return None, (reasons.DRIVER_INIT_FAILED, f"device {index}: {dev.problem or 'capability unknown'}")
    return dev, None


def check_forced(policy: Policy, found: Discovery) -> None:
    """CUPLUG_BACKEND naming a variant no installed artifact has is a typo, not a wish for auto-selection."""
    if policy.forced is None or policy.forced == "cpu":
        return
    artifacts = found.artifacts
    if any(a.variant == policy.forced and policy.forced_cuda in (None, a.cuda) for a in artifacts):
        return
    installed = sorted({f"{a.cuda}:{a.variant}" for a in artifacts})
    wanted = f"{policy.forced_cuda + ':' if policy.forced_cuda else ''}{policy.forced}"
    raise ConfigError(
        f"CUPLUG_BACKEND={policy.raw_forced!r}: no installed artifact of backend '{found.backend}' is "
        f"{wanted}; installed: {', '.join(installed) or 'none'}; or cpu, auto (case does not matter)"
    )


def install_hint(found: Discovery) -> str:
    if not found.extras:
        return f"install the CUDA extra of the package that provides '{found.backend}'"
    dist = found.owner_name.replace("_", "-")
    return "pip install " + " or ".join(f"'{dist}[{extra}]'" for extra in found.extras)


def decide(
    backend: str,
    policy: Policy,
    probe: ProbeResult | None,
    found: Discovery,
    jitlink: Mapping[int, tuple[int, int] | str] | None = None,
) -> Decision:
    """The decision for ``backend`` from the facts; ``probe`` is None when the driver was not asked
    (CUDA disabled, or CUPLUG_BACKEND=cpu); ``jitlink`` the nvJitLink versions found (LTO variants).
    Raises ConfigError for a forced variant nobody installed."""
    if policy.disable_cuda:
        why = f"{policy.disabled_by}=1: CUDA disabled, libcuda.so.1 not opened"
        return Decision(backend, (cpu_candidate(reasons.DISABLED, why),), reasons.DISABLED, why)
    check_forced(policy, found)
    artifacts = found.artifacts
    unusable = found.unusable
    dev, problem = (None, None) if probe is None else device_facts(probe, policy.device)
    candidates = tuple(
        rank(
            artifacts,
            dev.capability if dev else None,
            probe.driver_version if probe else None,
            forced=policy.forced,
            forced_cuda=policy.forced_cuda,
            device_problem=problem,
            unusable_packages=unusable,
            jitlink=jitlink,
        )
    )
    first = candidates[0]
    if first.accepted and (first.artifact is not None or first.code == reasons.FORCED):
        return Decision(backend, candidates, first.code, first.reason)
    # Falling back to the CPU: say why in one code.
    if problem is not None:
        code, why = problem
    elif not artifacts and unusable:
        code, why = reasons.ARTIFACT_CORRUPT, "no usable manifest: " + "; ".join(why for _, why in unusable)
    elif not artifacts:
        code = reasons.NO_BACKEND_INSTALLED
        why = f"no CUDA artifact of backend '{backend}' installed ({install_hint(found)})"
        if found.refused:
            why += "; not trusted: " + ", ".join(sorted({r.distribution for r in found.refused}))
    else:
        codes = {c.code for c in candidates if not c.accepted}
        code = next((p for p in FALLBACK_PRIORITY if p in codes), reasons.NO_COMPATIBLE_ARTIFACT)
        why = "every installed artifact rejected; e.g. " + next(c.reason for c in candidates if c.code == code)
    return Decision(backend, candidates, code, why)
