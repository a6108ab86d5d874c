"""What every benchmark records next to its figures (the machine, the versions and the command), and
where it writes them: ``ResultFiles``, which never replaces a recorded result unasked."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]


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


class ResultExistsError(FileExistsError):
    """A benchmark was about to replace a result file it was not asked to replace."""


def device_kind() -> str:
    """``gpu`` when torch sees a CUDA device, else ``cpu`` (the default result names end in it)."""
    try:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class ResultFiles:
    """The files one benchmark run writes: ``<results_dir>/<name><suffix>`` for each suffix.

    Every benchmark writes through this one place. It is built before the run starts and
    refuses then, if any of its files exists and ``overwrite`` is false, so a long run never
    ends in a refusal and never replaces a recorded result unasked. The run then writes
    only the files it claimed.
    """

    def __init__(
        self,
        name: str,
        suffixes: Sequence[str],
        *,
        overwrite: bool = False,
        results_dir: Path | None = None,
    ) -> None:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"result name {name!r}: a plain file stem, e.g. my_run")
        self.name = name
        self.results_dir = Path(RESULTS_DIR if results_dir is None else results_dir)
        self.paths = {s: self.results_dir / f"{name}{s}" for s in suffixes}
        if not overwrite:
            for path in self.paths.values():
                if path.exists():
                    raise ResultExistsError(
                        f"{_shown(path)} exists; pass --overwrite to replace it, or --name NEW to write new files"
                    )

    @classmethod
    def claim(
        cls,
        name: str,
        suffixes: Sequence[str],
        *,
        overwrite: bool = False,
        results_dir: Path | None = None,
    ) -> ResultFiles:
        """The same, for a benchmark's ``main``: a refusal exits with one line naming the file."""
        try:
            return cls(name, suffixes, overwrite=overwrite, results_dir=results_dir)
        except (ResultExistsError, ValueError) as e:
            raise SystemExit(f"error: {e}") from None

    def path(self, suffix: str) -> Path:
        if suffix not in self.paths:
            raise KeyError(
                f"{self.name}{suffix} was not claimed (claimed: {sorted(self.paths)})"
            )
        self.results_dir.mkdir(parents=True, exist_ok=True)
        return self.paths[suffix]

    def write_json(self, payload: dict[str, Any], suffix: str = ".json") -> Path:
        """``payload`` stamped with the time, the command and the machine; returns the path."""
        path = self.path(suffix)
        stamped = {
            "recorded_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": command_line(),
            "machine": machine_info(),
            **payload,
        }
        path.write_text(json.dumps(stamped, indent=2))
        return path

    def write_text(self, suffix: str, text: str) -> Path:
        path = self.path(suffix)
        path.write_text(text)
        return path


def add_output_args(
    parser: argparse.ArgumentParser, *, name_default: str | None, plots: bool = False
) -> None:
    """``--name``, ``--overwrite`` (and ``--no-plots``): the same output flags on every benchmark."""
    parser.add_argument(
        "--name",
        default=name_default,
        help="results file stem under benchmarks/results/ (default: "
        + (name_default or "derived from the other flags, see the module's docstring")
        + ")",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace result files of that name if they exist (default: refuse)",
    )
    if plots:
        parser.add_argument(
            "--no-plots", action="store_true", help="write no PNG files"
        )


def write_json(
    name: str,
    payload: dict[str, Any],
    results_dir: Path | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """One stamped JSON file; refuses (ResultExistsError) to replace an existing one unless ``overwrite``."""
    return ResultFiles(
        name, [".json"], overwrite=overwrite, results_dir=results_dir
    ).write_json(payload)


def peak_rss_bytes(*, reset: bool = False) -> int:
    """This process's peak resident set (VmHWM); ``reset`` first lowers the peak to the current RSS.

    Not ``ru_maxrss``: Linux keeps that across execve, so a spawned child would
    start with its parent's peak.
    """
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line (not Linux?)")


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements, with their count and the values themselves."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": list(values),
    }


def run_train(cmd: list[str], run_dir: Path, label: str) -> float:
    """One ``roll-async train`` subprocess from the repository root; returns its wall seconds.

    Its whole log goes to ``run_dir/train.log``; step lines, the run directory
    and errors are echoed with ``[label]``. A failed run stops the benchmark.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"[{label}] {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    start = time.perf_counter()
    with open(run_dir / "train.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if line.startswith(("step ", "run directory")) or "Error" in line:
                print(f"[{label}] {line.rstrip()}", flush=True)
        rc = proc.wait()
    if rc != 0:
        raise SystemExit(
            f"[{label}] roll-async train failed (exit {rc}); see {run_dir / 'train.log'}"
        )
    return time.perf_counter() - start


def nan_mean(values: list[float]) -> float:
    """Mean of the values that are not NaN (NaN when none are)."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan
