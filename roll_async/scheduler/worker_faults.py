"""The group queue's side of env loops that stall and workers that die.

A worker's watchdog reports envs that make no progress, and a dead worker is
replaced while its envs' episodes are lost; neither is an env error. The
stalled-env gauge and re-opening a dead worker's seats are their own role,
apart from how seats are handed out and batches served, so they live here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from roll_async.scheduler.pending_groups import PendingGroups
from roll_async.trajectory import Trajectory

logger = logging.getLogger(__name__)


class StalledEnvs:
    """Envs a watchdog saw in one phase too long (env_id -> what it was doing), until they next talk to the queue."""

    def __init__(self) -> None:
        self._stalled: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._stalled)

    def report(self, env_id: int, description: str, *, waits_for_seat: bool) -> None:
        """Record ``env_id`` as stalled, unless it ``waits_for_seat`` in the queue (it waits by design)."""
        if waits_for_seat:
            logger.debug(
                "watchdog: env %s waits for a seat here: %s", env_id, description
            )
            return
        self._stalled[env_id] = description
        logger.warning("watchdog: env %s makes no progress: %s", env_id, description)

    def clear(self, env_id: int) -> None:
        self._stalled.pop(env_id, None)

    def snapshot(self) -> dict[int, str]:
        return dict(self._stalled)


def reopen_seats_of_dead_envs(
    pending: PendingGroups, env_ids: Iterable[int], reason: str
) -> list[Trajectory]:
    """Re-open every seat in flight on ``env_ids`` (their worker died); each lost episode as an aborted trajectory.

    The trajectories carry no turns: they record which episodes were lost (``lost_to_restart``) and why.
    """
    dead = set(env_ids)
    lost: list[Trajectory] = []
    for group in list(pending.by_id.values()):
        for episode_id, env_id in list(group.in_flight.items()):
            if env_id not in dead:
                continue
            del group.in_flight[episode_id]
            lost.append(
                Trajectory(
                    tag=group.tag,
                    group_id=group.group_id,
                    episode_id=episode_id,
                    env_id=env_id,
                    seed=group.seed,
                    traj_id=f"{group.tag}-g{group.group_id}-e{episode_id}",
                    created_step=group.created_step,
                    stop_reason="aborted",
                    error=f"its EnvManagerWorker died: {reason}",
                )
            )
            pending.list_open(group)
    return lost
