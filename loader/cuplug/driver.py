"""Driver facts through ``libcuda.so.1`` and ctypes, opened lazily.

Only these entry points are called: cuInit, cuDriverGetVersion,
cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute, cuDeviceGetName,
cuDeviceTotalMem_v2, cuDeviceGetUuid_v2 (or cuDeviceGetUuid), cuGetErrorName.
CUDA_VISIBLE_DEVICES is applied by the driver inside cuInit; it is reported,
never re-applied on top of the driver's numbering.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import sys
from typing import Any

from . import reasons

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CUDA_ERROR_NO_DEVICE = 100
LIBCUDA = "libcuda.so.1"


@dataclasses.dataclass(frozen=True)
class Device:
    index: int
    name: str
    capability: tuple[int, int]
    memory_bytes: int
    uuid: str

    @property
    def capability_str(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What the driver says; ``code`` is ``ok`` or the reason code of the failing step."""

    code: str
    reason: str
    driver_found: bool = False
    driver_path: str | None = None
    driver_version: int | None = None  # cuDriverGetVersion, e.g. 13000
    devices: tuple[Device, ...] = ()
    visible_devices: str | None = None

    @property
    def driver_version_str(self) -> str | None:
        v = self.driver_version
        return None if v is None else f"{v // 1000}.{(v % 1000) // 10}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["devices"] = [dict(dataclasses.asdict(x), capability=x.capability_str) for x in self.devices]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProbeResult:
        devices = tuple(
            Device(
                x["index"],
                x["name"],
                tuple(int(p) for p in x["capability"].split(".")),  # type: ignore[arg-type]
                x["memory_bytes"],
                x["uuid"],
            )
            for x in d.get("devices", ())
        )
        return cls(**{**d, "devices": devices})


def _loaded_path(lib: ctypes.CDLL) -> str | None:
    """The file the dynamic linker actually opened, read from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libcuda.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
    except AttributeError:
        pass
    return f"CUDA error {code}"


def _format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def probe() -> ProbeResult:
    """Opens the driver and reads its facts, in this process."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        lib = ctypes.CDLL(LIBCUDA, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return ProbeResult(reasons.NO_DRIVER, f"{LIBCUDA} not found: {exc}", visible_devices=visible)
    path = _loaded_path(lib)
    version = ctypes.c_int(0)
    have_version = lib.cuDriverGetVersion(ctypes.byref(version)) == 0
    found = ProbeResult(
        reasons.OK,
        "",
        driver_found=True,
        driver_path=path,
        visible_devices=visible,
        driver_version=version.value if have_version else None,
    )

    def failed(code: str, reason: str) -> ProbeResult:
        return dataclasses.replace(found, code=code, reason=reason)

    rc = lib.cuInit(0)
    if rc == CUDA_ERROR_NO_DEVICE:
        return failed(reasons.NO_DEVICE, f"cuInit: {_error_name(lib, rc)}: no CUDA device visible")
    if rc != 0:
        return failed(reasons.DRIVER_INIT_FAILED, f"cuInit failed: {_error_name(lib, rc)} ({rc})")
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        return failed(reasons.DRIVER_INIT_FAILED, f"cuDeviceGetCount: {_error_name(lib, rc)}")
    devices = []
    for index in range(count.value):
        dev = ctypes.c_int(0)
        major, minor, mem = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_size_t(0)
        name = ctypes.create_string_buffer(256)
        uuid = ctypes.create_string_buffer(16)
        if lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
            continue
        lib.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        lib.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        lib.cuDeviceGetName(name, len(name), dev)
        lib.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
        get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
        get_uuid(uuid, dev)
        devices.append(
            Device(
                index,
                name.value.decode(errors="replace"),
                (major.value, minor.value),
                mem.value,
                _format_uuid(uuid.raw),
            )
        )
    if not devices:
        return failed(
            reasons.NO_DEVICE,
            "the driver reports 0 devices" + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""),
        )
    return dataclasses.replace(found, reason=f"{len(devices)} device(s)", devices=tuple(devices))


def probe_isolated(timeout: float = 30.0) -> ProbeResult:
    """The same probe in a child process, so this process never initializes CUDA (safe before fork)."""
    import subprocess  # here, not at the top: it is a tenth of `import cuplug`

    try:
        out = subprocess.run(
            [sys.executable, "-c", "import json,cuplug.driver as d;print(json.dumps(d.probe().to_json()))"],
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
    return ProbeResult.from_json(json.loads(out.stdout))
