"""Rollout scheduling: which env plays which episode, and when a batch of whole groups is ready.

Importing this package does not import Ray: ``RolloutScheduler`` (Ray actors)
and ``LocalRolloutScheduler`` (in-process) load on first attribute access.
"""

from __future__ import annotations

from typing import Any

from roll_async.errors import RolloutFatalError
from roll_async.scheduler.filters import GROUP_FILTERS, resolve_group_filter
from roll_async.scheduler.group_queue import (
    GroupQueueManager,
    ServedBatch,
    derive_seed,
    env_layout,
)

_LAZY = {
    "RolloutScheduler": "roll_async.scheduler.rollout_scheduler",
    "LocalRolloutScheduler": "roll_async.scheduler.local",
    "ValidationScheduler": "roll_async.scheduler.validation",
    "build_validation_episodes": "roll_async.scheduler.validation",
}

__all__ = [
    "GROUP_FILTERS",
    "GroupQueueManager",
    "LocalRolloutScheduler",
    "RolloutFatalError",
    "RolloutScheduler",
    "ServedBatch",
    "ValidationScheduler",
    "build_validation_episodes",
    "derive_seed",
    "env_layout",
    "resolve_group_filter",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'roll_async.scheduler' has no attribute {name!r}")
