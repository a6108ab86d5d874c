"""LocalRolloutScheduler: the whole rollout in this process and event loop, no Ray.

Fast tests, debugging and single-process benchmarks need the real rollout path
(queue, env managers, router) without actors; this module assembles the same
pieces as the Ray-based RolloutScheduler, with the same API, in one event loop
over engines passed in as objects (a FakeEngine or an in-process engine).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from roll_async.config.rollout_spec import RolloutSpec
from roll_async.engine.router import EngineClient, Router
from roll_async.env_managers.game_episode import OpponentModel
from roll_async.env_managers.worker import (
    EnvFactory,
    EnvManagerHost,
    build_env_managers,
)
from roll_async.envs.multiplayer.ratings import PoolRatings
from roll_async.errors import RolloutFatalError
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.rewards.scorer import EpisodeRewardScorer
from roll_async.scheduler.group_queue import GroupQueueManager
from roll_async.scheduler.layout import rollout_layout
from roll_async.scheduler.served_batch import ServedBatch
from roll_async.trajectory import EpisodeSpec, Trajectory

T = TypeVar("T")


class LocalRolloutScheduler:
    """In-process rollout of one rollout side (a RolloutSpec) over ``engines`` (one object or a list of replicas).

    Same API as the Ray-based RolloutScheduler (``RolloutScheduling``, roll_async/scheduler/interface.py; here
    ``suspend`` and ``resume`` act at once), built from the same pieces (GroupQueueManager, EnvManagerHost, Router).
    """

    def __init__(
        self,
        spec: RolloutSpec,
        *,
        engines: EngineClient | Sequence[EngineClient],
        tokenizer: ChatTokenizer,
        env_factory: EnvFactory | None = None,
        start_step: int = 0,
        version_base: int = 0,
        reward_scorers: Mapping[str, EpisodeRewardScorer] | None = None,
        opponents: Mapping[str, tuple[Sequence[EngineClient], ChatTokenizer]]
        | None = None,
        snapshot_engines: Mapping[int, Sequence[EngineClient]] | None = None,
    ) -> None:
        """``reward_scorers``: tag -> the scorer of that tag's episodes (custom_envs.<Tag>.reward);
        ``opponents``: a ``frozen:`` seat's model path -> the engines serving it and its tokenizer;
        ``snapshot_engines``: a full-weight run's policy snapshots, lag k -> the engines serving it."""
        em = spec.env_manager
        self.spec = spec
        self.engines: list[EngineClient] = (
            list(engines)
            if isinstance(engines, (list, tuple))
            else [cast(EngineClient, engines)]
        )
        self.group_queue = GroupQueueManager.from_spec(
            spec, on_cancel=self._cancel, start_step=start_step
        )
        self.router = Router(self.engines)
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, em.env_threads_per_worker), thread_name_prefix="env"
        )
        self.managers = build_env_managers(
            spec,
            rollout_layout(spec),
            scheduler=self.group_queue,
            engine_for=self.router.client_for,
            tokenizer=tokenizer,
            env_factory=env_factory,
            executor=self._executor,
            reward_scorers=reward_scorers,
            opponents={
                model: OpponentModel(Router(list(engines)).client_for, model_tokenizer)
                for model, (engines, model_tokenizer) in (opponents or {}).items()
            },
            snapshots={
                lag: Router(list(engines)).client_for
                for lag, engines in (snapshot_engines or {}).items()
            },
        )
        self.host = EnvManagerHost(
            self.managers,
            watchdog_timeout_s=em.watchdog_timeout_s,
            on_stall=self.group_queue.report_stalled,
            on_recover=self.group_queue.clear_stalled,
            on_fatal=self.group_queue.report_fatal,
        )
        self._run_task: asyncio.Task[None] | None = None
        #: The engines' weight version at step 0 (step s rolls out with version_base + s); the lag metric needs it.
        self.version_base = version_base
        self.last_metrics: dict[str, float] = {}
        #: Elo-style ratings of game tags' policies against their snapshots, across the run's batches.
        self.ratings = PoolRatings()
        #: The last batch window's episodes that were not served, as (fate, trajectory).
        self.last_unserved: list[tuple[str, Trajectory]] = []

    def _cancel(self, env_id: int, group_id: int, episode_id: int) -> None:
        self.host.cancel_episode(env_id, group_id, episode_id)

    async def start(self) -> None:
        """Start the env loops (get_batch does this on first use)."""
        if self._run_task is None:
            self._run_task = asyncio.create_task(
                self.host.run(), name="local-rollout-host"
            )

    async def get_batch(self, step: int) -> list[Trajectory]:
        """Block until the spec's batch (groups_per_batch whole groups) is ready; metrics go to ``last_metrics``."""
        trajectories, _ = await self.get_batch_with_metrics(step)
        return trajectories

    async def get_batch_with_metrics(
        self, step: int
    ) -> tuple[list[Trajectory], dict[str, float]]:
        await self.start()
        served: ServedBatch = await self._unless_loops_die(
            self.group_queue.get_batch(step)
        )
        self.last_metrics = served.rollout_metrics(
            await self._engine_stats(), self.version_base
        )
        self.last_metrics.update(self.ratings.update(served.trajectories))
        self.last_unserved = served.unserved
        return served.trajectories, self.last_metrics

    async def run_fixed_round(
        self, episodes: Sequence[EpisodeSpec], step: int
    ) -> ServedBatch:
        await self.start()
        return await self._unless_loops_die(
            self.group_queue.run_fixed_round(episodes, step)
        )

    async def _unless_loops_die(self, awaitable: Awaitable[T]) -> T:
        assert self._run_task is not None
        task = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait(
            {task, self._run_task}, return_when=asyncio.FIRST_COMPLETED
        )
        if task in done:
            return task.result()
        task.cancel()
        # the loops ended because the rollout failed: report why
        if self.group_queue.failure is not None:
            raise self.group_queue.failure
        exc = self._run_task.exception() if not self._run_task.cancelled() else None
        raise RolloutFatalError(
            f"the env rollout loops stopped: {exc or 'they exited'}"
        ) from exc

    async def _engine_stats(self) -> list[dict[str, Any]]:
        stats: list[dict[str, Any]] = []
        for engine in self.engines:
            method = getattr(engine, "stats", None)
            if method is None:
                continue
            try:
                result = method()
                stats.append(await result if inspect.isawaitable(result) else result)
            except Exception:
                pass
        return stats

    def suspend(self, cancel_in_flight: bool = True) -> None:
        self.group_queue.suspend(cancel_in_flight)

    def resume(self) -> None:
        self.group_queue.resume()

    async def seed_state(self) -> dict[str, Any]:
        """Where the seed sequence stands (see GroupQueueManager.seed_state)."""
        return self.group_queue.seed_state()

    async def shutdown(self) -> None:
        self.group_queue.shutdown()
        await self.host.stop()
        if self._run_task is not None:
            await asyncio.gather(self._run_task, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
