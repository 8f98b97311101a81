#!/usr/bin/env bash
# The variant wheels on a real GPU (device machine, no network): serve them from a local index,
# let uv 0.13.8 (wheel-variants preview, its vendored NVIDIA provider, nothing forced) pick the
# backend wheel for this GPU, then run `cuplug doctor` and `cuplug probe` from that environment.
#
#   carry: dist (nox -s variant_wheels: dist/*.whl and dist/variants/), build/deps (pyelftools),
#          .whl (uv-0.13.8-*.whl, e.g. `pip download --no-deps -d .whl uv==0.13.8`)
#   run:   bash bench/variant_wheels_gpu.sh        [EXPECT=sm90 by default: an H100/H200]
#
# Everything it prints also lands in $OUT (variant-gpu.log, doctor-*.json). Exit 0 only when, for
# both CUDA majors, uv installed the EXPECT variant wheel and `cuplug probe` ran it on the GPU.
set -o pipefail
# The uv venvs must see their own packages only: a PYTHONPATH left by a caller (a --target install of the
# plain wheels) would put those first and the probe would run them, not uv's choice.
unset PYTHONPATH PYTHONHOME
REPO=$(pwd)
OUT=${OUT:-/tmp/variant-out}
EXPECT=${EXPECT:-sm90}
mkdir -p "$OUT"
exec > >(tee "$OUT/variant-gpu.log") 2>&1
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
WORK=$(mktemp -d)
UV=$(command -v uv || true)
if [ -z "$UV" ] || ! "$UV" --version | grep -q '^uv 0.13.8'; then
  python3 -m pip install -q --no-index --no-deps --target "$WORK/uvtool" "$REPO"/.whl/uv-0.13.8-*.whl || exit 1
  UV="$WORK/uvtool/bin/uv"
fi
"$UV" --version
python3 "$REPO/bench/variant_index.py" "$WORK/port" "$REPO/dist" "$REPO/dist/variants" "$REPO/build/deps" \
  --timeout 900 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 50); do [ -s "$WORK/port" ] && break; sleep 0.1; done
INDEX="http://127.0.0.1:$(cat "$WORK/port")/simple"
export UV_CACHE_DIR="$WORK/uv-cache" UV_NO_CONFIG=1 UV_PYTHON_DOWNLOADS=never
unset NV_VARIANT_PROVIDER_FORCE_SM_ARCH NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION
status=0
for extra in cuda13 cuda12; do
  echo "=== cuplug[$extra]: uv chooses"
  venv="$WORK/venv-$extra"
  "$UV" venv -q --python python3 "$venv" || exit 1
  "$UV" pip install -v --python "$venv/bin/python" --preview-features wheel-variants \
    --index-url "$INDEX" "cuplug[$extra]" 2>&1 | grep -E -i 'variant|nvidia|Selecting|cuplug|error' | tail -20
  label=$(cd "$WORK" && "$venv/bin/python" - "$extra" <<'EOF'
import json, sys, glob, os
(di,) = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", f"cuplug_{sys.argv[1]}-*.dist-info"))
path = os.path.join(di, "variant.json")
print(next(iter(json.load(open(path))["variants"])) if os.path.exists(path) else "all-variant")
EOF
)
  echo "installed: cuplug_$extra variant $label (expected $EXPECT)"
  [ "$label" = "$EXPECT" ] || status=1
  (cd "$WORK" && "$venv/bin/cuplug" doctor --json > "$OUT/doctor-$extra.json"; "$venv/bin/cuplug" doctor)
  # doctor must have read the venv's packages (uv's choice), and say which variant it is
  "$venv/bin/python" - "$OUT/doctor-$extra.json" "$venv" "$extra" "$label" <<'EOF' || status=1
import json, sys
doc, venv, extra, label = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
pkg = [p for p in doc["packages"] if p["cuda"] == extra]
rows = [r for r in doc["variants"] if r["distribution"] == f"cuplug_{extra}"]
ok = pkg and pkg[0]["path"].startswith(venv) and rows and rows[0]["label"] == label
print(f"doctor read {pkg[0]['path'] if pkg else None}; variant row {rows[0]['label'] if rows else None} {rows[0]['code'] if rows else ''}")
sys.exit(0 if ok else 1)
EOF
  (cd "$WORK" && "$venv/bin/python" -c "
import cuplug.tools.variant_check as v
from cuplug.runtime.driver import probe
print('\n'.join(v.format_report(v.report(probe()))))")
  (cd "$WORK" && "$venv/bin/cuplug" probe); rc=$?
  echo "probe exit $rc"
  [ $rc -eq 0 ] || status=1
done
echo "variant_wheels_gpu: exit $status"
exit $status
