"""The kinds of CUDA device code and which GPUs each runs on: one table, its sources cited.

The build kit reads it to check a declared target against a toolchain (and to name the fix), the loader to
judge an artifact for a device (``runs_on``), the tools to say what an artifact supports. A target is spelled
as nvcc spells it: ``sm_90`` (SASS), ``sm_90a`` (arch-specific SASS), ``sm_100f`` (family SASS),
``compute_75`` (PTX), ``compute_90a`` / ``compute_100f`` (arch-specific / family PTX), ``lto_75`` (LTO-IR, linked
for the exact GPU at load by nvJitLink: docs/lto.md).

Sources:
  [ada]  NVIDIA Ada GPU Architecture Compatibility Guide, 1.2: "A cubin generated for a certain compute
         capability is supported to run on any GPU with the same major revision and same or higher minor
         revision"; PTX is JIT-compiled for any later GPU.
  [cpg]  CUDA Programming Guide 5.1.2 "Feature Availability": arch-specific features (``a``) run on exactly that
         compute capability; family-specific features (``f``, CUDA 12.9+) on the devices of the family, the same
         major with an equal or higher minor (``compute_100f``: 10.0 and 10.3; ``compute_120f``: 12.0, 12.1).
  [blog] NVIDIA Technical Blog, "NVIDIA Blackwell and NVIDIA CUDA 12.9 Introduce Family-Specific Architecture
         Features" (2025): the ``f`` suffix and its family rule.
  [tegra] CUDA C++ Programming Guide (12.x), 6.1.2 "Binary Compatibility", note: "Binary compatibility is
         supported only for the desktop. It is not supported for Tegra. Also, the binary compatibility between
         desktop and Tegra is not supported." So an sm_80 cubin does not serve a Jetson Orin (8.7), which needs
         its own SASS or PTX (jax PR #40492, CuPy PR #6875), and a Tegra GPU takes only SASS of exactly its CC.
  [cuda13] CUDA 13.0 release notes: offline compilation for architectures before Turing (sm_50 .. sm_72)
         removed; Jetson Thor renamed from sm_101 to sm_110.
  [cuda-notes] CUDA 12.8 release notes (sm_100, sm_101, sm_120), 12.9 (sm_103, sm_121), 13.0 (sm_110).
  [nvjitlink] nvJitLink documentation, "Compatibility", and the MathDx LTO requirements note: LTO-IR is linked
         for any later architecture; the compiler that made it must be of the same CUDA major as nvJitLink and
         of the same or an older version (``jitlink_problem``).
"""

from __future__ import annotations

from .record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Kind(Record):
    """One kind of device code: its spelling, what it runs on, since which CUDA, and whence the rule."""

    __slots__ = ("name", "image", "suffix", "rule", "since_cuda", "source", "specificity")
    name: str
    image: str  # "sass" (a cubin: runs as is), "ptx" (JIT-compiled by the driver) or "lto" (linked by nvJitLink)
    suffix: str  # "", "a" or "f"
    rule: str
    since_cuda: int  # the oldest toolkit (cudaRuntimeGetVersion form) that can build it
    source: str
    specificity: int  # among targets that serve one device: lower is preferred (made for it more narrowly)


KINDS: tuple[Kind, ...] = (
    Kind("sm_XXa", "sass", "a", "exactly compute capability XX", 12000, "[cpg]", 0),
    Kind("sm_XXf", "sass", "f", "the family of XX: the same major, an equal or higher minor", 12090, "[cpg] [blog]", 1),
    Kind(
        "sm_XX",
        "sass",
        "",
        "the same major, an equal or higher minor; not across Tegra and desktop GPUs",
        0,
        "[ada] [tegra]",
        2,
    ),
    Kind("compute_XXa", "ptx", "a", "exactly compute capability XX, JIT-compiled", 12000, "[cpg]", 3),
    Kind("compute_XXf", "ptx", "f", "the family of XX (desktop GPUs), JIT-compiled", 12090, "[cpg] [blog]", 4),
    Kind("compute_XX", "ptx", "", "any GPU of compute capability >= XX whose driver knows the PTX ISA", 0, "[ada]", 5),
    Kind(
        "lto_XX",
        "lto",
        "",
        "any GPU of compute capability >= XX, linked for exactly it at load by an nvJitLink of the same CUDA major, "
        "as new or newer than the compiler",
        12000,
        "[nvjitlink]",
        6,
    ),
)
BY_SPELLING = {(k.image, k.suffix): k for k in KINDS}

