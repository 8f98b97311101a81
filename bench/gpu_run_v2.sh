#!/usr/bin/env bash
# ABI v2 on the GPU machine in one call, most important first (the device time is short).
# Carried in gpucarry/: wheels/ (cuplug, cuplug-cuda12/13, scankit(+cuda), quantkit(+cuda), pyelftools),
# tests/ (the suite), scan_tests/, quant_tests/, bench/typed_bench.py, vw/ (the variant-wheel check).
# Everything lands in $OUT.
set -o pipefail
C=$(pwd)/gpucarry
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/run.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$C"/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cd /tmp || exit 1
timeout 150 python3 -m pytest "$C/tests/test_gpu_v2.py" "$C/tests/test_gpu.py" -k "test_gpu_v2 or ${V1_TESTS:-auto_selection or wrong_sass}" \
  -p no:cacheprovider --rootdir="$C/tests" -q -o addopts="" -rfE -o junit_family=xunit1 --junitxml="$OUT/gpu-junit.xml" 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -12
timeout 70 python3 "$C/bench/typed_bench.py" "$OUT/typed.json" 2>&1 | tee "$OUT/typed.log" | tail -14
for m in cuda12 cuda13; do
  echo "== scankit tests on $m:fatbin"
  CUPLUG_BACKEND=$m:fatbin timeout 40 python3 -m pytest "$C/scan_tests" -q -p no:cacheprovider -o addopts="" 2>&1 | tail -2
done | tee "$OUT/scan_gpu.log"
timeout 50 python3 -m pytest "$C/quant_tests" -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$OUT/quant_gpu.log" | tail -2
{ python3 -m cuplug doctor; python3 -m cuplug probe; echo "probe exit $?"
  for be in scan quant; do for m in cuda12 cuda13; do
    CUPLUG_BACKEND=$m:fatbin timeout 20 python3 -m cuplug probe --backend $be; echo "probe --backend $be ($m) exit $?"
  done; done; } 2>&1 | tee "$OUT/doctor.txt" | grep -E "probe"
# Without PYTHONPATH: the uv venvs must see only what uv installed (the 2026-12-03 run leaked /tmp/site
# into them, so its doctor/probe lines show that site's packages, not the variant wheel).
echo "== variant wheels: uv picks for this GPU" | tee "$OUT/variant.log"
(cd "$C/vw" && env -u PYTHONPATH OUT="$OUT" timeout 80 bash bench/variant_wheels_gpu.sh) >> "$OUT/variant.log" 2>&1; echo "variant exit $?" | tee -a "$OUT/variant.log"
grep -E "installed:|probe|exit" "$OUT/variant.log" | tail -8
