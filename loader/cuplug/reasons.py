"""Stable reason codes (DESIGN.md) and the CLI exit code each one maps to."""

from __future__ import annotations

DISABLED = "disabled"
NO_DRIVER = "no-driver"
DRIVER_INIT_FAILED = "driver-init-failed"
NO_DEVICE = "no-device"
CAPABILITY_TOO_LOW = "capability-too-low"
DRIVER_TOO_OLD = "driver-too-old"
NO_BACKEND_INSTALLED = "no-backend-installed"
NO_COMPATIBLE_ARTIFACT = "no-compatible-artifact"
ARTIFACT_CORRUPT = "artifact-corrupt"
ABI_MISMATCH = "abi-mismatch"
LOAD_FAILED = "load-failed"
KERNEL_IMAGE_MISSING = "kernel-image-missing"
FORCED = "forced"
OK = "ok"

ALL = (
    DISABLED,
    NO_DRIVER,
    DRIVER_INIT_FAILED,
    NO_DEVICE,
    CAPABILITY_TOO_LOW,
    DRIVER_TOO_OLD,
    NO_BACKEND_INSTALLED,
    NO_COMPATIBLE_ARTIFACT,
    ARTIFACT_CORRUPT,
    ABI_MISMATCH,
    LOAD_FAILED,
    KERNEL_IMAGE_MISSING,
    FORCED,
    OK,
)

# `cuplug probe` exit codes: the first failing step names the code.
EXIT_OK = 0
EXIT_KERNEL_FAILED = 17
EXIT_CODES: dict[str, int] = {
    OK: 0,
    NO_DRIVER: 10,
    DRIVER_INIT_FAILED: 10,
    NO_DEVICE: 11,
    CAPABILITY_TOO_LOW: 12,
    DRIVER_TOO_OLD: 13,
    NO_BACKEND_INSTALLED: 14,
    NO_COMPATIBLE_ARTIFACT: 14,
    ARTIFACT_CORRUPT: 15,
    ABI_MISMATCH: 16,
    LOAD_FAILED: 16,
    KERNEL_IMAGE_MISSING: 17,
    DISABLED: 20,
    FORCED: 0,
}
