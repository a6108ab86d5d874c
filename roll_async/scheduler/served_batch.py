"""What the group queue hands the trainer side: a batch of whole groups and the counts behind its metrics.

A served batch crosses a process boundary (from the queue actor to the
driver) and feeds metrics, the run directory and validation, none of which
need the queue itself; this module lets them import the record alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from roll_async.metrics import rollout_metrics
from roll_async.trajectory import Trajectory


@dataclass
class SchedulerCounters:
    """Cumulative event counts; batches report the difference since the previous batch."""

    dropped_stale_groups: int = 0
    filtered_groups: int = 0
    filter_bypassed_groups: int = 0
    env_errors: int = 0
    dropped_error_groups: int = 0
    cancelled_episodes: int = 0
    late_trajectories: int = 0
    completed_groups: int = 0
    created_groups: int = 0
    worker_restarts: int = 0
    episodes_lost_to_restart: int = 0

    def minus(self, earlier: SchedulerCounters) -> dict[str, int]:
        now, before = asdict(self), asdict(earlier)
        return {key: now[key] - before[key] for key in now}


@dataclass
class ServedBatch:
    """What get_batch returns: the trajectories (whole groups, oldest first) and the bookkeeping for metrics."""

    trajectories: list[Trajectory]
    step: int
    #: Seconds get_batch waited.
    wait_s: float
    #: Seconds of rollout this batch stands for: since the previous batch (or resume), whichever is later.
    window_s: float
    #: Events since the previous batch (SchedulerCounters fields).
    counters: dict[str, int] = field(default_factory=dict)
    #: Current state: stalled_envs, pending_groups, in_flight_episodes.
    gauges: dict[str, float] = field(default_factory=dict)
    #: Episodes since the previous batch that were not served, as (fate, trajectory): env_error, late,
    #: dropped_stale, filtered, dropped_errors, lost_to_restart, redundant. The run directory records them (unserved_trajectories.jsonl).
    unserved: list[tuple[str, Trajectory]] = field(default_factory=list)

    def rollout_metrics(
        self, engine_stats: Sequence[Mapping[str, Any]] = (), version_base: int = 0
    ) -> dict[str, float]:
        """The rollout metrics of this batch (names in roll_async.metrics.rollout_metrics).

        ``version_base``: the engines' weight version at step 0 (the weight-version lag counts from it).
        """
        return rollout_metrics(
            self.trajectories,
            step=self.step,
            wait_s=self.wait_s,
            window_s=self.window_s,
            counters=self.counters,
            gauges=self.gauges,
            engine_stats=list(engine_stats),
            version_base=version_base,
        )
