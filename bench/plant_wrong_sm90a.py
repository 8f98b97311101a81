"""A planted artifact for the self-test on a real GPU (issue 33): the vector backend's own source with float32 `add`
wrong by 0.5 on exactly one architecture (``__CUDA_ARCH__ == 900``), built as the sm90a variant by the kit (CUDA
13). tests/test_gpu_selftest.py puts it in place of cuplug_cuda13/sm90a on an H100/H200: it loads and launches, its
self-test disagrees with the CPU twin, load() rejects it with self-test-mismatch and the fatbin's sm_90 serves.

    .nox/wheels/bin/python bench/plant_wrong_sm90a.py OUT_DIR      # here (nvcc from the kit's toolchain cache)
    -> OUT_DIR/libcuplug_vector.so, OUT_DIR/planted.json (what was changed, the toolkit, the sha256)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "loader"))

from cuplug.kit import artifacts, toolchain  # noqa: E402

RIGHT = "__device__ __forceinline__ float add1(float a, float b) { return __fadd_rn(a, b); }"
WRONG = (
    "__device__ __forceinline__ float add1(float a, float b) {\n"
    "#if __CUDA_ARCH__ == 900  // planted: wrong on exactly this architecture\n"
    "  return __fadd_rn(__fadd_rn(a, b), 0.5f);\n"
    "#else\n"
    "  return __fadd_rn(a, b);\n"
    "#endif\n"
    "}"
)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build" / "planted").resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "backends"
        shutil.copytree(ROOT / "backends", src)
        cu = src / "cuda" / "vector.cu"
        text = cu.read_text()
        if text.count(RIGHT) != 1:
            print(f"plant: {cu} no longer has the line to plant in: {RIGHT}", file=sys.stderr)
            return 1
        cu.write_text(text.replace(RIGHT, WRONG))
        matrix = Path(tmp) / "matrix.json"
        matrix.write_text(
            json.dumps({"schema": 1, "min_arch": "75", "variants": {"sm90a": {"sass": ["90a"], "ptx": []}}})
        )
        tc = toolchain.install("cuda13", print)
        cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or "cmake"
        sysroot = toolchain.install_sysroot(print, "x86_64")  # as nox -s wheels builds: the manylinux_2_17 floor
        spec = artifacts.BuildSpec(tc, src, Path(tmp) / "build", matrix_path=matrix, cmake=cmake, sysroot=sysroot)
        artifacts.build_backend(spec)
        so = Path(tmp) / "build" / "sm90a" / "libcuplug_vector.so"
        shutil.copy2(so, out / so.name)
    doc = {
        "planted": "float32 add + 0.5 where __CUDA_ARCH__ == 900 (backends/cuda/vector.cu's add1)",
        "toolkit": tc.version,
        "variant": "sm90a",
        "sha256": toolchain.sha256_file(out / "libcuplug_vector.so"),
    }
    (out / "planted.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
