"""What every benchmark records next to its figures: the machine, the versions and the command."""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / (1 << 30), 1)
    except ImportError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = (
            torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        )
    except ImportError:
        pass
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except ImportError:
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def command_line() -> str:
    """The command as a user would type it from the repo root."""
    script = Path(sys.argv[0])
    if script.parent.name == "benchmarks" and script.suffix == ".py":
        head = ["python", "-m", f"benchmarks.{script.stem}"]
    else:
        head = [script.name]
    return " ".join(shlex.quote(a) for a in [*head, *sys.argv[1:]])


def write_json(
    name: str, payload: dict[str, Any], results_dir: Path = RESULTS_DIR
) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    payload = {
        "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command_line(),
        "machine": machine_info(),
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2))
    return path


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements, with their count and the values themselves."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": list(values),
    }
