#!/usr/bin/env bash
# Rewrite constraints.txt from the packages installed in .venv (the versions the suite passed with).
# Run it deliberately, after installing a new version into .venv and running the suite:
#   .venv/bin/pip install 'transformers==X' && bash scripts/test.sh && bash scripts/lock.sh
# The project itself (editable) and anything installed from a local path are left out.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ROLL_ASYNC_VENV:-$repo/.venv}"
lock="$repo/constraints.txt"
{
  echo "# Exact versions of every package in the CPU .venv that the test suite passes with (pip constraints)."
  echo "# scripts/setup.sh installs with \`pip install -c constraints.txt\` (ROLL_ASYNC_DEVICE=cpu); its stamp holds"
  echo "# this file's hash, so a change here re-installs. Written by scripts/lock.sh from .venv; do not edit by hand:"
  echo "# install the new version into .venv, run the suite, then run scripts/lock.sh."
  "$venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null | grep -v -e ' @ ' -e '^-e ' | LC_ALL=C sort -f
} > "$lock.tmp"
mv "$lock.tmp" "$lock"
echo "[lock] wrote $lock ($(grep -vc '^#' "$lock") packages)"
