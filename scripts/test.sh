#!/usr/bin/env bash
# The test command: set up .venv if needed, then run the whole suite (unit + real-engine integration).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/setup.sh" || { echo "[test] setup failed" >&2; exit 1; }
venv="${ROLL_ASYNC_VENV:-$repo/.venv}"
cd "$repo"
# Two workers (pytest-xdist), each with its own Ray instance and engine; a test file stays on one worker
# so its module fixtures start once. ROLL_ASYNC_TEST_WORKERS=0 runs in this process. The 25 slowest tests
# are listed at the end, to keep the suite within its time budget.
"$venv/bin/python" -m pytest -n "${ROLL_ASYNC_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "[test] pytest collected no tests: the test setup is broken" >&2
  exit 1
fi
exit "$rc"
