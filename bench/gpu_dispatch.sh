#!/usr/bin/env bash
# Issues 30/31 on the GPU machine in one call: the GPU tests, then the dispatch benchmark twice (bench/
# bench_dispatch.py, pytest-benchmark), each run's report. Carried: dist/ (the three wheels of this commit).
# $OUT gets these files: run.log, gpu_tests.log, gpu-junit.xml, dispatch-run{1,2}.json, dispatch-whole-path.json,
# parts-cuda.json, cuda-call-costs.json, doctor.txt (9). Usage (device machine, repo root): bash bench/gpu_dispatch.sh
set -o pipefail
ROOT=$(pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/run.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/dist/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 CUPLUG_TEST_WHEELS="$ROOT/dist" XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import torch, cupy, cuplug; print('torch', torch.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/run.log"
cd /tmp || exit 1
# TEST_FILES: the GPU test files to run (default: all of them); RUNS: the benchmark's runs; WHOLE=0, PARTS=0 skip
# the whole-path run and the parts (a short call).
TEST_FILES=${TEST_FILES:-tests/test_gpu_torch_ops.py tests/test_gpu_v2.py tests/test_gpu_jax_ops.py tests/test_fastcall.py tests/test_gpu.py}
# shellcheck disable=SC2046  # a list of files
timeout ${TEST_TIMEOUT:-240} python3 -m pytest $(for f in $TEST_FILES; do echo "$ROOT/$f"; done) \
  -k "${TESTS_K:-not test_gpu.py or auto_selection or wrong_sass}" \
  -p no:cacheprovider --rootdir="$ROOT" -c "$ROOT/pyproject.toml" -q -rfE --maxfail=30 -o addopts="" \
  --junitxml="$OUT/gpu-junit.xml" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
for run in ${RUNS:-1 2}; do
  timeout 200 python3 -m pytest "$ROOT/bench/bench_dispatch.py" -p no:cacheprovider --rootdir="$ROOT" -q -o addopts="" \
    --benchmark-json="$OUT/dispatch-run$run.json" --benchmark-columns=median,iqr,min,rounds 2>&1 | tail -45 >> "$OUT/run.log"
  # the report (JSON + PNG) is made from the raw JSON where matplotlib is: here only its summary lines
  python3 "$ROOT/bench/dispatch_report.py" "$OUT/dispatch-run$run.json" "/tmp/report$run" | tee -a "$OUT/run.log"
done
# the whole path alone (CUPLUG_FASTPATH=0: Backend.run without its C dispatcher), then where the time goes
[ "${WHOLE:-1}" = 1 ] && CUPLUG_FASTPATH=0 timeout 200 python3 -m pytest "$ROOT/bench/bench_dispatch.py" -p no:cacheprovider --rootdir="$ROOT" -q \
  -o addopts="" -k "per_call" --benchmark-json="$OUT/dispatch-whole-path.json" --benchmark-columns=median,iqr,min,rounds 2>&1 \
  | tail -20 >> "$OUT/run.log"
[ "${PARTS:-1}" = 1 ] && timeout 120 python3 "$ROOT/bench/dispatch_parts.py" 5000 --cuda > "$OUT/parts-cuda.json" \
  && tail -c 1500 "$OUT/parts-cuda.json"
# what each CUDA call of a backend call costs the host (nvcc of the machine's image; COSTS=1)
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -n "$COSTS" ] && "$NVCC" -O2 -o /tmp/costs "$ROOT/bench/cuda_call_costs.cu" -lcuda -ldl \
  && /tmp/costs 20000 /tmp/site/cuplug_cuda13/fatbin/libcuplug_vector.so | tee "$OUT/cuda-call-costs.json"
{ python3 -m cuplug doctor; python3 -m cuplug probe; echo "probe exit $?"; } > "$OUT/doctor.txt" 2>&1; tail -3 "$OUT/doctor.txt"
