#!/usr/bin/env bash
# ABI v2 on the GPU machine in one call. Carried in gpucarry/: wheels/ (cuplug, cuplug-cuda12/13,
# scankit(+cuda), quantkit(+cuda), pyelftools), tests/ (the suite), scan_tests/, quant_tests/, bench/.
# Installs them, runs doctor/probe (vector, scan, quant on both majors), the GPU tests, the examples'
# tests on the GPU, and the typed benchmark; everything lands in $OUT.
set -o pipefail
C=$(pwd)/gpucarry
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/run.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$C"/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cd /tmp || exit 1
{ python3 -m cuplug doctor; python3 -m cuplug probe; echo "probe exit $?"
  for be in scan quant; do for m in cuda12 cuda13; do
    CUPLUG_BACKEND=$m:fatbin python3 -m cuplug probe --backend $be; echo "probe --backend $be ($m) exit $?"
  done; done
  python3 -m cuplug warmup --backend scan; echo "warmup scan exit $?"; } 2>&1 | tee "$OUT/doctor.txt" | grep -E "probe|exit"
# V1_TESTS: a -k expression choosing the float32 suite's tests (test_gpu.py) to run beside the v2 ones.
timeout 200 python3 -m pytest "$C/tests/test_gpu_v2.py" "$C/tests/test_gpu.py" -k "test_gpu_v2 or ${V1_TESTS:-auto_selection or wrong_sass or resident_buffers or out_of_memory}" \
  -p no:cacheprovider --rootdir="$C/tests" -q -o addopts="" -rfE -o junit_family=xunit1 --junitxml="$OUT/gpu-junit.xml" 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -15
for m in cuda12 cuda13; do
  echo "== scankit tests on $m:fatbin"
  CUPLUG_BACKEND=$m:fatbin timeout 60 python3 -m pytest "$C/scan_tests" -q -p no:cacheprovider -o addopts="" 2>&1 | tail -3
done | tee "$OUT/scan_gpu.log"
timeout 100 python3 -m pytest "$C/quant_tests" -q -p no:cacheprovider \
  -o addopts="" 2>&1 | tee "$OUT/quant_gpu.log" | tail -4
timeout 100 python3 "$C/bench/typed_bench.py" "$OUT/typed.json" 2>&1 | tee "$OUT/typed.log" | tail -22
echo "== variant wheels: uv picks for this GPU" | tee "$OUT/variant.log"
(cd "$C/vw" && OUT="$OUT" timeout 90 bash bench/variant_wheels_gpu.sh) >> "$OUT/variant.log" 2>&1; echo "variant exit $?" | tee -a "$OUT/variant.log"
grep -E "installed:|probe|exit" "$OUT/variant.log" | tail -8
