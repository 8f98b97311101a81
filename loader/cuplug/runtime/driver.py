"""Driver facts through ``libcuda.so.1`` and ctypes, opened lazily.

Only these entry points are called: cuInit, cuDriverGetVersion,
cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute, cuDeviceGetName,
cuDeviceTotalMem_v2, cuDeviceGetUuid_v2 (or cuDeviceGetUuid), cuGetErrorName.
Any of them may be missing or fail or lie: a fact that could not be read is None
(unknown) and the failing call is in the reason, never a 0 that reads as a fact.
Every loop over a driver-reported number is bounded (at most MAX_DEVICES devices),
every string read from the driver is bounded and decoded whatever its bytes.
CUDA_VISIBLE_DEVICES is applied by the driver inside cuInit; it is reported,
never re-applied on top of the driver's numbering.
"""

from __future__ import annotations

import ctypes
import os
import sys

from ..contract import reasons
from ..contract.cuda import version_str
from ..contract.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CUDA_ERROR_NO_DEVICE = 100
LIBCUDA = "libcuda.so.1"


MAX_DEVICES = 64  # a driver reporting more is lying; its devices are not enumerated
MAX_NAME_BYTES = 256
MAX_ERROR_NAME_BYTES = 128


class Device(Record):
    """One device as the driver reported it; a fact the driver failed to give is None (unknown), never 0."""

    __slots__ = ("index", "name", "capability", "memory_bytes", "uuid", "problem")
    _defaults: ClassVar[dict[str, Any]] = {"problem": None}
    index: int
    name: str | None
    capability: tuple[int, int] | None
    memory_bytes: int | None
    uuid: str | None
    problem: str | None  # why a fact is unknown (the failing call and its error)

    @property
    def capability_str(self) -> str | None:
        return None if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"


class ProbeResult(Record):
    """What the driver says; ``code`` is ``ok`` or the reason code of the failing step."""

    __slots__ = ("code", "reason", "driver_found", "driver_path", "driver_version", "devices", "visible_devices")
    _defaults: ClassVar[dict[str, Any]] = {
        "driver_found": False,
        "driver_path": None,
        "driver_version": None,
        "devices": (),
        "visible_devices": None,
    }
    code: str
    reason: str
    driver_found: bool
    driver_path: str | None
    driver_version: int | None  # cuDriverGetVersion, e.g. 13000; None when it failed or lied
    devices: tuple[Device, ...]
    visible_devices: str | None

    @property
    def driver_version_str(self) -> str | None:
        return version_str(self.driver_version)

    def to_json(self) -> dict[str, Any]:
        d = self._asdict()
        d["devices"] = [dict(x._asdict(), capability=x.capability_str) for x in self.devices]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProbeResult:
        devices = []
        for x in d.get("devices", ()):
            cap = x.get("capability")
            parts = tuple(int(p) for p in cap.split(".")) if isinstance(cap, str) else None
            devices.append(
                Device(
                    x["index"],
                    x.get("name"),
                    (parts[0], parts[1]) if parts and len(parts) == 2 else None,
                    x.get("memory_bytes"),
                    x.get("uuid"),
                    x.get("problem"),
                )
            )
        return cls(**{**d, "devices": tuple(devices)})


def _loaded_path(lib: ctypes.CDLL) -> str | None:
    """The file the dynamic linker actually opened, read from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:  # address perms offset dev inode [path, which may hold spaces]
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) > 5 else ""
                if path.startswith("/") and os.path.basename(path).startswith("libcuda.so"):
                    return path
    except (OSError, UnicodeDecodeError):
        pass
    return None


def _text(ptr: int | None, limit: int) -> str:
    """A C string of at most ``limit`` bytes, decoded whatever its bytes (non-UTF-8 escaped)."""
    if not ptr:
        return ""
    libc = ctypes.CDLL(None)
    libc.strnlen.restype = ctypes.c_size_t
    libc.strnlen.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    n = libc.strnlen(ptr, limit)
    return ctypes.string_at(ptr, n).decode("utf-8", "backslashreplace")


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    """The driver's name of an error (cuGetErrorName), or ``CUDA error <code>`` when it gives none."""
    fn = getattr(lib, "cuGetErrorName", None)
    name = ctypes.c_void_p()
    if fn is not None and fn(code, ctypes.byref(name)) == 0 and name.value:
        text = _text(name.value, MAX_ERROR_NAME_BYTES)
        if text:
            return text
    return f"CUDA error {code}"


def _format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


REQUIRED = ("cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute")


