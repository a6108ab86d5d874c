"""The Linux scheduling policy of the rollout's own processes: ``batch`` keeps them off vLLM's critical path.

Where env loops share CPU cores with the engine, a waking rollout thread may
preempt the EngineCore or model worker on its core and delay every engine step;
``SCHED_BATCH`` keeps the rollout's fair share (unlike ``nice``) but stops it
preempting on wake-up, at the price of up to one scheduler slice of wake-up
delay for a rollout thread on a busy core.
"""

from __future__ import annotations

import logging
import os

from roll_async.errors import ConfigError

logger = logging.getLogger(__name__)

#: Config value -> name of the ``os`` constant.
POLICIES: dict[str, str] = {"batch": "SCHED_BATCH", "normal": "SCHED_OTHER"}


def apply_to_process(policy: str) -> str:
    """Set ``policy`` (``batch`` | ``normal``) on every thread of this process; returns what is in force.

    Returns ``"unsupported"`` where the platform has no such policy (not Linux).

    The rollout thread then runs when the engine's processes yield (vLLM's processes poll
    with ``sched_yield`` between steps) or at the end of their time slice; ``nice`` instead
    would starve the rollout against vLLM's busy-polling processes.

    Applied by each EnvManagerWorker and the GroupQueueActor at start, to every
    thread of their process (threads they start later inherit it; so do env child
    processes). The driver and the engine's processes are never changed. Linux only;
    elsewhere it is a no-op that says so.
    """
    if policy not in POLICIES:
        raise ConfigError(
            f"scheduling policy {policy!r} is unknown; use one of {sorted(POLICIES)}"
        )
    constant = getattr(os, POLICIES[policy], None)
    if (
        constant is None
        or not hasattr(os, "sched_setscheduler")
        or not os.path.isdir("/proc/self/task")
    ):
        logger.debug("scheduling policy %s not available here; left unchanged", policy)
        return "unsupported"
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), constant, os.sched_param(0))
        except (ProcessLookupError, PermissionError):
            continue  # a thread that just ended; a policy the process may not leave (never for these two)
    return policy


def current(tid: int = 0) -> str:
    """The policy of thread ``tid`` (0: the calling thread) as a config value, or the kernel's number."""
    if not hasattr(os, "sched_getscheduler"):
        return "unsupported"
    number = os.sched_getscheduler(tid)
    for name, constant in POLICIES.items():
        if getattr(os, constant, None) == number:
            return name
    return str(number)


def process_policies() -> dict[str, int]:
    """How many of this process's threads run under each policy (for ``describe()`` and tests)."""
    counts: dict[str, int] = {}
    if not os.path.isdir("/proc/self/task"):
        return counts
    for tid in os.listdir("/proc/self/task"):
        try:
            name = current(int(tid))
        except (ProcessLookupError, OSError):
            continue
        counts[name] = counts.get(name, 0) + 1
    return counts
