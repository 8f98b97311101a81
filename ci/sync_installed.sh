#!/usr/bin/env bash
# Dev helper: copy loader/cuplug's Python sources over an installed cuplug (a nox venv's site-packages),
# so in-process tests see edits without rebuilding the wheel. Usage: ci/sync_installed.sh VENV
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SITE=$(cd "$1" && echo "$PWD"/lib/python3*/site-packages)
cd "$ROOT/loader/cuplug"
find . \( -name '*.py' -o -name '*.json' \) -not -path '*/__pycache__/*' | while read -r f; do
  mkdir -p "$SITE/cuplug/$(dirname "$f")"
  cp "$f" "$SITE/cuplug/$f"
done
echo "synced $ROOT/loader/cuplug -> $SITE/cuplug"
