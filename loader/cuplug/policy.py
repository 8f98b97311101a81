"""The environment knobs, parsed once into a plain value with clear errors."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from .errors import ConfigError

TRUE = {"1", "true", "yes", "on"}
FALSE = {"", "0", "false", "no", "off"}
KNOBS = ("CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE", "CUPLUG_REQUIRE_CUDA", "CUPLUG_BACKEND", "CUPLUG_DEVICE")
CUDA_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_CACHE_PATH",
    "CUDA_CACHE_DISABLE",
    "CUDA_CACHE_MAXSIZE",
    "CUDA_DEVICE_ORDER",
    "CUDA_MODULE_LOADING",
    "LD_LIBRARY_PATH",
)


@dataclasses.dataclass(frozen=True)
class Policy:
    disable_cuda: bool = False
    disabled_by: str | None = None
    require_cuda: bool = False
    forced: str | None = None  # a variant name, "cpu", or None for auto
    forced_cuda: str | None = None  # "cuda12"/"cuda13" when CUPLUG_BACKEND=cuda12:sm80
    device: int = 0


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ConfigError(f"{name}={env[name]!r}: expected 1/0 (or true/false, yes/no, on/off)")


def from_env(env: Mapping[str, str] | None = None, device: int | str | None = None) -> Policy:
    env = os.environ if env is None else env
    disabled_by = next((n for n in ("CUPLUG_DISABLE_CUDA", "BACKEND_CUDA_DISABLE") if _flag(env, n)), None)
    # Case does not matter: CPU, Auto, CUDA13:PTX mean cpu, auto, cuda13:ptx (variant names are lowercase).
    forced = env.get("CUPLUG_BACKEND", "auto").strip().lower() or "auto"
    forced_cuda = None
    if ":" in forced:
        forced_cuda, forced = forced.split(":", 1)
        if not re.fullmatch(r"cuda\d{1,3}", forced_cuda):
            raise ConfigError(f"CUPLUG_BACKEND={env['CUPLUG_BACKEND']!r}: the part before ':' must be cuda12 or cuda13")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_]{0,31}", forced) or (forced_cuda and forced in ("cpu", "auto")):
        raise ConfigError(
            f"CUPLUG_BACKEND={forced!r}: expected auto, cpu, or a variant name (sm75, sm80, ptx, fatbin, ...)"
        )
    raw_device = device if device is not None else env.get("CUPLUG_DEVICE", "0").strip() or "0"
    try:
        if isinstance(raw_device, bool) or not re.fullmatch(r"\d{1,4}", str(raw_device).strip()):
            raise ValueError
        index = int(raw_device)
    except (TypeError, ValueError):
        raise ConfigError(f"CUPLUG_DEVICE/device={raw_device!r}: expected a device index 0, 1, ...") from None
    return Policy(
        disable_cuda=disabled_by is not None,
        disabled_by=disabled_by,
        require_cuda=_flag(env, "CUPLUG_REQUIRE_CUDA"),
        forced=None if forced == "auto" else forced,
        forced_cuda=forced_cuda,
        device=index,
    )


def relevant_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The cuplug and CUDA variables that are set, for the diagnostic report."""
    env = os.environ if env is None else env
    return {k: env[k] for k in (*KNOBS, *CUDA_VARS) if k in env}