# Tegra (integrated) GPUs: binary compatibility across minors does not cross between them and desktop GPUs [tegra].
TEGRA: frozenset[tuple[int, int]] = frozenset({(5, 3), (6, 2), (7, 2), (8, 7), (10, 1), (11, 0)})
# A target a toolkit renamed: (old name, new name, from which CUDA) [cuda13].
RENAMED: tuple[tuple[str, str, int], ...] = (("101", "110", 13000),)
# The first CUDA (major, minor) that compiles for each SM newer than Hopper [cuda-notes]: an older nvJitLink cannot
# link for it (every SM up to 9.0 since CUDA 12.0, the first with nvJitLink).
FIRST_CUDA_FOR_SM: dict[int, tuple[int, int]] = {
    100: (12, 8), 101: (12, 8), 120: (12, 8), 103: (12, 9), 121: (12, 9), 110: (13, 0),
}  # fmt: skip
# NVIDIA's PyPI wheel of nvJitLink per CUDA major, where it is not plain nvidia-nvjitlink (CUDA 13 dropped the suffix).
JITLINK_WHEEL: dict[int, str] = {12: "nvidia-nvjitlink-cu12"}
# The oldest architecture each toolkit major compiles for offline [cuda13].
OLDEST_BY_MAJOR: dict[int, tuple[int, int]] = {12: (5, 0), 13: (7, 5)}


class Target(Record):
    __slots__ = ("text", "kind", "major", "minor")
    text: str  # as spelled: "sm_90a"
    kind: Kind
    major: int
    minor: int

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def number(self) -> str:
        """'90a' for sm_90a / compute_90a: what nvcc's -arch and CMake's CUDA_ARCHITECTURES take."""
        return self.text.partition("_")[2]


def parse(text: Any) -> Target:
    """'sm_86' / 'sm_90a' / 'sm_100f' / 'compute_75'; ValueError for anything else."""
    if not isinstance(text, str):
        raise ValueError(f"not a CUDA target: {text!r}")
    prefix, sep, rest = text.partition("_")
    suffix = rest[-1:] if rest[-1:] in ("a", "f") else ""
    digits = rest[: len(rest) - len(suffix)]
    image = {"sm": "sass", "compute": "ptx", "lto": "lto"}.get(prefix)
    bad_lto = image == "lto" and suffix != ""  # nvcc has no lto_90a / lto_100f
    if image is None or bad_lto or not sep or not 2 <= len(digits) <= 4 or not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"not a CUDA target: {text!r} (expected e.g. sm_90, sm_90a, sm_100f, compute_75, lto_75)")
    return Target(text, BY_SPELLING[(image, suffix)], int(digits[:-1]), int(digits[-1]))


def _desktop(target: tuple[int, int], device: tuple[int, int]) -> bool:
    """Binary compatibility across minors holds between desktop GPUs only [tegra]."""
    return target not in TEGRA and device not in TEGRA


def runs_on(target: Target, device: tuple[int, int]) -> bool:
    """Whether code of ``target`` can run on a GPU of compute capability ``device`` (for PTX: whether the driver
    may JIT it there; whether it knows the ISA is the driver's question, cuda.ptx_driver_needed)."""
    kind = target.kind
    if kind.suffix == "a":
        return target.cc == device
    if kind.image != "sass" and kind.suffix == "":  # plain PTX, LTO-IR: any later GPU (JIT-compiled, linked)
        return target.cc <= device
    # SASS, and family PTX: the same major at an equal or higher minor, among desktop GPUs (a family's members:
    # compute_100f serves 10.0 and 10.3, not Jetson Thor's 10.1 [cpg]); a Tegra GPU only its own CC [tegra]
    same_major_up = target.major == device[0] and target.minor <= device[1]
    return target.cc == device or (same_major_up and _desktop(target.cc, device))


def best_sass(texts: list[str] | tuple[str, ...], device: tuple[int, int]) -> Target | None:
    """The SASS target among ``texts`` a device of ``device`` runs best (the loader's order): exact before a lower
    minor, the narrower kind first (sm_90a before sm_90), the higher minor first; None when none runs there."""
    serving = [t for t in map(parse, texts) if runs_on(t, device)]
    return min(serving, key=lambda t: (t.cc != device, t.kind.specificity, -t.minor, t.text), default=None)


def why_not(target: Target, device: tuple[int, int]) -> str:
    """Why ``target`` cannot run on ``device``, in the words of its rule (runs_on(...) is False)."""
    cc = f"{device[0]}.{device[1]}"
    kind = target.kind
    code = {"sass": "SASS", "ptx": "PTX", "lto": "LTO-IR"}[kind.image]
    if kind.suffix == "a":
        return f"{target.text} {code} runs only on exactly CC {target.major}.{target.minor}"
    if target.major != device[0] and (kind.image == "sass" or kind.suffix == "f"):
        return f"{target.text} {code} cannot run on CC {cc}: different major"
    if target.cc > device:
        return f"{target.text} {code} needs CC >= {target.major}.{target.minor}"
    if not _desktop(target.cc, device):
        tegra = cc if device in TEGRA else f"{target.major}.{target.minor}"
        return (
            f"{target.text} {code} cannot run on CC {cc}: CC {tegra} is a Tegra GPU, which takes SASS of exactly its CC"
        )
    return f"{target.text} {code} cannot run on CC {cc}"


