"""What the pipeline and the benchmarks call on a rollout scheduler, written down once.

Two classes schedule rollouts, RolloutScheduler over Ray actors and
LocalRolloutScheduler in one process, and the pipeline (its batch source,
checkpoint, step log and validation) and the benchmarks drive either one
through the same calls. This Protocol is those calls, so callers are typed by
it and a unit test holds both classes to it member by member.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from roll_async.envs.multiplayer.ratings import PoolRatings
from roll_async.scheduler.served_batch import ServedBatch
from roll_async.trajectory import EpisodeSpec, Trajectory


class RolloutScheduling(Protocol):
    """The rollout of one rollout side (a RolloutSpec), as the pipeline and the benchmarks drive it.

    ``suspend`` and ``resume`` act at once in process (LocalRolloutScheduler) and are coroutines over Ray
    (RolloutScheduler): await the result when it is awaitable. Calls that only one kind has stay on that
    class: the Ray scheduler's ``describe``, ``drop_queue_connections`` (fault injection) and
    ``num_workers``, the local one's ``group_queue`` and ``managers``.
    """

    #: The episodes of the last batch's window that were not served, as (fate, trajectory).
    last_unserved: list[tuple[str, Trajectory]]
    #: Game tags' Elo-style ratings against their snapshots (checkpointed with ``ratings.state()``).
    ratings: PoolRatings

    async def start(self) -> None:
        """Start the env loops (``get_batch`` does this on first use)."""
        ...

    async def get_batch(self, step: int) -> list[Trajectory]:
        """Wait for the spec's batch of whole groups for ``step``."""
        ...

    async def get_batch_with_metrics(
        self, step: int
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """The batch for ``step`` and its rollout metrics."""
        ...

    async def run_fixed_round(
        self, episodes: Sequence[EpisodeSpec], step: int
    ) -> ServedBatch:
        """Play each episode once, in order (validation)."""
        ...

    def suspend(self, cancel_in_flight: bool = True) -> Awaitable[None] | None:
        """No new episodes until ``resume``; optionally cancel the episodes in flight."""
        ...

    def resume(self) -> Awaitable[None] | None:
        """Let the env loops take episodes again (sync mode: before the next ``get_batch`` asks)."""
        ...

    async def seed_state(self) -> dict[str, Any]:
        """Where the seed sequence stands, for a checkpoint (see GroupQueueManager.seed_state)."""
        ...

    async def shutdown(self) -> None:
        """Stop the env loops and release what the scheduler started."""
        ...
