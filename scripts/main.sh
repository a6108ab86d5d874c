#!/usr/bin/env bash
# The main job: set up .venv if needed, build the offline tiny model, run the default pipeline on CPU vLLM.
# Extra arguments are key=value config overrides.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/setup.sh"
venv="${ROLL_ASYNC_VENV:-$repo/.venv}"
cd "$repo"
exec "$venv/bin/roll-async" demo "$@"
