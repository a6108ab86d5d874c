"""RolloutScheduler: the driver-side handle on a distributed rollout over Ray actors.

The group queue and the env loops must run outside the driver, spread over
nodes and restartable when a process dies, while the pipeline still asks for
batches with one awaitable call; this module builds and supervises those
actors (one GroupQueueActor, several EnvManagerWorkers) behind that call.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from roll_async.config.rollout_spec import RolloutSpec
from roll_async.env_managers.worker import EnvFactory, EnvManagerWorker
from roll_async.envs.multiplayer.ratings import PoolRatings
from roll_async.errors import InvalidInputError, RolloutFatalError
from roll_async.metrics import replica_metrics
from roll_async.rewards.reward_services import RewardService
from roll_async.runtime import node_files, sched_policy
from roll_async.runtime.ray_utils import (
    actor_death_errors,
    describe_ray_error,
    unwrap_ray_error,
)
from roll_async.runtime.zmq_calls import ServesCallsOverZmq
from roll_async.scheduler.group_queue import GroupQueueManager
from roll_async.scheduler.handover_ledger import HandoverLedger
from roll_async.scheduler.layout import rollout_layout
from roll_async.scheduler.served_batch import ServedBatch
from roll_async.trajectory import EpisodeSpec, Trajectory

logger = logging.getLogger(__name__)

_ENGINE_STATS_TIMEOUT_S = 5.0
_SHUTDOWN_TIMEOUT_S = 30.0


#: GroupQueueActor methods the EnvManagerWorkers call over ZMQ (engine.request_transport: zmq): one per episode.
QUEUE_HANDOVER_METHODS = (
    "next_episode",
    "put_trajectory",
    "put_trajectory_and_next_episode",
)


class GroupQueueActor(ServesCallsOverZmq):
    """Ray actor around a GroupQueueManager; forwards episode cancellations to the EnvManagerWorkers.

    Every method is ``async`` so all of them run on the actor's event loop (the
    manager is not thread-safe). The per-episode hand-overs can also come over its
    ZMQ call socket (``call_endpoint``, roll_async/runtime/zmq_calls.py): one process serves
    every worker, and a ZMQ call costs it less CPU than a Ray call (benchmarks/README.md,
    "Episode hand-overs over ZMQ too"). Those calls are not
    cancellable from the caller, as a Ray call is not: the queue finishes a hand-over whose
    caller gave up, and a seat handed to a dead worker's call is returned by the incarnation
    check. A hand-over carries an id; one retried after a dropped connection is answered
    once (``HandoverLedger``), so no trajectory counts twice and no env gets two seats.
    The socket closes (``close_call_socket``) once the workers have stopped.
    """

    ZMQ_METHODS = QUEUE_HANDOVER_METHODS
    ZMQ_NAME = "queue"
    ZMQ_CANCELLABLE = False

    def __init__(
        self,
        spec: RolloutSpec,
        start_step: int,
        seed_state: dict[str, Any] | None = None,
    ) -> None:
        self._workers_by_env: dict[int, Any] = {}
        #: env_id -> incarnation of the worker that hosts it now (bumped on each restart).
        self._incarnation: dict[int, int] = {}
        self._handovers = HandoverLedger()
        self.queue = GroupQueueManager.from_spec(
            spec, on_cancel=self._cancel, start_step=start_step
        )
        if seed_state:
            self.queue.load_seed_state(seed_state)
        # Every hand-over wakes this process; like the workers, it must not preempt vLLM's steps.
        sched_policy.apply_to_process(spec.env_manager.rollout_sched_policy)

    async def ping(self) -> None:
        """A liveness probe for ZMQ callers whose connection dropped."""

    def _cancel(self, env_id: int, group_id: int, episode_id: int) -> None:
        worker = self._workers_by_env.get(env_id)
        if worker is not None:
            worker.cancel_episode.remote(
                env_id, group_id, episode_id
            )  # fire and forget

    async def set_workers(self, workers_by_env: dict[int, Any]) -> None:
        self._workers_by_env = dict(workers_by_env)

    async def next_episode(
        self, env_id: int, incarnation: int = 0, handover_id: str | None = None
    ) -> EpisodeSpec | None:
        return await self._handovers.run(
            env_id, handover_id, lambda: self._next_episode(env_id, incarnation)
        )

    async def _next_episode(self, env_id: int, incarnation: int) -> EpisodeSpec | None:
        spec = await self.queue.next_episode(env_id)
        if spec is not None and incarnation < self._incarnation.get(env_id, 0):
            # The call came from a worker that died while it waited: nobody will play this seat, give it back.
            await self.queue.put_trajectory(
                Trajectory(
                    tag=spec.tag,
                    group_id=spec.group_id,
                    episode_id=spec.episode_id,
                    env_id=env_id,
                    seed=spec.seed,
                    traj_id=f"{spec.tag}-g{spec.group_id}-e{spec.episode_id}",
                    created_step=spec.created_step,
                    stop_reason="aborted",
                )
            )
            return None
        return spec

    async def restart_envs(
        self, env_ids: list[int], reason: str, incarnation: int
    ) -> int:
        """Their worker died; its replacement is ``incarnation``. Re-opens their in-flight seats (see group_queue)."""
        for env_id in env_ids:
            self._incarnation[env_id] = incarnation
            self._handovers.forget(env_id)
        return await self.queue.on_worker_restart(env_ids, reason)

    async def put_trajectory(
        self, trajectory: Trajectory, handover_id: str | None = None
    ) -> None:
        await self._handovers.run(
            trajectory.env_id,
            handover_id,
            lambda: self.queue.put_trajectory(trajectory),
        )

    async def put_trajectory_and_next_episode(
        self,
        trajectory: Trajectory,
        incarnation: int = 0,
        handover_id: str | None = None,
    ) -> EpisodeSpec | None:
        """put_trajectory then next_episode for the same env, in one call from the worker."""

        async def both() -> EpisodeSpec | None:
            await self.queue.put_trajectory(trajectory)
            return await self._next_episode(trajectory.env_id, incarnation)

        return await self._handovers.run(trajectory.env_id, handover_id, both)

    async def get_batch(self, step: int) -> ServedBatch:
        return await self.queue.get_batch(step)

    async def run_fixed_round(
        self, episodes: list[EpisodeSpec], step: int
    ) -> ServedBatch:
        return await self.queue.run_fixed_round(episodes, step)

    async def suspend(self, cancel_in_flight: bool = True) -> None:
        self.queue.suspend(cancel_in_flight)

    async def resume(self) -> None:
        self.queue.resume()

    async def report_fatal(self, message: str) -> None:
        self.queue.report_fatal(message)

    async def report_stalled(self, env_id: int, description: str) -> None:
        self.queue.report_stalled(env_id, description)

    async def clear_stalled(self, env_id: int) -> None:
        self.queue.clear_stalled(env_id)

    async def shutdown(self) -> None:
        self.queue.shutdown()

    async def describe(self) -> dict[str, Any]:
        return {
            **self.queue.describe(),
            "handovers_over_zmq": self.calls_served,
            "handover_retries": self._handovers.retries,
            "sched_policy": sched_policy.process_policies(),
        }

    async def seed_state(self) -> dict[str, Any]:
        return self.queue.seed_state()

    async def failure(self) -> str | None:
        return str(self.queue.failure) if self.queue.failure is not None else None


async def _gather_quietly(refs: list[Any]) -> list[Any]:
    """Results of Ray calls for metrics: exceptions in place of failed ones, [] if they time out together."""
    try:
        return list(
            await asyncio.wait_for(
                asyncio.gather(*refs, return_exceptions=True), _ENGINE_STATS_TIMEOUT_S
            )
        )
    except Exception:
        logger.debug("stats unavailable", exc_info=True)
        return []


class RolloutScheduler:
    """Creates and drives the rollout actors of one rollout side (a RolloutSpec); a ``RolloutScheduling``.

    It creates one GroupQueueActor around a GroupQueueManager (the rules: ``roll_async.scheduler.group_queue``)
    and ``ceil(num_envs / max_env_num_per_worker)`` EnvManagerWorker actors, each hosting its share of
    EnvManagers as asyncio tasks with its own Router over the engine replicas. Ray places the workers, so
    with a cluster address they spread over nodes. Typical use::

        scheduler = RolloutScheduler(rollout_spec(config, "train"), engine_handles=engines, tokenizer_path=path)
        for step in range(num_steps):
            batch = await scheduler.get_batch(step)   # blocks: the spec's rollout_batch_size
            metrics = scheduler.last_metrics
            ...train, update weights to version step + 1...
            await scheduler.resume()        # sync mode: loops were suspended when get_batch returned
        await scheduler.shutdown()

    ``resume()`` is optional in sync mode (the next ``get_batch`` resumes), but calling it right after the
    weight update lets generation for the next step start while the pipeline does other work. ``get_batch``
    raises RolloutFatalError with the root cause if the env loops die instead of waiting forever. A worker
    whose process dies is restarted instead: a new actor with the same envs, whose in-flight episodes are
    lost to the restart and their seats refilled (``rollout/worker_restarts``,
    ``rollout/episodes_lost_to_restart``; no env-error budget is spent); only past ``max_worker_restarts`` restarts
    does ``get_batch`` fail, naming the budget and the cause.
    """

    def __init__(
        self,
        spec: RolloutSpec,
        *,
        engine_handles: Sequence[Any],
        tokenizer_path: str,
        env_factory: EnvFactory | None = None,
        start_step: int = 0,
        version_base: int = 0,
        seed_state: dict[str, Any] | None = None,
        reward_services: Mapping[str, RewardService] | None = None,
        opponent_engines: Mapping[str, Sequence[Any]] | None = None,
        snapshot_engines: Mapping[int, Sequence[Any]] | None = None,
        ratings_state: Mapping[str, Any] | None = None,
    ) -> None:
        """``reward_services``: tag -> its running judge / reward model (``launch_reward_services``), owned by the
        caller; the tags of this side that have one get their episodes scored before the hand-over.
        ``opponent_engines``: a ``frozen:`` seat's model path -> the engine actors serving it, owned by the
        caller (never weight-synced). ``snapshot_engines``: a full-weight run's policy snapshots, lag k -> the
        engine actors serving the policy k syncs back (``pipelines/snapshot_engines.py``); none: snapshot seats
        play on the policy's engines. ``ratings_state``: the game ratings a checkpoint saved
        (``ratings.state()``), to go on from."""
        if not engine_handles:
            raise InvalidInputError(
                "RolloutScheduler needs at least one engine actor handle"
            )
        self.spec = spec
        self.engine_handles = list(engine_handles)
        self.tokenizer_path = str(tokenizer_path)
        self.env_factory = env_factory
        self.start_step = start_step
        self.initial_seed_state = seed_state
        #: The engines' weight version at step 0 (step s rolls out with version_base + s); the lag metric needs it.
        self.version_base = version_base
        self.reward_services = {
            tag: service
            for tag, service in (reward_services or {}).items()
            if tag in spec.custom_envs
        }
        self.opponent_engines = {
            model: list(handles) for model, handles in (opponent_engines or {}).items()
        }
        self.snapshot_engines = {
            lag: list(handles) for lag, handles in (snapshot_engines or {}).items()
        }
        self.last_metrics: dict[str, float] = {}
        #: Elo-style ratings of game tags' policies against their snapshots, across the run's batches.
        self.ratings = PoolRatings.from_state(ratings_state)
        self.last_unserved: list[tuple[str, Trajectory]] = []
        self._queue: Any = None
        self._workers: list[Any] = []
        self._run_futures: list[asyncio.Future[Any]] = []
        self._chunks: list[list[tuple[int, str]]] = []
        self._incarnations: list[int] = []
        self.worker_restarts = 0
        self._started = False

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    async def start(self) -> None:
        """Create the actors and start the env loops (get_batch does this on first use)."""
        if self._started:
            return
        import ray

        layout = rollout_layout(self.spec)
        per_worker = self.spec.env_manager.max_env_num_per_worker
        chunks = [layout[i : i + per_worker] for i in range(0, len(layout), per_worker)]
        assert len(chunks) == math.ceil(len(layout) / per_worker)
        self._queue = (
            ray.remote(GroupQueueActor)
            .options(num_cpus=0, max_concurrency=2 * len(layout) + 64)
            .remote(self.spec, self.start_step, self.initial_seed_state)
        )
        self._chunks = chunks
        self._incarnations = [0] * len(chunks)
        # The tokenizer files go to the object store once; a worker on a node without the path uses them.
        self._tokenizer_files = ray.put(node_files.tokenizer_files(self.tokenizer_path))
        self._workers = [self._create_worker(index) for index in range(len(chunks))]
        try:
            # surfaces constructor errors now
            await asyncio.gather(*(w.describe.remote() for w in self._workers))
        except Exception as exc:
            await self._kill_actors()
            raise RolloutFatalError(
                f"an EnvManagerWorker failed to start: {unwrap_ray_error(exc)}"
            ) from exc
        await self._queue.set_workers.remote(
            {
                env_id: self._workers[i]
                for i, chunk in enumerate(chunks)
                for env_id, _ in chunk
            }
        )
        self._run_futures = [
            asyncio.wrap_future(w.run.remote().future()) for w in self._workers
        ]
        self._started = True
        logger.info(
            "%s rollout: %d envs on %d EnvManagerWorkers",
            self.spec.role,
            len(layout),
            len(self._workers),
        )

    def _create_worker(self, index: int) -> Any:
        import ray

        em = self.spec.env_manager
        chunk = self._chunks[index]
        strategy = "SPREAD" if em.worker_placement == "spread" else "DEFAULT"
        return (
            ray.remote(EnvManagerWorker)
            .options(
                num_cpus=em.num_cpus_per_worker,
                max_concurrency=4 * len(chunk) + 64,
                scheduling_strategy=strategy,
            )
            .remote(
                index,
                self.spec,
                chunk,
                self._queue,
                self.engine_handles,
                self.tokenizer_path,
                self.env_factory,
                self._incarnations[index],
                tokenizer_files=self._tokenizer_files,
                reward_services=self.reward_services,
                opponent_engines=self.opponent_engines,
                snapshot_engines=self.snapshot_engines,
            )
        )

    async def _restart_worker(self, index: int, cause: BaseException) -> None:
        """Replace dead worker ``index``: new actor, its envs' in-flight episodes are lost (seats re-open), its loops start."""
        import ray

        self.worker_restarts += 1
        self._incarnations[index] += 1
        reason = describe_ray_error(cause)
        logger.warning(
            "EnvManagerWorker %d died (%s); restarting it (restart %d of at most %d)",
            index,
            reason.splitlines()[0],
            self.worker_restarts,
            self.spec.env_manager.max_worker_restarts,
        )
        try:
            ray.kill(self._workers[index], no_restart=True)
        except Exception:
            pass
        worker = self._create_worker(index)
        try:
            await worker.describe.remote()  # constructor errors surface here
        except Exception as exc:
            raise RolloutFatalError(
                f"EnvManagerWorker {index} died ({reason.splitlines()[0]}) and its replacement failed to start: "
                f"{unwrap_ray_error(exc)}"
            ) from exc
        env_ids = [env_id for env_id, _ in self._chunks[index]]
        await self._queue.restart_envs.remote(
            env_ids, reason.splitlines()[0], self._incarnations[index]
        )
        self._workers[index] = worker
        await self._queue.set_workers.remote(
            {
                env_id: self._workers[i]
                for i, chunk in enumerate(self._chunks)
                for env_id, _ in chunk
            }
        )
        self._run_futures[index] = asyncio.wrap_future(worker.run.remote().future())

    async def get_batch(self, step: int) -> list[Trajectory]:
        """Block until the spec's batch (groups_per_batch whole groups) is ready; metrics go to ``last_metrics``."""
        trajectories, _ = await self.get_batch_with_metrics(step)
        return trajectories

    async def get_batch_with_metrics(
        self, step: int
    ) -> tuple[list[Trajectory], dict[str, float]]:
        await self.start()
        served: ServedBatch = await self._unless_loops_die(
            self._queue.get_batch.remote(step)
        )
        engine_stats = await self._engine_stats()
        self.last_metrics = served.rollout_metrics(engine_stats, self.version_base)
        self.last_metrics.update(self.ratings.update(served.trajectories))
        self.last_metrics.update(
            replica_metrics(engine_stats, await self._router_stats())
        )
        # episodes of this window not served: (fate, trajectory)
        self.last_unserved = served.unserved
        return served.trajectories, self.last_metrics

    async def run_fixed_round(
        self, episodes: Sequence[EpisodeSpec], step: int
    ) -> ServedBatch:
        """Play each episode once (validation); see GroupQueueManager.run_fixed_round."""
        await self.start()
        served: ServedBatch = await self._unless_loops_die(
            self._queue.run_fixed_round.remote(list(episodes), step)
        )
        return served

    async def _unless_loops_die(self, ref: Any) -> Any:
        """Await ``ref``; a worker whose process died is restarted (within the budget), any other end is fatal."""
        result_future = asyncio.wrap_future(ref.future())
        while True:
            try:
                done, _ = await asyncio.wait(
                    {result_future, *self._run_futures},
                    return_when=asyncio.FIRST_COMPLETED,
                )
            except asyncio.CancelledError:  # the caller gave up (e.g. Ctrl-C): its answer, error or not, is not wanted
                result_future.cancel()
                raise
            if result_future in done:
                try:
                    return result_future.result()
                except RolloutFatalError as error:
                    raise RolloutFatalError(str(unwrap_ray_error(error))) from None
            ended = next(f for f in self._run_futures if f in done)
            index = self._run_futures.index(ended)
            exc = ended.exception()
            try:  # the queue knows the root cause when a loop reported it before its worker stopped
                reported = await asyncio.wait_for(
                    self._queue.failure.remote(), _ENGINE_STATS_TIMEOUT_S
                )
            except Exception:
                reported = None
            if reported:
                result_future.cancel()
                raise RolloutFatalError(reported) from exc
            budget = self.spec.env_manager.max_worker_restarts
            if isinstance(exc, actor_death_errors()) and self.worker_restarts < budget:
                await self._restart_worker(index, exc)
                continue
            result_future.cancel()
            reason = describe_ray_error(exc) if exc else "its env loops exited"
            if isinstance(exc, actor_death_errors()):
                raise RolloutFatalError(
                    f"EnvManagerWorker {index} died after {self.worker_restarts} worker restarts, the budget "
                    f"{self.spec.section}.max_worker_restarts={budget} (raise it to tolerate more): {reason}"
                ) from exc
            raise RolloutFatalError(
                f"EnvManagerWorker {index} stopped: {reason}"
            ) from exc

    async def _engine_stats(self) -> list[dict[str, Any]]:
        """Stats per replica (an empty dict for a replica that does not answer, e.g. a dead one)."""
        results = await _gather_quietly([h.stats.remote() for h in self.engine_handles])
        return [r if isinstance(r, dict) else {} for r in results]

    async def _router_stats(self) -> list[dict[str, Any]]:
        """Every worker's Router counters (one call per worker per batch)."""
        return [
            r
            for r in await _gather_quietly(
                [w.router_stats.remote() for w in self._workers]
            )
            if isinstance(r, dict)
        ]

    async def suspend(self, cancel_in_flight: bool = True) -> None:
        await self.start()
        await self._queue.suspend.remote(cancel_in_flight)

    async def resume(self) -> None:
        await self.start()
        await self._queue.resume.remote()

    async def seed_state(self) -> dict[str, Any]:
        """Where the seed sequence stands (saved in checkpoints; see GroupQueueManager.seed_state)."""
        await self.start()
        state: dict[str, Any] = await self._queue.seed_state.remote()
        return state

    async def describe(self) -> dict[str, Any]:
        """Scheduler state and per-worker env phases, for debugging."""
        if not self._started:
            return {"started": False}
        queue = await self._queue.describe.remote()
        workers = await asyncio.gather(
            *(w.describe.remote() for w in self._workers), return_exceptions=True
        )
        return {
            "started": True,
            "queue": queue,
            "workers": [w if isinstance(w, dict) else repr(w) for w in workers],
        }

    async def drop_queue_connections(self) -> bool:
        """Fault injection (``benchmarks/chaos.py``): the queue actor's call socket is replaced, so every worker's
        hand-over connection drops while the queue lives (``rollout/transport_reconnects``)."""
        if not self._started:
            return False
        return bool(await self._queue.drop_call_connections.remote())

    async def shutdown(self) -> None:
        """Stop the loops and kill the actors; safe to call twice."""
        if not self._started:
            return
        self._started = False
        try:
            await asyncio.wait_for(self._queue.shutdown.remote(), _SHUTDOWN_TIMEOUT_S)
            await asyncio.wait_for(
                asyncio.gather(
                    *(w.stop.remote() for w in self._workers), return_exceptions=True
                ),
                _SHUTDOWN_TIMEOUT_S,
            )
            await asyncio.wait_for(
                asyncio.gather(*self._run_futures, return_exceptions=True),
                _SHUTDOWN_TIMEOUT_S,
            )
            await asyncio.wait_for(
                self._queue.close_call_socket.remote(), _SHUTDOWN_TIMEOUT_S
            )
        except Exception:
            logger.warning(
                "rollout actors did not stop cleanly; killing them", exc_info=True
            )
        await self._kill_actors()

    async def _kill_actors(self) -> None:
        import ray

        for actor in [*self._workers, self._queue]:
            if actor is None:
                continue
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self._workers, self._queue, self._run_futures = [], None, []