def _device(lib: ctypes.CDLL, index: int) -> Device:
    """One device's facts; each failing call leaves its fact unknown and says why in ``problem``."""
    problems: list[str] = []

    def call(what: str, fn: Any, *args: Any) -> bool:
        if fn is None:
            problems.append(f"the driver lacks {what}")
            return False
        rc = fn(*args)
        if rc != 0:
            problems.append(f"{what} failed: {_error_name(lib, rc)} ({rc})")
        return bool(rc == 0)

    dev = ctypes.c_int(0)
    if not call(f"cuDeviceGet({index})", getattr(lib, "cuDeviceGet", None), ctypes.byref(dev), index):
        return Device(index, None, None, None, None, "; ".join(problems))
    major, minor = ctypes.c_int(-1), ctypes.c_int(-1)
    get_attr = getattr(lib, "cuDeviceGetAttribute", None)
    capability: tuple[int, int] | None = None
    ok_major = call(
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)",
        get_attr,
        ctypes.byref(major),
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        dev,
    )
    ok_minor = call(
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)",
        get_attr,
        ctypes.byref(minor),
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        dev,
    )
    if ok_major and ok_minor:
        if 0 < major.value < 100 and 0 <= minor.value < 10:
            capability = (major.value, minor.value)
        else:
            problems.append(f"the driver reports capability {major.value}.{minor.value}, which no GPU has")
    name_buf = ctypes.create_string_buffer(MAX_NAME_BYTES)
    name = None
    if call("cuDeviceGetName", getattr(lib, "cuDeviceGetName", None), name_buf, MAX_NAME_BYTES - 1, dev):
        name = name_buf.value.decode("utf-8", "backslashreplace")
    mem = ctypes.c_size_t(0)
    total = getattr(lib, "cuDeviceTotalMem_v2", None) or getattr(lib, "cuDeviceTotalMem", None)
    memory = mem.value if call("cuDeviceTotalMem_v2", total, ctypes.byref(mem), dev) else None
    uuid_buf = ctypes.create_string_buffer(16)
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or getattr(lib, "cuDeviceGetUuid", None)
    uuid = _format_uuid(uuid_buf.raw) if call("cuDeviceGetUuid", get_uuid, uuid_buf, dev) else None
    return Device(index, name, capability, memory, uuid, "; ".join(problems) or None)


def probe() -> ProbeResult:
    """Opens the driver and reads its facts, in this process. Never raises: a failure is the result's code."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        lib = ctypes.CDLL(LIBCUDA, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return ProbeResult(reasons.NO_DRIVER, f"{LIBCUDA} not found: {exc}", visible_devices=visible)
    path = _loaded_path(lib)
    found = ProbeResult(reasons.OK, "", driver_found=True, driver_path=path, visible_devices=visible)

    def failed(code: str, reason: str) -> ProbeResult:
        return found._replace(code=code, reason=reason)

    missing = [name for name in REQUIRED if getattr(lib, name, None) is None]
    if missing:
        return failed(
            reasons.DRIVER_INIT_FAILED, f"{path or LIBCUDA} lacks {', '.join(missing)}: not a usable CUDA driver"
        )
    version = ctypes.c_int(0)
    rc = lib.cuDriverGetVersion(ctypes.byref(version))
    if rc != 0:
        return failed(
            reasons.DRIVER_INIT_FAILED,
            f"cuDriverGetVersion failed: {_error_name(lib, rc)} ({rc}); the driver's CUDA version is unknown",
        )
    if not 1000 <= version.value <= 999_999:
        return failed(
            reasons.DRIVER_INIT_FAILED,
            f"cuDriverGetVersion reported {version.value}, which is no CUDA version; the driver's version is unknown",
        )
    found = found._replace(driver_version=version.value)
    rc = lib.cuInit(0)
    if rc == CUDA_ERROR_NO_DEVICE:
        return failed(reasons.NO_DEVICE, f"cuInit: {_error_name(lib, rc)}: no CUDA device visible")
    if rc != 0:
        return failed(reasons.DRIVER_INIT_FAILED, f"cuInit failed: {_error_name(lib, rc)} ({rc})")
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        return failed(reasons.DRIVER_INIT_FAILED, f"cuDeviceGetCount: {_error_name(lib, rc)} ({rc})")
    if count.value == 0:
        return failed(
            reasons.NO_DEVICE,
            "the driver reports 0 devices" + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""),
        )
    if not 0 <= count.value <= MAX_DEVICES:
        return failed(
            reasons.DRIVER_INIT_FAILED,
            f"cuDeviceGetCount reported {count.value} devices; more than {MAX_DEVICES} (or fewer than 0) "
            "is not believable, so none is used",
        )
    devices = tuple(_device(lib, index) for index in range(count.value))
    unknown = [d for d in devices if d.capability is None]
    if all(d.capability is None for d in devices):
        return found._replace(
            code=reasons.DRIVER_INIT_FAILED,
            reason=f"no device's capability could be read: device 0: {devices[0].problem}",
            devices=devices,
        )
    shown = f"{len(devices)} device(s)" + (f", {len(unknown)} with unknown capability" if unknown else "")
    return found._replace(reason=shown, devices=devices)


def probe_isolated(timeout: float = 30.0) -> ProbeResult:
    """The same probe in a child process, so this process never initializes CUDA (safe before fork)."""
    import json
    import subprocess  # here, not at the top: this is the tools' path, never load()'s

    if not (timeout > 0 and timeout < float("inf")):
        raise ValueError(f"timeout {timeout!r} is not a positive number of seconds")
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import json,cuplug.runtime.driver as d;print(json.dumps(d.probe().to_json()))"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
    except subprocess.TimeoutExpired:
        return ProbeResult(reasons.DRIVER_INIT_FAILED, f"driver probe did not answer within {timeout:.0f} s")
    except subprocess.CalledProcessError as exc:
        return ProbeResult(reasons.DRIVER_INIT_FAILED, f"driver probe process failed: {exc.stderr.strip()[-500:]}")
    except OSError as exc:
        return ProbeResult(reasons.DRIVER_INIT_FAILED, f"driver probe process could not start: {exc}")
    try:
        return ProbeResult.from_json(json.loads(out.stdout))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        return ProbeResult(reasons.DRIVER_INIT_FAILED, f"driver probe process answered nonsense: {exc}")
