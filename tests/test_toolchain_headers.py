"""Both pinned toolchains compile a kernel that uses the headers real backends include.

fp16/bf16 arithmetic, a cooperative-groups tile reduce, a CUB BlockReduce, Thrust and libcu++,
NVTX 3 ranges and the profiler API, with no include flag: every header must come from the
toolchain itself (CUDA 12.4 once lacked CCCL, so `cuda_fp16.h` failed on `nv/target`; CUDA 13.0
lacked NVTX and `cuda_profiler_api.h`). No GPU needed; the toolchains come from the cache that
`nox -s tests` fills before pytest (or are installed here, which needs network).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from cuplug.kit import toolchain

# CUB_VERSION/THRUST_VERSION each toolchain's lock pins: CCCL 2.3.2 is CUDA 12.4.1's, 3.0.1 is 13.0.2's.
EXPECTED_CCCL = {"cuda12": 200302, "cuda13": 300001}

KERNEL = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cub/cub.cuh>
#include <thrust/version.h>
#include <thrust/functional.h>
#include <cuda/std/type_traits>
#include <nvtx3/nvToolsExt.h>
#include <cuda_profiler_api.h>

namespace cg = cooperative_groups;

static_assert(CUB_VERSION == CUPLUG_EXPECT_CCCL, "CUB is not the pinned CCCL");
static_assert(THRUST_VERSION == CUPLUG_EXPECT_CCCL, "Thrust is not the pinned CCCL");
static_assert(cuda::std::is_same<cuda::std::remove_cv_t<const float>, float>::value, "libcu++");

constexpr int kBlock = 128;

__global__ void headers_kernel(const __half2* h, const __nv_bfloat16* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = 0.0f;
    if (i < n) {
        __half2 hh = __hfma2(h[i], __float2half2_rn(2.0f), h[i]);  // fp16x2 fused multiply-add
        __half s = __hadd(__low2half(hh), __high2half(hh)) * __float2half(0.5f);
#if __CUDA_ARCH__ >= 800
        __nv_bfloat16 bb = __hfma(b[i], __float2bfloat16(3.0f), b[i]);  // native bf16 FMA
#else
        __nv_bfloat16 bb = __hmul(b[i], __float2bfloat16(3.0f)) + b[i];  // emulated below sm_80
#endif
        bb = bb + __float2bfloat16(1.0f);
        v = thrust::plus<float>()(__half2float(s), __bfloat162float(bb));
    }
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> tile = cg::tiled_partition<32>(block);
    float tile_sum = cg::reduce(tile, v, cg::plus<float>());
    using BlockReduce = cub::BlockReduce<float, kBlock>;
    __shared__ typename BlockReduce::TempStorage temp;
    float block_sum = BlockReduce(temp).Sum(tile.thread_rank() == 0 ? tile_sum : 0.0f);
    if (threadIdx.x == 0) out[blockIdx.x] = block_sum;
}

extern "C" __attribute__((visibility("default"))) int headers_run(
    const void* h, const void* b, float* out, int n) {
    nvtxRangePushA("headers_run");
    nvtxMarkA("launch");
    cudaProfilerStart();
    headers_kernel<<<(n + kBlock - 1) / kBlock, kBlock>>>(
        static_cast<const __half2*>(h), static_cast<const __nv_bfloat16*>(b), out, n);
    cudaError_t err = cudaGetLastError();
    cudaProfilerStop();
    nvtxRangePop();
    return static_cast<int>(err);
}
"""

# Each header the kernel includes, and where it must resolve (a path suffix under the toolchain).
HEADERS = (
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cooperative_groups.h",
    "cooperative_groups/reduce.h",
    "nv/target",
    "cuda/std/type_traits",
    "cub/cub.cuh",
    "cub/block/block_reduce.cuh",
    "thrust/version.h",
    "nvtx3/nvToolsExt.h",
    "cuda_profiler_api.h",
)


def _hermetic_env() -> dict[str, str]:
    """No system CUDA on PATH, no CUDA_HOME, no include path from the environment."""
    drop = ("CUDA", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "NVCC_", "LD_LIBRARY_PATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "cuda" not in p.lower())
    return env


def _run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=_hermetic_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module", params=sorted(EXPECTED_CCCL))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(toolchain, work dir, dependency list) after one `nvcc -c` and `nvcc -shared` per major."""
    tc = toolchain.install(request.param, lambda _msg: None)  # cached by the session before pytest
    work = tmp_path_factory.mktemp(f"headers-{tc.major}")
    (work / "headers.cu").write_text(KERNEL)
    _run(
        [
            str(tc.nvcc),
            "-gencode=arch=compute_75,code=sm_75",
            "-gencode=arch=compute_80,code=sm_80",
            f"-DCUPLUG_EXPECT_CCCL={EXPECTED_CCCL[tc.major]}",
            "-Xcompiler=-fPIC,-fvisibility=hidden",
            "-MD",
            "-MF",
            "headers.d",
            "-c",
            "headers.cu",
            "-o",
            "headers.o",
        ],
        work,
    )
    # nvcc's default runtime is the static one, as in the backends; --no-undefined proves the
    # profiler API and NVTX resolve without any extra library.
    _run([str(tc.nvcc), "-shared", "headers.o", "-o", "libheaders.so", "-Xlinker=--no-undefined"], work)
    deps = (work / "headers.d").read_text().replace("\\\n", " ").split(":", 1)[1].split()
    return tc, work, [Path(d).resolve() for d in deps]


def test_every_header_comes_from_the_toolchain(built):
    tc, _, deps = built
    root = tc.root.resolve()
    for header in HEADERS:
        found = [d for d in deps if d.as_posix().endswith("/" + header)]
        assert found, f"{tc.major}: {header} was not included (dependency list: {deps})"
        assert all(d.is_relative_to(root) for d in found), f"{tc.major}: {header} from {found}, not under {root}"
    assert not [d for d in deps if "/usr/local/cuda" in d.as_posix()], "a system CUDA header leaked in"


def test_both_gencodes_are_embedded(built):
    tc, work, _ = built
    listing = _run([str(tc.cuobjdump), "--list-elf", "headers.o"], work)
    assert sorted(re.findall(r"\.(sm_\d+)\.cubin", listing)) == ["sm_75", "sm_80"], listing


def test_only_the_static_runtime_is_linked(built):
    tc, work, _ = built
    dynamic = _run(["readelf", "-d", "--wide", "libheaders.so"], work)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    leaked = [n for n in needed if re.match(r"lib(cudart|cuda|nvToolsExt|nvtx3interop)\b", n)]
    assert not leaked, f"{tc.major}: libheaders.so needs {leaked}"
    undefined = _run(["nm", "-D", "--undefined-only", "libheaders.so"], work)
    assert "cudaProfilerStart" not in undefined and "cudaLaunchKernel" not in undefined, undefined


def test_a_missing_header_fails_the_install_check(tmp_path):
    (tmp_path / "nvtx3").mkdir()
    for header in toolchain.REQUIRED_HEADERS:
        if header != "nv/target":
            (tmp_path / header).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / header).touch()
    tc = toolchain.Toolchain("cuda12", "12.4", tmp_path, tmp_path / "nvcc", tmp_path / "cuobjdump")
    with pytest.raises(toolchain.ToolchainError, match=r"lacks nv/target"):
        toolchain._check_headers(tc, (tmp_path,))
    (tmp_path / "nv/target").parent.mkdir(exist_ok=True)
    (tmp_path / "nv/target").touch()
    toolchain._check_headers(tc, (tmp_path,))
