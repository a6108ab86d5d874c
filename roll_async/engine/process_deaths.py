"""How an engine process died: the signal's name and its likely cause, in words a user can act on.

vLLM runs the model in worker processes that its EngineCore process reaps; when
one dies by a signal the engine's front-end learns only "EngineCore encountered
an issue". The EngineCore side (roll_async.engine.exit_recording_executor) notes
each worker's own death in a small file for its front-end process (its parent),
and VLLMEngine reads it back when a start fails (:func:`deaths_since`).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

#: What a death by each signal most likely means for a vLLM engine, and what to change.
SIGNAL_CAUSES: dict[int, str] = {
    signal.SIGILL: (
        "illegal instruction: this CPU (or its VM) cannot run the engine's kernels for this dtype and "
        "instruction set (bfloat16 AMX / AVX-512-BF16); set engine.dtype=float32"
    ),
    signal.SIGKILL: (
        "killed from outside, most likely by the kernel's out-of-memory killer: lower "
        "engine.cpu_kv_cache_space_gib (CPU) or engine.gpu_memory_utilization, or engine.max_num_seqs"
    ),
    signal.SIGSEGV: (
        "segmentation fault in native code (a vLLM or torch kernel, or mismatched installs): see the "
        "engine log above; engine.dtype=float32 avoids the bfloat16 kernels"
    ),
    signal.SIGBUS: (
        "bus error: shared memory (/dev/shm) or a memory-mapped model file ran out or went away; "
        "give the machine or container more /dev/shm"
    ),
    signal.SIGABRT: "aborted by native code (a failed check in a kernel or library): see the engine log above",
    signal.SIGFPE: "arithmetic fault in native code: see the engine log above",
    signal.SIGTERM: "terminated from outside (a scheduler, a shutdown or kill)",
    signal.SIGINT: "interrupted (Ctrl-C)",
}

#: vLLM's ``distributed_executor_backend`` on CPU (resolved by name in the EngineCore process).
RECORDING_EXECUTOR = "roll_async.engine.exit_recording_executor.ExitRecordingExecutor"

_EXITS_DIR = Path(tempfile.gettempdir()) / f"roll_async-engine-exits-{os.getuid()}"


def signal_of(exitcode: int | None) -> signal.Signals | None:
    """The signal a process died by, from its exit code (multiprocessing and subprocess: ``-N``); else None."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode)
    except ValueError:
        return None


def describe_exit(process: str, exitcode: int | None) -> str | None:
    """``'<process> died by SIGILL (cause)'`` for a death by a signal; None for any other exit."""
    sig = signal_of(exitcode)
    if sig is None:
        return None
    cause = SIGNAL_CAUSES.get(sig, "see the engine log above")
    return f"{process} died by {sig.name} ({cause})"


def _exits_file(front_end_pid: int) -> Path:
    return _EXITS_DIR / f"{front_end_pid}.jsonl"


def record_exit(front_end_pid: int, process: str, pid: int, exitcode: int) -> None:
    """Note that ``process`` (``pid``) ended with ``exitcode``, for the front-end process ``front_end_pid``."""
    _EXITS_DIR.mkdir(parents=True, exist_ok=True)
    line = json.dumps(
        {"process": process, "pid": pid, "exitcode": exitcode, "time": time.time()}
    )
    with open(_exits_file(front_end_pid), "a") as file:  # one short append per line
        file.write(line + "\n")


def deaths_since(front_end_pid: int, since: float) -> list[str]:
    """:func:`describe_exit` of each death by a signal recorded for ``front_end_pid`` at or after ``since``."""
    path = _exits_file(front_end_pid)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    described = []
    for line in lines:
        try:
            record: dict[str, Any] = json.loads(line)
        except ValueError:
            continue  # a line cut short by the writer's own death
        if record.get("time", 0.0) < since:
            continue
        text = describe_exit(
            f"engine process {record['process']} (pid {record['pid']})",
            record["exitcode"],
        )
        if text is not None:
            described.append(text)
    return described


def forget_deaths(front_end_pid: int) -> None:
    """Remove ``front_end_pid``'s record file (once reported)."""
    _exits_file(front_end_pid).unlink(missing_ok=True)
