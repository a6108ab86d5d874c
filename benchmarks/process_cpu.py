"""CPU time by process role over a benchmark run: where the machine's cores went.

On a small machine the rollout side and vLLM share cores, so a scheduler that
costs CPU slows the engine's steps. A run's throughput alone does not show
that; this does. The benchmark snapshots the CPU time of this process and all
its descendants (Ray's processes and vLLM's when Ray was started here, vLLM's
in one process) at the start and the end of a run's window and sums the
difference by role. Processes of other programs on the machine are not counted.
Needs psutil (the ``test`` extra); without it the figures are left out.
"""

from __future__ import annotations

import os
from typing import Any

#: (role, substrings of the process name or command line), first match wins.
ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm_model_worker", ("VLLM::Worker",)),
    ("vllm_engine_core", ("EngineCore",)),
    ("engine_actor", ("VLLMEngine",)),
    ("env_workers", ("EnvManagerWorker",)),
    ("queue_actor", ("GroupQueueActor",)),
    (
        "ray_system",
        (
            "raylet",
            "gcs_server",
            "log_monitor",
            "dashboard",
            "monitor.py",
            "ray::IDLE",
            "runtime_env",
        ),
    ),
)
#: Every role a process can get (role_of), in report order.
ALL_ROLES: tuple[str, ...] = (*(role for role, _ in ROLES), "driver", "other")


def role_of(name: str, cmdline: str, *, is_driver: bool = False) -> str:
    """The role of one process ("driver" for the benchmark's own, "other" when nothing matches)."""
    if is_driver:
        return "driver"
    text = f"{name} {cmdline}"
    for role, needles in ROLES:
        if any(needle in text for needle in needles):
            return role
    return "other"


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (role, user + system CPU seconds) for this process and its descendants; {} without psutil."""
    try:
        import psutil
    except ImportError:
        return {}
    me = psutil.Process()
    result: dict[int, tuple[str, float]] = {}
    for process in [me, *me.children(recursive=True)]:
        try:
            with process.oneshot():
                times = process.cpu_times()
                name, cmdline = process.name(), " ".join(process.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        result[process.pid] = (
            role_of(name, cmdline, is_driver=process.pid == os.getpid()),
            times.user + times.system,
        )
    return result


def cpu_seconds_by_role(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between two snapshots, by role (a process started in between counts from zero)."""
    spent: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        start = before.get(pid, (role, 0.0))[1]
        spent[role] = spent.get(role, 0.0) + max(0.0, seconds - start)
    return spent


def notes_from(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, Any]:
    """A run's notes (``cpu_s_<role>``, summed when repeats are pooled); {} when either snapshot is empty."""
    if not before or not after:
        return {}
    return {
        f"cpu_s_{role}": seconds
        for role, seconds in cpu_seconds_by_role(before, after).items()
    }


def cores_from(notes: dict[str, Any], wall_s: float) -> dict[str, float]:
    """``cpu_cores_<role>``: CPU seconds over the window's wall time (1.0 = one core busy all the time)."""
    if wall_s <= 0:
        return {}
    return {
        f"cpu_cores_{key[len('cpu_s_') :]}": float(value) / wall_s
        for key, value in notes.items()
        if key.startswith("cpu_s_")
    }
