#!/usr/bin/env bash
# The trainer alone on one GPU (benchmarks/gpu_trainer.py): tokens/s, MFU and peak memory for Qwen2.5-0.5B,
# 1.5B and 7B (LoRA) shapes, written to benchmarks/results/gpu_trainer_<gpu>.{json,md}.
# Runs from a bare working tree with the machine's python (no .venv): it needs torch with CUDA,
# transformers, peft, numpy, safetensors and pyyaml, and nothing else. Under 8 minutes on an H100: the
# benchmark shares a 420 s budget between the models, and this wrapper stops it at 470 s whatever happens.
# Extra arguments go to the benchmark, e.g. `scripts/gpu_check.sh --overwrite` or `--cpu`.
# PYTHON=... picks the interpreter (default: python3).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
cd "$repo"
"$python" - <<'PY' || exit 2
import importlib
missing = []
for name in ("torch", "transformers", "peft", "numpy", "safetensors", "yaml"):
    try:
        module = importlib.import_module(name)
        print(f"[gpu_check] {name} {getattr(module, '__version__', '?')}")
    except ImportError as e:
        missing.append(f"{name} ({e})")
if missing:
    raise SystemExit("[gpu_check] missing: " + ", ".join(missing))
import torch
print(f"[gpu_check] CUDA {torch.version.cuda}: "
      + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible: the reduced CPU mode runs"))
PY
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  timeout -k 10 470 "$python" -m benchmarks.gpu_trainer "$@"
rc=$?
[ "$rc" -eq 124 ] && echo "[gpu_check] stopped at 470 s" >&2
exit "$rc"
