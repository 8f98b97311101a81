#!/usr/bin/env bash
# Issue 22's benchmark on the GPU machine in one call: everything twice (RUNS=2), all under $OUT.
#
#   python3 ci/nox.py -s wheels                      # here: dist/ with cuplug, cuplug-cuda12, cuplug-cuda13
#   run: bash bench/bench_h200.sh                    # device call, carry ["dist"], timeout_s 600 (~6.5 min)
#
# It installs the three wheels with pip (byte-compiled, as `pip install` does for a user; a
# `--no-compile` install makes every fresh process compile cuplug's sources again), then runs
# `bench/perf22.py all`: per run the interleaved cold starts (7 rounds, idle device), `sum` against
# torch.sum, the host path in 3 processes, and the summary of the three targets; then ncu on sum once
# and the plot. What comes back: $OUT/run1.json, run2.json (each: cold, sum, host, summary, with the
# command line and the machine), ncu.json, targets.png, log.txt. Copy them to bench/results/<date>-h200/.
#
# WHEELS=dir   where the wheels are (default dist)      RUNS=n   how many runs (default 2)
set -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WHEELS=$(cd "${WHEELS:-dist}" && pwd) || exit 1
: "${OUT:?OUT must be set (the device machine sets it)}"
export PYTHONUNBUFFERED=1
{
  echo "command: bash bench/bench_h200.sh (RUNS=${RUNS:-2}, WHEELS=$WHEELS)"
  nvidia-smi --query-gpu=name,driver_version,pstate,temperature.gpu --format=csv,noheader
  nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader
  nproc
  python3 -c "import sys, torch, cupy, numpy; print(sys.version.split()[0], torch.__version__, cupy.__version__, numpy.__version__)"
  ls -l "$WHEELS"/*.whl
} 2>&1 | tee "$OUT/log.txt"
rm -rf /tmp/site22
python3 -m pip install -q --no-index --no-deps --target /tmp/site22 "$WHEELS"/cuplug*.whl 2>&1 | grep -v "as the 'root' user" | tee -a "$OUT/log.txt"
export PYTHONPATH=/tmp/site22
cd /tmp || exit 1
python3 "$HERE/perf22.py" all "$OUT" --runs "${RUNS:-2}" 2>&1 | tee -a "$OUT/log.txt"
