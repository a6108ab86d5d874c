"""Hosting EnvManagers: an in-process host with a watchdog, and the Ray actor that wraps it.

Many env loops share one process, one thread pool and one watchdog, and a
dying loop must become a reported root cause rather than a silent hang; the
host does that without Ray, so the in-process LocalRolloutScheduler and unit
tests use it directly, and the EnvManagerWorker actor only adds what a Ray
process needs (the tokenizer, a Router over engine handles, a queue client).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from roll_async.agent_gateway.server import AgentGateway
from roll_async.agent_gateway.task import served_model_name
from roll_async.config.rollout_spec import RolloutSpec
from roll_async.config.schema import CustomEnvConfig
from roll_async.config.seat_rules import parse_seats
from roll_async.engine.engine_actor import engine_clients
from roll_async.engine.router import EngineClient, Router
from roll_async.env_managers.env_manager import (
    EnvManager,
    EnvManagerSettings,
    EpisodeScheduler,
)
from roll_async.env_managers.game_episode import FrozenSeat, OpponentModel
from roll_async.env_service.env_builder import env_builder
from roll_async.envs import make_env
from roll_async.envs.multiplayer import make_game
from roll_async.errors import CallConnectionLost, QueueActorDeadError, RolloutFatalError
from roll_async.model.paths import resolve_model_path
from roll_async.prompts.images import (
    VisionProcessor,
    is_vision_tag,
    observation_encoder,
)
from roll_async.prompts.prompt_builder import ChatPromptBuilder
from roll_async.prompts.tokenizers import ChatTokenizer, load_tokenizer
from roll_async.rewards.reward_services import RewardService
from roll_async.rewards.scorer import EpisodeRewardScorer
from roll_async.runtime import node_files, sched_policy
from roll_async.runtime.gc_tuning import tune_gc_for_env_loops
from roll_async.runtime.ray_utils import actor_death_errors
from roll_async.runtime.zmq_calls import ZmqCaller
from roll_async.trajectory import EpisodeSpec, Trajectory

logger = logging.getLogger(__name__)

#: Times a hand-over is retried after its call connection dropped before the env loop gives up.
HANDOVER_RETRIES = 8
#: First pause before a retry; doubles up to one second.
HANDOVER_RETRY_BACKOFF_S = 0.05

#: (tag, env_config) -> env. The default builds registered envs with roll_async.envs.make_env.
EnvFactory = Callable[[str, dict[str, Any]], Any]


class RegisteredEnvFactory:
    """Builds the env of a tag from ``custom_envs[tag].env_type`` (picklable: it holds only the env type names)."""

    def __init__(self, custom_envs: Mapping[str, CustomEnvConfig]) -> None:
        self.env_types = {tag: env.env_type for tag, env in custom_envs.items()}
        #: Tags whose env_type is a game with seats (custom_envs.<Tag>.seats): built by make_game.
        self.games = {tag for tag, env in custom_envs.items() if env.seats}

    def __call__(self, tag: str, env_config: dict[str, Any]) -> Any:
        if tag in self.games:
            return make_game(self.env_types[tag], env_config)
        return make_env(self.env_types[tag], env_config)


def build_env_managers(
    spec: RolloutSpec,
    env_specs: Sequence[tuple[int, str]],
    *,
    scheduler: EpisodeScheduler,
    engine_for: Callable[[int], EngineClient],
    tokenizer: ChatTokenizer,
    env_factory: EnvFactory | None = None,
    executor: Executor | None = None,
    vision: VisionProcessor | None = None,
    reward_scorers: Mapping[str, EpisodeRewardScorer] | None = None,
    opponents: Mapping[str, OpponentModel] | None = None,
    snapshots: Mapping[int, Callable[[int], EngineClient]] | None = None,
) -> list[EnvManager]:
    """One EnvManager per (env_id, tag) of the rollout side ``spec`` (validation envs decode greedily).

    ``reward_scorers``: tag -> the scorer its EnvManagers share (custom_envs.<Tag>.reward).
    ``opponents``: a ``frozen:`` seat's model path -> its engines and tokenizer (game tags).
    ``snapshots``: a full-weight run's policy snapshots, lag k -> a client per env of its engine (game tags
    with snapshot or pool seats; the policy's tokenizer). None: they play on the policy's engines.
    """
    em = spec.env_manager
    factory = env_factory or RegisteredEnvFactory(spec.custom_envs)
    request_prefix = f"{spec.role}-{uuid.uuid4().hex[:6]}-"
    # One loopback chat endpoint per worker, for the agent tags (started on the first agent episode).
    agent_gateway = (
        AgentGateway()
        if any(spec.custom_envs[tag].agent_function for _, tag in env_specs)
        else None
    )
    builders: dict[str, ChatPromptBuilder] = {}
    frozen_builders: dict[tuple[str, str], ChatPromptBuilder] = {}
    managers = []
    for env_id, tag in env_specs:
        custom_env = spec.custom_envs[tag]
        if tag not in builders:
            builders[tag] = ChatPromptBuilder.for_model(
                tokenizer, spec.model, custom_env.system_prompt
            )
        settings = EnvManagerSettings(
            tag=tag,
            custom_env=custom_env,
            sequence_length=spec.sequence_length,
            generation=spec.generation,
            env_step_timeout_s=em.env_step_timeout_s,
            greedy=spec.greedy,
        )
        managers.append(
            EnvManager(
                env_id,
                settings,
                make_env=env_builder(
                    tag,
                    custom_env,
                    factory,
                    call_timeout_s=em.env_step_timeout_s,
                    tokenizer=tokenizer,
                ),
                scheduler=scheduler,
                engine=engine_for(env_id),
                prompt_builder=builders[tag],
                executor=executor,
                request_prefix=request_prefix,
                agent_gateway=agent_gateway,
                agent_model_name=served_model_name(spec.model.path),
                agent_tool_parser=spec.model.tool_parser,
                observations=observation_encoder(custom_env, vision),
                reward_scorer=(reward_scorers or {}).get(tag),
                frozen_seats=frozen_seats(
                    spec, tag, env_id, opponents or {}, frozen_builders
                ),
                snapshot_engines={
                    lag: client_for(env_id)
                    for lag, client_for in (snapshots or {}).items()
                },
            )
        )
    return managers


def frozen_seats(
    spec: RolloutSpec,
    tag: str,
    env_id: int,
    opponents: Mapping[str, OpponentModel],
    builders: dict[tuple[str, str], ChatPromptBuilder],
) -> dict[int, FrozenSeat]:
    """The ``frozen:`` seats of ``tag``'s game for env ``env_id``: its client of each model's engines, its builder.

    A frozen model gets its own tokenizer's prompt builder (one per model and tag, shared) with the
    policy's chat-template settings; a seat whose model has no engine here is left out (the game
    runner names it).
    """
    custom_env = spec.custom_envs[tag]
    seats: dict[int, FrozenSeat] = {}
    for seat in parse_seats(tag, custom_env.seats):
        model = opponents.get(seat.player) if seat.kind == "frozen" else None
        if model is None:
            continue
        key = (seat.player, tag)
        if key not in builders:
            builders[key] = ChatPromptBuilder.for_model(
                model.tokenizer, spec.model, custom_env.system_prompt
            )
        seats[seat.seat] = FrozenSeat(model.client_for(env_id), builders[key])
    return seats


def find_stalled(
    managers: Sequence[EnvManager], now: float, timeout_s: float
) -> dict[int, str]:
    """Envs in one phase of STALL_PHASES for longer than ``timeout_s``, waiting for an episode included.

    A wait for an episode may be the queue's doing (quota, sync suspension); the queue tells that apart
    from a request that never reached it or an answer that never came back (``report_stalled``).
    """
    stalled = {}
    for manager in managers:
        progress = manager.progress
        idle_for = now - progress.last_progress_at
        if progress.can_stall and idle_for > timeout_s:
            stalled[manager.env_id] = (
                f"env {manager.env_id} (tag {manager.settings.tag}) stuck in {progress.phase} for {idle_for:.0f}s "
                f"(group {progress.group_id}, episode {progress.episode_id}, turn {progress.turn})"
            )
    return stalled


class EnvManagerHost:
    """Runs EnvManagers as tasks; reports stalls and the first loop that dies.

    Callbacks may be plain functions or coroutine functions (the Ray worker's
    forward to the GroupQueueManager actor).
    """

    def __init__(
        self,
        managers: Sequence[EnvManager],
        *,
        watchdog_timeout_s: float = 300.0,
        on_stall: Callable[[int, str], Any] | None = None,
        on_recover: Callable[[int], Any] | None = None,
        on_fatal: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.managers = {m.env_id: m for m in managers}
        self.watchdog_timeout_s = watchdog_timeout_s
        self._on_stall = on_stall
        self._on_recover = on_recover
        self._on_fatal = on_fatal
        self._clock = clock
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._reported_stalls: set[int] = set()

    async def run(self) -> None:
        """Run every loop until all end; if one raises, stop the others and re-raise with the env named."""
        self._tasks = {
            env_id: asyncio.create_task(m.run_rollout_loop(), name=f"env-loop-{env_id}")
            for env_id, m in self.managers.items()
        }
        watchdog = asyncio.create_task(self._watchdog(), name="env-watchdog")
        try:
            pending = set(self._tasks.values())
            while pending:
                done, pending = await asyncio.wait(
                    pending, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task.cancelled() or task.exception() is None:
                        continue
                    env_id = next(i for i, t in self._tasks.items() if t is task)
                    exc = task.exception()
                    message = f"rollout loop of env {env_id} died: {type(exc).__name__}: {exc}"
                    logger.error(message, exc_info=exc)
                    await self._call(self._on_fatal, message)
                    await self.stop()
                    raise RolloutFatalError(message) from exc
        finally:
            watchdog.cancel()

    def cancel_episode(self, env_id: int, group_id: int, episode_id: int) -> bool:
        manager = self.managers.get(env_id)
        return manager.cancel_episode(group_id, episode_id) if manager else False

    async def stop(self) -> None:
        """Cancel every loop and wait for them (env cleanup runs in their finally blocks)."""
        for manager in self.managers.values():
            manager.stop()
        current = asyncio.current_task()
        tasks = [t for t in self._tasks.values() if t is not current and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        # loops that died of the same cause as the one reported: seen, not lost
        for task in self._tasks.values():
            if task is not current and task.done() and not task.cancelled():
                task.exception()
        # Envs elsewhere (a child process, an env server) must be closed before the worker goes away.
        await asyncio.gather(
            *(m.wait_closed() for m in self.managers.values()), return_exceptions=True
        )
        gateways = {
            id(m.agent_gateway): m.agent_gateway
            for m in self.managers.values()
            if m.agent_gateway is not None
        }
        for gateway in gateways.values():
            await gateway.stop()

    def check_watchdog(self) -> tuple[dict[int, str], list[int]]:
        """(newly stalled envs with a description, envs that recovered since they were reported)."""
        stalled = find_stalled(
            list(self.managers.values()), self._clock(), self.watchdog_timeout_s
        )
        new = {
            env_id: text
            for env_id, text in stalled.items()
            if env_id not in self._reported_stalls
        }
        recovered = [
            env_id for env_id in self._reported_stalls if env_id not in stalled
        ]
        self._reported_stalls = set(stalled)
        return new, recovered

    async def _watchdog(self) -> None:
        interval = max(0.05, min(30.0, self.watchdog_timeout_s / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                new, recovered = self.check_watchdog()
                for env_id, text in new.items():
                    # A long wait for a seat is usually the queue's (it logs the stalls that are real).
                    waiting = (
                        self.managers[env_id].progress.phase == "waiting_for_episode"
                    )
                    logger.log(
                        logging.INFO if waiting else logging.WARNING,
                        "watchdog: %s",
                        text,
                    )
                    await self._call(self._on_stall, env_id, text)
                for env_id in recovered:
                    await self._call(self._on_recover, env_id)
            except Exception:
                logger.exception("watchdog check failed")

    @staticmethod
    async def _call(callback: Callable[..., Any] | None, *args: Any) -> None:
        if callback is None:
            return
        result = callback(*args)
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result


def _node_id() -> str | None:
    try:
        import ray

        node_id: str = ray.get_runtime_context().get_node_id()
        return node_id
    except Exception:
        return None


class RaySchedulerClient:
    """The GroupQueueManager actor seen as an EpisodeScheduler.

    ``incarnation`` numbers the worker's restarts: the queue actor gives back any
    seat handed to a call from an earlier (dead) incarnation of the same envs.
    ``transport`` (``engine.request_transport``): ``zmq`` sends the per-episode
    hand-overs to the actor's call socket (roll_async/runtime/zmq_calls.py), ``ray`` as actor calls.
    Each hand-over carries an id; one whose call connection dropped (``CallConnectionLost``)
    is retried under the same id, which the queue actor answers once (its HandoverLedger).
    """

    def __init__(
        self, handle: Any, incarnation: int = 0, *, transport: str = "ray"
    ) -> None:
        self.handle = handle
        self.incarnation = incarnation
        self._caller: ZmqCaller | None = None
        if transport == "zmq":
            self._caller = ZmqCaller(
                endpoint=lambda: handle.call_endpoint.remote(),
                probe=lambda: handle.ping.remote(),
                dead_errors=actor_death_errors(),
                dead_error=lambda reason: QueueActorDeadError(
                    f"the GroupQueueActor died: {reason}"
                ),
                what="GroupQueueActor",
                fallback="engine.request_transport: ray",
                node_id=_node_id(),
            )

    @property
    def reconnects(self) -> int:
        """Times the call connection to the queue actor dropped while the actor lived on."""
        return self._caller.reconnects if self._caller is not None else 0

    async def _call(self, method: str, *args: Any) -> Any:
        """One hand-over: ``args`` then a fresh hand-over id, retried under that id after a dropped connection."""
        args = (*args, uuid.uuid4().hex)
        if self._caller is None:
            return await getattr(self.handle, method).remote(*args)
        delay, retries = HANDOVER_RETRY_BACKOFF_S, 0
        while True:
            try:
                return await self._caller.call(method, *args)
            except CallConnectionLost:
                retries += 1
                if retries > HANDOVER_RETRIES:
                    raise
                logger.warning(
                    "%s: call connection dropped; retrying the hand-over (%d/%d)",
                    method,
                    retries,
                    HANDOVER_RETRIES,
                )
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    async def next_episode(self, env_id: int) -> EpisodeSpec | None:
        episode: EpisodeSpec | None = await self._call(
            "next_episode", env_id, self.incarnation
        )
        return episode

    async def put_trajectory(self, trajectory: Trajectory) -> None:
        await self._call("put_trajectory", trajectory)

    async def put_trajectory_and_next_episode(
        self, trajectory: Trajectory
    ) -> EpisodeSpec | None:
        """One round trip per episode: the finished trajectory goes with the request for the next seat."""
        episode: EpisodeSpec | None = await self._call(
            "put_trajectory_and_next_episode", trajectory, self.incarnation
        )
        return episode

    def close(self) -> None:
        if self._caller is not None:
            self._caller.close()


class EnvManagerWorker:
    """Ray actor (wrap with ``ray.remote``) hosting the EnvManagers of ``env_specs``.

    ``reward_services``: tag -> the running judge / reward model of that tag (launched by the pipeline);
    this process builds one scorer per tag from it, shared by the tag's EnvManagers here.
    ``opponent_engines``: a ``frozen:`` seat's model path -> the engine actors serving it (launched by the
    pipeline, never weight-synced); this process routes over them and loads the model's tokenizer.
    ``snapshot_engines``: a full-weight run's policy snapshots, lag k -> the engine actors serving the
    policy k syncs back (loaded by the pipeline, outside the policy's weight syncs).
    """

    def __init__(
        self,
        worker_index: int,
        spec: RolloutSpec,
        env_specs: list[tuple[int, str]],
        scheduler_handle: Any,
        engine_handles: list[Any],
        tokenizer_path: str,
        env_factory: EnvFactory | None = None,
        incarnation: int = 0,
        tokenizer_files: dict[str, bytes] | None = None,
        reward_services: Mapping[str, RewardService] | None = None,
        opponent_engines: Mapping[str, list[Any]] | None = None,
        snapshot_engines: Mapping[int, list[Any]] | None = None,
    ) -> None:
        em = spec.env_manager
        self.worker_index = worker_index
        self.incarnation = incarnation
        self._scheduler_handle = scheduler_handle
        # The driver's path if this node has it (shared or same machine), else the files shipped through Ray.
        tokenizer_path = node_files.local_dir(tokenizer_path, tokenizer_files)
        tokenizer = load_tokenizer(
            tokenizer_path, trust_remote_code=spec.model.trust_remote_code
        )
        vision = None
        if any(is_vision_tag(spec.custom_envs[tag]) for _, tag in env_specs):
            vision = VisionProcessor.load(
                tokenizer_path, trust_remote_code=spec.model.trust_remote_code
            )
        self._engine_clients = engine_clients(engine_handles, spec.request_transport)
        self._router = Router(self._engine_clients, rotation_offset=worker_index)
        self._snapshot_clients = {
            lag: engine_clients(handles, spec.request_transport)
            for lag, handles in (snapshot_engines or {}).items()
        }
        self._scheduler_client = RaySchedulerClient(
            scheduler_handle, incarnation, transport=spec.request_transport
        )
        self._reconnects_reported = 0
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, em.env_threads_per_worker), thread_name_prefix="env"
        )
        # One scorer per tag with a reward, shared by its envs here: max_concurrency bounds this process's calls.
        self._reward_scorers = {
            tag: service.scorer(spec.request_transport)
            for tag, service in (reward_services or {}).items()
            if any(tag == env_tag for _, env_tag in env_specs)
        }
        managers = build_env_managers(
            spec,
            env_specs,
            scheduler=self._scheduler_client,
            engine_for=self._router.client_for,
            tokenizer=tokenizer,
            env_factory=env_factory,
            executor=self._executor,
            vision=vision,
            reward_scorers=self._reward_scorers,
            opponents={
                model: OpponentModel(
                    Router(
                        engine_clients(handles, spec.request_transport),
                        rotation_offset=worker_index,
                    ).client_for,
                    load_tokenizer(
                        resolve_model_path(model),
                        trust_remote_code=spec.model.trust_remote_code,
                    ),
                )
                for model, handles in (opponent_engines or {}).items()
            },
            snapshots={
                lag: Router(clients).client_for
                for lag, clients in self._snapshot_clients.items()
            },
        )
        self._host = EnvManagerHost(
            managers,
            watchdog_timeout_s=em.watchdog_timeout_s,
            on_stall=lambda env_id, text: scheduler_handle.report_stalled.remote(
                env_id, text
            ),
            on_recover=lambda env_id: scheduler_handle.clear_stalled.remote(env_id),
            on_fatal=lambda message: scheduler_handle.report_fatal.remote(
                f"worker {worker_index}: {message}"
            ),
        )
        # this process hosts env loops only (roll_async/runtime/gc_tuning.py)
        tune_gc_for_env_loops(em.worker_gc_threshold)
        # off vLLM's critical path; describe() reports it
        sched_policy.apply_to_process(em.rollout_sched_policy)

    async def run(self) -> None:
        """Returns when every loop ended (scheduler shut down); raises when one died."""
        await self._host.run()

    async def cancel_episode(self, env_id: int, group_id: int, episode_id: int) -> bool:
        return self._host.cancel_episode(env_id, group_id, episode_id)

    async def stop(self) -> None:
        await self._host.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)
        for client in self._engine_clients:  # the Router's replicas
            client.close()
        for clients in self._snapshot_clients.values():
            for client in clients:
                client.close()
        self._scheduler_client.close()

    async def router_stats(self) -> dict[str, Any]:
        """This worker's Router counters per replica (summed over workers into router/* metrics), and
        ``transport_reconnects``: its call connections (queue, engines) that dropped since the last call."""
        total = self._scheduler_client.reconnects + sum(
            getattr(client, "reconnects", 0) for client in self._router.replicas
        )
        new, self._reconnects_reported = total - self._reconnects_reported, total
        return {**self._router.stats(), "transport_reconnects": new}

    async def describe(self) -> dict[str, Any]:
        return {
            "worker_index": self.worker_index,
            "incarnation": self.incarnation,
            "pid": os.getpid(),
            "router_load": self._router.load(),
            "router": self._router.stats(),
            "node_id": _node_id(),
            "sched_policy": sched_policy.process_policies(),
            # Cumulative counters of this process's reward calls per tag (calls, timeouts, max_in_flight, ...).
            "rewards": {
                tag: scorer.client.counters.as_dict()
                for tag, scorer in self._reward_scorers.items()
            },
            "envs": {
                env_id: {"phase": m.progress.phase, "stats": vars(m.stats).copy()}
                for env_id, m in self._host.managers.items()
            },
        }
