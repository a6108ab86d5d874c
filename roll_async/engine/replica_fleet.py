"""The driver's engine replicas for weight syncs: pause, update, resume on the live ones only.

The rollout side already survives a replica that dies (its episodes fail over
to the survivors); the driver must too, or a weight sync after a death would
raise and end the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from roll_async import metrics as m
from roll_async.errors import NoLiveReplicaError
from roll_async.runtime.ray_utils import actor_death_errors

logger = logging.getLogger(__name__)


class EngineReplicaFleet:
    """Engine actor handles (index = replica index, as in the Routers) and which of them are dead.

    The rollout side already survives a replica that dies (``router.py``: its episodes
    fail over to the survivors). The driver must too: a weight sync that called
    pause / update / resume on every handle would raise at the first sync after a
    death and end the run. ``EngineReplicaFleet`` owns the handles, marks a replica
    dead when a call on it raises one of Ray's actor-death errors (logged with its
    index and the reason), keeps syncing the others, and always resumes every
    survivor it paused (a replica left paused would stall its episodes for good).
    Only when no replica is left does a sync raise ``NoLiveReplicaError``.
    """

    def __init__(
        self,
        handles: Sequence[Any],
        dead_errors: tuple[type[BaseException], ...] | None = None,
    ) -> None:
        self.handles = list(handles)
        self._dead_errors = dead_errors or actor_death_errors()
        self.dead_reasons: dict[int, str] = {}

    @property
    def live_indices(self) -> list[int]:
        return [i for i in range(len(self.handles)) if i not in self.dead_reasons]

    def metrics(self) -> dict[str, float]:
        return {m.ENGINE_LIVE_REPLICAS: float(len(self.live_indices))}

    def _mark_dead(self, index: int, exc: BaseException) -> None:
        if index in self.dead_reasons:
            return
        self.dead_reasons[index] = f"{type(exc).__name__}: {exc}"
        logger.error(
            "engine replica %d is dead (%s); weight syncs go on with the %d live replicas %s",
            index,
            self.dead_reasons[index],
            len(self.live_indices),
            self.live_indices,
        )

    def _require_live(self, during: str) -> None:
        if not self.live_indices:
            raise self._no_live_replica(during)

    def _no_live_replica(self, during: str) -> NoLiveReplicaError:
        reasons = "; ".join(
            f"replica {i}: {r}" for i, r in sorted(self.dead_reasons.items())
        )
        return NoLiveReplicaError(
            f"every engine replica died ({during}); the run cannot continue. {reasons}"
        )

    async def _call_each(
        self, indices: Sequence[int], call: Callable[[Any], Awaitable[Any]]
    ) -> tuple[list[int], list[BaseException]]:
        """``call`` on each replica at once; a dead one is marked. Returns (replicas that answered, other errors)."""
        results = await asyncio.gather(
            *(call(self.handles[i]) for i in indices), return_exceptions=True
        )
        answered, errors = [], []
        for index, result in zip(indices, results):
            if isinstance(result, self._dead_errors):
                self._mark_dead(index, result)
            elif isinstance(result, BaseException):
                errors.append(result)
            else:
                answered.append(index)
        return answered, errors

    async def sync(
        self,
        in_flight: str,
        update: Callable[[Any], Awaitable[Any]],
        *,
        during: str = "weight sync",
    ) -> list[int]:
        """Pause the live replicas (``in_flight`` policy), ``update`` each paused one, resume every survivor.

        Returns the indices that were updated. A replica that dies at any stage is dropped; an error that is
        not a death (a bad weight name) is raised after the survivors are resumed.
        """
        self._require_live(during)
        paused, errors = await self._call_each(
            self.live_indices, lambda e: e.pause.remote(in_flight)
        )
        updated: list[int] = []
        try:
            if not errors:
                updated, errors = await self._call_each(paused, update)
        finally:
            # Resume every live replica, also one whose pause raised: never leave a survivor paused.
            _, resume_errors = await self._call_each(
                self.live_indices, lambda e: e.resume.remote()
            )
        if errors or resume_errors:
            raise (errors + resume_errors)[0]
        self._require_live(during)
        return updated

    async def push_weights(
        self, buckets: list[Any], version: int, in_flight: str
    ) -> list[int]:
        """Load the weight buckets (``weight_transport``: the same refs for every replica) and record ``version``."""
        return await self.sync(
            in_flight,
            lambda e: e.update_weights.remote(buckets, version),
            during=f"weight sync to version {version}",
        )

    async def push_simulated_version(
        self, version: int, in_flight: str, sync_s: float
    ) -> list[int]:
        """trainer.simulate_step_s: pause as for a real sync, take ``sync_s``, advance the version, resume."""

        async def advance(engine: Any) -> None:
            # concurrent over the replicas: the sync takes sync_s, as a real one would
            await asyncio.sleep(sync_s)
            await engine.advance_weight_version.remote(version)

        return await self.sync(
            in_flight, advance, during=f"simulated weight sync to version {version}"
        )

    async def weight_version(self) -> int:
        """The weight version of the first live replica (every live replica holds the same after a sync)."""
        for index in self.live_indices:
            try:
                return int(await self.handles[index].get_weight_version.remote())
            except self._dead_errors as exc:
                self._mark_dead(index, exc)
        raise self._no_live_replica("reading the weight version")
