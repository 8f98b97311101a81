#!/usr/bin/env bash
# The whole GPU session in one call (device machine; `dist/` and `build/deps/` carried):
# install the wheels, run doctor/probe/warmup, the gpu tests, the kernel-shape study,
# ncu on add vs torch.add, and the benchmarks. Everything lands in $OUT.
set -o pipefail
REPO=$(pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/run.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$REPO"/dist/*.whl \
  "$REPO"/build/deps/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cp -r "$REPO/tests" /tmp/t && cd /tmp || exit 1
{ python3 -m cuplug doctor; python3 -m cuplug probe; echo "probe exit $?";
  python3 -m cuplug warmup; echo "warmup exit $?"; python3 -m cuplug inspect; echo "inspect exit $?"; } \
  2>&1 | tee "$OUT/doctor.txt"
python3 -m pytest /tmp/t/test_gpu.py -p no:cacheprovider --rootdir=/tmp/t -q -o addopts="" -o junit_family=xunit1 --junitxml="$OUT/gpu-junit.xml" -rA 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -25
if [ "${SKIP_STUDY:-0}" != 1 ]; then  # the kernel-shape study (bench/kernel_shapes.cu), once
  nvcc -O3 -arch=sm_90 -o /tmp/shapes "$REPO/bench/kernel_shapes.cu" && /tmp/shapes | tee "$OUT/shapes.json"
fi
ncu --clock-control none --kernel-name regex:'add_kernel|elementwise' \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size \
  python3 "$REPO/bench/ncu_add.py" > "$OUT/ncu.txt" 2>&1; echo "ncu exit $?"
grep -E "add_kernel|CUDAFunctor_add|duration|dram__throughput|grid_size" "$OUT/ncu.txt" | head -24
# Where `import cuplug` spends its time on this machine, and the decision with the real driver.
python3 -X importtime -c "import cuplug" 2> "$OUT/importtime.txt"; sort -t'|' -k2 -n "$OUT/importtime.txt" | tail -12
python3 "$REPO/bench/decision_bench.py" "$OUT/decision.json"
python3 "$REPO/bench/gpu_bench.py" "$OUT/bench.json" 2>&1 | tee -a "$OUT/run.log" | tail -40
