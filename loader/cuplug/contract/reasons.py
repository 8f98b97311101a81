"""Stable reason codes (DESIGN.md) and the exit code of each, as one table.

The loader's decisions and the tools' JSON carry the codes; ``cuplug probe`` exits
with the code's number. The CLI's ``--help``, the docs' table and the README's list are
made from (or checked against) :data:`TABLE`.
"""

from __future__ import annotations

DISABLED = "disabled"
NO_DRIVER = "no-driver"
DRIVER_INIT_FAILED = "driver-init-failed"
NO_DEVICE = "no-device"
CAPABILITY_TOO_LOW = "capability-too-low"
DRIVER_TOO_OLD = "driver-too-old"
NO_BACKEND_INSTALLED = "no-backend-installed"
NO_COMPATIBLE_ARTIFACT = "no-compatible-artifact"
NVJITLINK_UNAVAILABLE = "nvjitlink-unavailable"
ARTIFACT_CORRUPT = "artifact-corrupt"
ABI_MISMATCH = "abi-mismatch"
LOAD_FAILED = "load-failed"
KERNEL_IMAGE_MISSING = "kernel-image-missing"
SELF_TEST_MISMATCH = "self-test-mismatch"
FORCED = "forced"
OK = "ok"

# (code, `cuplug probe` exit code, what it means): the order is the order of the steps.
TABLE: tuple[tuple[str, int, str], ...] = (
    (OK, 0, "a CUDA backend loaded and its result checked out"),
    (FORCED, 0, "CUPLUG_BACKEND chose the candidate (still verified and pinged)"),
    (NO_DRIVER, 10, "libcuda.so.1 is not found: no NVIDIA driver"),
    (DRIVER_INIT_FAILED, 10, "the driver is there but cuInit or a fact it should give failed"),
    (NO_DEVICE, 11, "the driver shows no device (or not the one CUPLUG_DEVICE names)"),
    (CAPABILITY_TOO_LOW, 12, "the GPU is older than the oldest architecture built (CC 7.5)"),
    (DRIVER_TOO_OLD, 13, "the driver cannot run the CUDA runtime, or JIT the PTX, of any artifact"),
    (NO_BACKEND_INSTALLED, 14, "no CUDA extra installed (pip install 'cuplug[cuda13]')"),
    (NO_COMPATIBLE_ARTIFACT, 14, "extras installed, but no artifact holds code this GPU can run"),
    (
        NVJITLINK_UNAVAILABLE,
        14,
        "only an LTO variant could serve, and no nvJitLink of its CUDA major (new enough) is installed, or pyelftools, "
        "which reads its LTO-IR, is not",
    ),
    (ARTIFACT_CORRUPT, 15, "a file or manifest does not match what was built (size, sha256, ELF, path)"),
    (ABI_MISMATCH, 16, "the artifact speaks another backend ABI version than this cuplug"),
    (LOAD_FAILED, 16, "dlopen, create() or ping() failed"),
    (KERNEL_IMAGE_MISSING, 17, "the artifact loaded but holds no kernel image for this GPU"),
    (SELF_TEST_MISMATCH, 17, "the artifact loaded, but an op's sample gave another result than the CPU twin's"),
    (DISABLED, 20, "CUPLUG_DISABLE_CUDA=1 (or BACKEND_CUDA_DISABLE=1): CUDA never touched"),
)
ALL = tuple(code for code, _, _ in TABLE)
EXIT_CODES: dict[str, int] = {code: number for code, number, _ in TABLE}
MEANING: dict[str, str] = {code: text for code, _, text in TABLE}

# The exits that are no reason code's: what else `cuplug probe` (and the other tools) can end with.
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_KERNEL_FAILED = 17
OTHER_EXITS: tuple[tuple[int, str], ...] = (
    (EXIT_INTERNAL, "an internal error of cuplug (a bug: please report it)"),
    (EXIT_USAGE, "bad usage or configuration (e.g. an invalid CUPLUG_* value)"),
    (EXIT_KERNEL_FAILED, "a kernel failed or was wrong"),
)


def exit_help() -> str:
    """``cuplug probe --help``'s epilog: every exit code, with the reason codes that end there."""
    rows: dict[int, list[str]] = {EXIT_OK: ["GPU ok (or a correct CPU result with --allow-cpu)"]}
    for code, number, _ in TABLE:
        if number != EXIT_OK:
            rows.setdefault(number, []).append(code)
    for number, text in OTHER_EXITS:
        rows.setdefault(number, []).append(text)
    lines = ["exit codes (the first failing step):"]
    lines += [f"  {number:>2}  {' or '.join(rows[number])}" for number in sorted(rows)]
    return "\n".join(lines)
