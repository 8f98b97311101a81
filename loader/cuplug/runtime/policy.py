"""The environment knobs, parsed once into a plain value with clear errors.

A value cuplug does not accept is a :class:`ConfigError` naming the variable and what it
accepts, never a silent default. ``CUPLUG_BACKEND`` may name any CUDA major
(``cuda14:fatbin``): which ones exist is what is installed, not a list kept here.
"""

from __future__ import annotations

import os

from ..contract.errors import ConfigError
from ..contract.manifest import is_cuda_major, is_variant_name
from ..contract.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")
KILL_SWITCHES = ("CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE")
KNOBS = (*KILL_SWITCHES, "CUPLUG_REQUIRE_CUDA", "CUPLUG_BACKEND", "CUPLUG_DEVICE", "CUPLUG_FASTPATH", "CUPLUG_SELFTEST")
SELFTEST = ("0", "1", "always")  # off; on, a pass remembered per device, driver and artifact; on every load
CUDA_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_CACHE_PATH",
    "CUDA_CACHE_DISABLE",
    "CUDA_CACHE_MAXSIZE",
    "CUDA_DEVICE_ORDER",
    "CUDA_MODULE_LOADING",
    "LD_LIBRARY_PATH",
)
MAX_DEVICE_DIGITS = 4


class Policy(Record):
    __slots__ = (
        "disable_cuda",
        "disabled_by",
        "require_cuda",
        "forced",
        "forced_cuda",
        "device",
        "raw_forced",
        "fastpath",
        "selftest",
    )
    disable_cuda: bool
    disabled_by: str | None  # the kill switch that is set
    require_cuda: bool
    forced: str | None  # a variant name, "cpu", or None for auto
    forced_cuda: str | None  # the CUDA major of CUPLUG_BACKEND=cuda13:sm80, else None
    device: int
    raw_forced: str | None  # CUPLUG_BACKEND as it was set, for messages
    fastpath: bool  # CUPLUG_FASTPATH: run() repeats a learned call in C (runtime/fastpath.py)
    selftest: str  # CUPLUG_SELFTEST: "0", "1" (default) or "always" (runtime/selftest.py)


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ConfigError(f"{name}={env[name]!r}: expected 1/0 (or true/false, yes/no, on/off)")


def _forced(raw: str | None) -> tuple[str | None, str | None]:
    """CUPLUG_BACKEND -> (variant or "cpu" or None for auto, CUDA major or None). Case does not matter:
    CPU, Auto, CUDA13:PTX mean cpu, auto, cuda13:ptx (variant names are lowercase)."""
    forced = (raw or "auto").strip().lower() or "auto"
    forced_cuda = None
    if ":" in forced:
        forced_cuda, forced = forced.split(":", 1)
        if not is_cuda_major(forced_cuda):
            raise ConfigError(
                f"CUPLUG_BACKEND={raw!r}: the part before ':' must name a CUDA major like cuda12 or cuda13"
            )
    if not is_variant_name(forced) or (forced_cuda and forced in ("cpu", "auto")):
        raise ConfigError(
            f"CUPLUG_BACKEND={raw!r}: expected auto, cpu, or a variant name (sm75, sm80, ptx, fatbin, ...) "
            "optionally after a CUDA major (cuda13:ptx)"
        )
    return (None if forced == "auto" else forced), forced_cuda


def _device(raw: int | str) -> int:
    text = str(raw).strip()
    if isinstance(raw, bool) or len(text) > MAX_DEVICE_DIGITS or not text.isdigit() or not text.isascii():
        raise ConfigError(f"CUPLUG_DEVICE/device={raw!r}: expected a device index 0, 1, ...")
    return int(text)


def from_env(env: Mapping[str, str] | None = None, device: int | str | None = None) -> Policy:
    env = os.environ if env is None else env
    disabled_by = next((n for n in KILL_SWITCHES if _flag(env, n)), None)
    raw_forced = env.get("CUPLUG_BACKEND")
    forced, forced_cuda = _forced(raw_forced)
    return Policy(
        disable_cuda=disabled_by is not None,
        disabled_by=disabled_by,
        require_cuda=_flag(env, "CUPLUG_REQUIRE_CUDA"),
        forced=forced,
        forced_cuda=forced_cuda,
        device=_device(device if device is not None else env.get("CUPLUG_DEVICE", "0").strip() or "0"),
        raw_forced=raw_forced,
        fastpath=fastpath(env),
        selftest=selftest(env),
    )


def fastpath(env: Mapping[str, str]) -> bool:
    """CUPLUG_FASTPATH: on unless set to 0 (or false/no/off): run() repeats a learned call in C (fastpath.py)."""
    return not env.get("CUPLUG_FASTPATH", "").strip() or _flag(env, "CUPLUG_FASTPATH")


def selftest(env: Mapping[str, str]) -> str:
    """CUPLUG_SELFTEST: 0 (off), 1 (the default: a pass is remembered per device, driver and artifact) or always."""
    value = env.get("CUPLUG_SELFTEST", "").strip().lower() or "1"
    value = {"true": "1", "yes": "1", "on": "1", "false": "0", "no": "0", "off": "0"}.get(value, value)
    if value not in SELFTEST:
        raise ConfigError(f"CUPLUG_SELFTEST={env['CUPLUG_SELFTEST']!r}: expected 0, 1 or always")
    return value


def relevant_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The cuplug and CUDA variables that are set, for the diagnostic report."""
    env = os.environ if env is None else env
    return {k: env[k] for k in (*KNOBS, *CUDA_VARS) if k in env}