def buildable(target: Target, cuda_version: int | None, listed: frozenset[str]) -> str | None:
    """None when a toolkit of ``cuda_version`` (12040) that lists ``listed`` architectures ("90", "100", ...)
    can build ``target``; else why not, naming the fix. ``cuda_version`` None: the listing alone is checked."""
    base = f"{target.major}{target.minor}"
    kind = target.kind
    if cuda_version is None:
        return None if base in listed else f"{target.text}: arch {base} is not supported by this nvcc ({_has(listed)})"
    for old, new, since in RENAMED:
        if base == old and cuda_version >= since:
            return f"{target.text}: CUDA {cuda_version // 1000} renamed sm_{old} to sm_{new}; declare {target.text.replace(old, new)}"
        if base == new and cuda_version < since and new not in listed:
            return f"{target.text}: CUDA {cuda_version // 1000}.{cuda_version % 1000 // 10} calls it sm_{old}; declare {target.text.replace(new, old)} there, or build with CUDA {since // 1000}"
    oldest = OLDEST_BY_MAJOR.get(cuda_version // 1000)
    if oldest and target.cc < oldest:
        return (
            f"{target.text}: CUDA {cuda_version // 1000} compiles for CC >= {oldest[0]}.{oldest[1]} only; "
            f"build it with CUDA 12 or drop it"
        )
    if cuda_version < kind.since_cuda:
        need = f"{kind.since_cuda // 1000}.{kind.since_cuda % 1000 // 10}"
        return f"{target.text}: {kind.name} targets need CUDA >= {need}; this toolkit is {cuda_version // 1000}.{cuda_version % 1000 // 10}"
    if base not in listed:
        return f"{target.text}: arch {base} is not supported by this nvcc ({_has(listed)})"
    return None


def _has(listed: frozenset[str]) -> str:
    return f"it has {', '.join(sorted(listed, key=int))}"


def describe(texts: list[str] | tuple[str, ...]) -> str:
    """What a set of SASS/PTX targets serves, for people: '7.5-7.x, 8.0-8.x, 8.7, 9.0 exactly (sm_90a), 10.0-10.x
    family (sm_100f), PTX >= 7.5' (plain desktop SASS: the lowest minor of each major says it)."""
    parts: list[str] = []
    lowest: dict[int, int] = {}
    for t in sorted(map(parse, texts), key=lambda t: (t.kind.image != "sass", t.cc, t.kind.specificity)):
        if t.kind.image == "sass" and not t.kind.suffix and t.cc not in TEGRA:
            if t.major in lowest:
                continue
            lowest[t.major] = t.minor
        cc = f"{t.major}.{t.minor}"
        if t.kind.suffix == "a":
            parts.append(f"{cc} exactly ({t.text})")
        elif t.kind.suffix == "f":
            parts.append(f"{cc}-{t.major}.x family ({t.text})")
        elif t.kind.image == "ptx":
            parts.append(f"PTX >= {cc}")
        elif t.kind.image == "lto":
            parts.append(f"LTO-IR >= {cc} (linked at load by nvJitLink)")
        else:
            parts.append(cc if t.cc in TEGRA else f"{cc}-{t.major}.x")
    return ", ".join(parts)


def jitlink_problem(
    built_with: str, jitlink: tuple[int, int] | None, device: tuple[int, int] | None = None
) -> str | None:
    """None when an nvJitLink of version ``jitlink`` (major, minor) can link LTO-IR a CUDA ``built_with`` ("13.0")
    compiler made [nvjitlink] for a GPU of CC ``device`` [cuda-notes]; else why not, naming the fix. ``jitlink``
    None: none was found."""
    major, _, minor = built_with.partition(".")
    need = (int(major), int(minor.partition(".")[0] or 0))
    wheel = JITLINK_WHEEL.get(need[0], "nvidia-nvjitlink")
    fix = f"pip install '{wheel}>={need[0]}.{need[1]},<{need[0] + 1}'"
    if jitlink is None:
        return f"LTO-IR needs nvJitLink {need[0]}.x >= {need[0]}.{need[1]}, none found ({fix})"
    if jitlink[0] != need[0] or jitlink < need:
        return (
            f"LTO-IR of CUDA {built_with} needs nvJitLink {need[0]}.x >= {need[0]}.{need[1]}, found "
            f"{jitlink[0]}.{jitlink[1]} ({fix})"
        )
    sm = device[0] * 10 + device[1] if device is not None else 0
    first = FIRST_CUDA_FOR_SM.get(sm)
    if first is not None and jitlink < first:
        known = f"CUDA {first[0]}.{first[1]} is the first to know it"
        if need[0] < first[0]:
            return f"nvJitLink {jitlink[0]}.{jitlink[1]} cannot link for sm_{sm}: {known}, and this LTO-IR is CUDA {need[0]}'s"
        return f"nvJitLink {jitlink[0]}.{jitlink[1]} cannot link for sm_{sm}: {known} (pip install '{wheel}>={first[0]}.{first[1]}')"
    return None
