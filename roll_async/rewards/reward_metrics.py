"""Batch metrics of rewards from models, computed from what EpisodeRewardScorer left in each Trajectory.

The scorer runs inside EnvManagers in many processes, so the batch's reward
latency and failure counts are rebuilt from the trajectories themselves rather
than gathered from every scorer's counters.
"""

from __future__ import annotations

from collections.abc import Sequence

from roll_async import metrics
from roll_async.trajectory import Trajectory


def reward_batch_metrics(batch: Sequence[Trajectory]) -> dict[str, float]:
    """``time/reward/{mean,p99}`` and the ``rollout/reward_*`` counts over the scored trajectories ({} if none)."""
    scored = [t.metrics for t in batch if metrics.MODEL_REWARD_S in t.metrics]
    if not scored:
        return {}
    seconds = [m[metrics.MODEL_REWARD_S] for m in scored]

    def total(key: str) -> float:
        return float(sum(m.get(key, 0.0) for m in scored))

    return {
        metrics.TIME_REWARD_MEAN: metrics.mean(seconds),
        metrics.TIME_REWARD_P99: metrics.percentile(seconds, 99),
        metrics.REWARD_FAILURES: total(metrics.MODEL_REWARD_FAILED),
        metrics.REWARD_TIMEOUTS: total(metrics.MODEL_REWARD_TIMEOUTS),
        metrics.REWARD_PARSE_FAILURES: total(metrics.MODEL_REWARD_PARSE_FAILED),
        metrics.REWARD_RETRIES: total(metrics.MODEL_REWARD_RETRIES),
    }
