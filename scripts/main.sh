#!/usr/bin/env bash
# The main job: set up .venv if needed, then train on the default config (offline tiny model, CPU vLLM).
# Extra arguments are key=value config overrides, e.g. `bash scripts/main.sh mode=async max_staleness=1`.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/setup.sh"
venv="${ROLL_ASYNC_VENV:-$repo/.venv}"
cd "$repo"
exec "$venv/bin/roll-async" train configs/default.yaml "$@"
