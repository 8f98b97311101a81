"""Assemble a backend wheel (``cuplug-cuda12``/``cuplug-cuda13``) from build_backends' output.

The wheel holds a package ``cuplug_<major>`` with ``manifest.json`` and one
directory per variant, registers itself in the entry-point group
``cuplug.backends`` and requires the same ``cuplug`` version (backend ABI v1).
It carries no Python extension, so one ``py3-none-<platform>`` wheel serves
every Python; the platform tag is passed in (manylinux_2_17 for artifacts
linked against the bullseye sysroot).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
import zipfile
from pathlib import Path

WHEEL_TAG = "py3-none-manylinux_2_17_x86_64"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(build_dir: Path, major: str, version: str, out_dir: Path, tag: str = WHEEL_TAG) -> Path:
    """Writes ``cuplug_<major>-<version>-<tag>.whl`` into out_dir and returns its path."""
    manifest = json.loads((build_dir / "manifest.json").read_text())
    if manifest.get("cuda") != major:
        raise SystemExit(f"{build_dir}/manifest.json is for {manifest.get('cuda')}, not {major}")
    package = f"cuplug_{major}"
    dist = f"cuplug_{major}-{version}"
    files: dict[str, bytes] = {
        f"{package}/__init__.py": (
            f'"""CUDA {major[4:]} variants of cuplug backends; used through cuplug.load(), not imported."""\n'
            "raise ImportError('cuplug-%s holds backend libraries for the cuplug loader: install cuplug "
            "and call cuplug.load() (pip install \"cuplug[%s]\")')\n" % (major, major)
        ).encode(),
        f"{package}/manifest.json": (build_dir / "manifest.json").read_bytes(),
    }
    for artifact in manifest["artifacts"]:
        files[f"{package}/{artifact['file']}"] = (build_dir / artifact["file"]).read_bytes()
    files[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: cuplug-{major}\nVersion: {version}\n"
        f"Summary: CUDA {major[4:]} backend variants for cuplug (sm75, sm80, ptx, fatbin)\n"
        f"Requires-Python: >=3.10\nRequires-Dist: cuplug=={version}\n"
    ).encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: cuplug packaging\nRoot-Is-Purelib: false\nTag: {tag}\n"
    ).encode()
    files[f"{dist}.dist-info/entry_points.txt"] = f"[cuplug.backends]\n{major} = {package}\n".encode()
    record_name = f"{dist}.dist-info/RECORD"
    record = [_record_line(name, data) for name, data in files.items()] + [f"{record_name},,"]
    files[record_name] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))  # reproducible
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return wheel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build_dir", type=Path)
    p.add_argument("major", choices=["cuda12", "cuda13"])
    p.add_argument("--version", required=True)
    p.add_argument("--out", type=Path, default=Path("dist"))
    p.add_argument("--tag", default=WHEEL_TAG)
    args = p.parse_args(argv)
    print(build_wheel(args.build_dir, args.major, args.version, args.out, args.tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
