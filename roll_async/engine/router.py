"""Router: spreads EnvManagers' generate calls over engine replicas.

With several replicas, where a turn goes decides both prefix-cache hits (a
conversation should stay on the replica that holds its prefix) and balance
(no replica should queue while another idles), and a dead replica must not end
the run; the router keeps all three decisions in the request path's caller,
without a remote call per request.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from roll_async.errors import InvalidInputError, NoLiveReplicaError, ReplicaDeadError
from roll_async.runtime.ray_utils import actor_death_errors
from roll_async.trajectory import GenerationRequest, GenerationResult

logger = logging.getLogger(__name__)


class EngineClient(Protocol):
    """What an EnvManager needs from an engine: a FakeEngine, a real engine object or a Ray adapter."""

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    async def abort(self, request_ids: list[str]) -> None: ...


def replica_dead_error(exc: BaseException) -> ReplicaDeadError:
    """The ReplicaDeadError for one of Ray's actor-death errors (``actor_death_errors``)."""
    return ReplicaDeadError(f"engine replica actor died: {type(exc).__name__}: {exc}")


async def _call_stats(replica: Any) -> Any:
    # an async client, or an in-process engine object whose stats() is sync
    result = replica.stats()
    return await result if inspect.isawaitable(result) else result


class RayEngineClient:
    """An engine Ray actor handle (real or fake engine) seen as an EngineClient."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._dead_errors = actor_death_errors()

    async def _remote(self, method: str, *args: Any) -> Any:
        """``handle.method.remote(*args)``; a dead actor's error becomes ReplicaDeadError (the Router fails over)."""
        try:
            return await getattr(self.handle, method).remote(*args)
        except self._dead_errors as exc:
            raise replica_dead_error(exc) from exc

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result: GenerationResult = await self._remote("generate", request)
        return result

    async def abort(self, request_ids: list[str]) -> None:
        await self.handle.abort.remote(request_ids)

    async def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = await self._remote("stats")
        return stats

    def close(self) -> None:
        """Nothing to release: Ray owns the connection (ZmqEngineClient closes its socket)."""


@dataclass
class ReplicaCounters:
    """Per replica, cumulative (``Router.stats``)."""

    requests: int = 0
    episodes_bound: int = 0
    rebalanced_away: int = 0
    failed_over: int = 0
    dead: bool = False


class Router:
    """Routes the requests of envs (identified by any hashable key) to replicas.

    Sticky per episode. The first request of an env's episode picks a replica; every
    later turn of that episode goes to the same one, so its growing conversation
    keeps hitting that replica's prefix cache. The EnvManager calls ``end_episode`` when
    the episode ends, which releases the binding: the next episode picks again.

    Least loaded by a global count. Each EnvManagerWorker owns one Router, so what a
    router has in flight itself says nothing about the other workers' load. A
    router therefore polls every replica's own count of requests inside ``generate``
    (``stats()["in_flight"]``, one call per replica every ``load_poll_s``, off the
    request path) and adds what it has sent since that poll. A new episode goes to
    the replica with the lowest such count (ties: fewest bound episodes, then a
    rotation offset so that routers in different workers do not all favour
    replica 0). The request path does a few integer updates and no remote call; the
    polls cost ``replicas / load_poll_s`` Ray calls per second per worker, whatever
    the request rate, and none while only one
    replica is live.

    Rebalanced when overloaded. At the start of a turn, an episode whose replica
    carries more than ``rebalance_ratio`` times the least loaded replica's count
    (and at least ``rebalance_min_gap`` requests more) moves to the least loaded one:
    it loses its prefix cache once, the overloaded replica sheds load.

    Failover. A replica whose actor died (``ReplicaDeadError``: Ray reports the actor
    dead or unreachable) is marked dead; its episodes are re-bound to the survivors
    and the request that failed is re-sent to a survivor at once (nothing of it was
    returned, so nothing is lost but time). Only when no replica is left does
    ``generate`` raise ``NoLiveReplicaError``. Counters per replica (requests routed,
    episodes bound, rebalanced away, failed over) are in ``stats()``.
    """

    def __init__(
        self,
        replicas: Sequence[EngineClient],
        *,
        rotation_offset: int = 0,
        load_poll_s: float = 0.25,
        rebalance_ratio: float = 2.0,
        rebalance_min_gap: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not replicas:
            raise InvalidInputError("Router needs at least one engine replica")
        self.replicas = list(replicas)
        n = len(self.replicas)
        self._rotation_offset = rotation_offset
        self.load_poll_s = load_poll_s
        self.rebalance_ratio = rebalance_ratio
        self.rebalance_min_gap = rebalance_min_gap
        self._clock = clock
        self._env_replica: dict[Hashable, int] = {}
        self._in_flight = [0] * n  # this router's requests inside generate, per replica
        self._sticky_envs = [0] * n  # episodes bound to each replica by this router
        self._request_replica: dict[str, int] = {}
        self._dead = [False] * n
        #: The replicas' own in-flight counts at the last poll (all workers), and ours at that moment.
        self._polled_global: list[int] | None = None
        self._local_at_poll = [0] * n
        self._last_poll = float("-inf")
        self._poll_task: asyncio.Task[None] | None = None
        self.counters = [ReplicaCounters() for _ in range(n)]
        self.polls = 0

    # -- load --------------------------------------------------------------------------

    def load(self) -> list[int]:
        """Requests in flight per replica, as seen by this router."""
        return list(self._in_flight)

    def global_load(self) -> list[int]:
        """Estimated requests in flight per replica over every worker: last poll + our change since."""
        if self._polled_global is None:
            return list(self._in_flight)
        return [
            max(self._in_flight[i], g + self._in_flight[i] - self._local_at_poll[i])
            for i, g in enumerate(self._polled_global)
        ]

    def _maybe_poll(self) -> None:
        """Refresh the global counts in the background, at most every load_poll_s (never on the request path)."""
        if self.load_poll_s <= 0 or (
            self._poll_task is not None and not self._poll_task.done()
        ):
            return
        # nothing to choose between: the poll would be Ray calls for no decision
        if len(self._live()) < 2:
            return
        if self._clock() - self._last_poll < self.load_poll_s:
            return
        if not all(hasattr(r, "stats") for r in self.replicas):
            return
        self._last_poll = self._clock()
        self._poll_task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        live = self._live()
        results = await asyncio.gather(
            *(_call_stats(self.replicas[i]) for i in live), return_exceptions=True
        )
        polled = list(self._polled_global or self._in_flight)
        local = list(self._local_at_poll)
        for i, result in zip(live, results):
            if isinstance(result, ReplicaDeadError):
                self._mark_dead(i, str(result))
            elif isinstance(result, dict) and "in_flight" in result:
                polled[i] = int(result["in_flight"])
                local[i] = self._in_flight[i]
        self._polled_global, self._local_at_poll = polled, local
        self.polls += 1

    def _live(self) -> list[int]:
        return [i for i in range(len(self.replicas)) if not self._dead[i]]

    def _least_loaded(self) -> int:
        live = self._live()
        if not live:
            raise NoLiveReplicaError(
                f"all {len(self.replicas)} engine replicas died; the rollout cannot continue"
            )
        load, n = self.global_load(), len(self.replicas)
        return min(
            live,
            key=lambda i: (
                load[i],
                self._sticky_envs[i],
                (i - self._rotation_offset) % n,
            ),
        )

    # -- binding -----------------------------------------------------------------------

    def replica_for(self, env_key: Hashable) -> int:
        """The env's replica for its current episode; binds the least loaded live one on first use."""
        index = self._env_replica.get(env_key)
        if index is not None and self._dead[index]:
            self._unbind(env_key)
            index = None
        if index is None:
            index = self._least_loaded()
            self._bind(env_key, index)
        return index

    def _bind(self, env_key: Hashable, index: int) -> None:
        self._env_replica[env_key] = index
        self._sticky_envs[index] += 1
        self.counters[index].episodes_bound += 1

    def _unbind(self, env_key: Hashable) -> int | None:
        index = self._env_replica.pop(env_key, None)
        if index is not None:
            self._sticky_envs[index] -= 1
        return index

    def forget(self, env_key: Hashable) -> None:
        """Release an env's binding (its episode ended, or the env was rebuilt): the next episode picks again."""
        self._unbind(env_key)

    end_episode = forget

    def _rebalance(self, env_key: Hashable, index: int) -> int:
        """Move the episode off an overloaded replica (see the class docstring); returns its replica."""
        if self.rebalance_ratio <= 0 or len(self.replicas) < 2:
            return index
        load = self.global_load()
        target = self._least_loaded()
        if (
            target != index
            and load[index] >= self.rebalance_min_gap + load[target]
            and load[index] > self.rebalance_ratio * load[target]
        ):
            self._unbind(env_key)
            self._bind(env_key, target)
            self.counters[index].rebalanced_away += 1
            return target
        return index

    def _mark_dead(self, index: int, reason: str) -> None:
        if self._dead[index]:
            return
        self._dead[index] = True
        self.counters[index].dead = True
        moved = [key for key, i in self._env_replica.items() if i == index]
        for key in moved:
            self._unbind(key)  # re-bound to a survivor on their next request
        self.counters[index].failed_over += len(moved)
        logger.error(
            "engine replica %d is dead (%s); %d episodes move to the %d live replicas",
            index,
            reason,
            len(moved),
            len(self._live()),
        )

    # -- requests ----------------------------------------------------------------------

    async def generate(
        self, request: GenerationRequest, env_key: Hashable
    ) -> GenerationResult:
        self._maybe_poll()
        while True:
            index = self.replica_for(env_key)
            index = self._rebalance(env_key, index)
            self._in_flight[index] += 1
            self.counters[index].requests += 1
            self._request_replica[request.request_id] = index
            try:
                return await self.replicas[index].generate(request)
            except ReplicaDeadError as exc:
                self._mark_dead(
                    index, str(exc)
                )  # then loop: the request goes to a survivor
            finally:
                self._in_flight[index] -= 1
                self._request_replica.pop(request.request_id, None)

    async def abort(
        self, request_ids: list[str], env_key: Hashable | None = None
    ) -> None:
        """Abort requests on the live replicas that run them.

        An id this router no longer tracks (the caller's await was cancelled,
        which ends the local bookkeeping but not a remote request) goes to the
        env's replica if ``env_key`` is bound, else to every live replica; engines
        ignore ids they do not run.
        """
        by_replica: dict[int, list[str]] = {}
        for request_id in request_ids:
            index = self._request_replica.get(request_id)
            if index is None and env_key is not None:
                index = self._env_replica.get(env_key)
            targets = self._live() if index is None else [index]
            for target in targets:
                if not self._dead[target]:
                    by_replica.setdefault(target, []).append(request_id)
        for index, ids in by_replica.items():
            try:
                await self.replicas[index].abort(ids)
            except Exception as exc:
                # a replica that died meanwhile has nothing left to abort
                logger.debug("abort on replica %d failed: %s", index, exc)

    def stats(self) -> dict[str, Any]:
        """Per-replica counters and current load, for metrics and describe()."""
        return {
            "replicas": [
                {
                    **asdict(c),
                    "in_flight": self._in_flight[i],
                    "bound_episodes": self._sticky_envs[i],
                }
                for i, c in enumerate(self.counters)
            ],
            "polls": self.polls,
        }

    def client_for(self, env_key: Hashable) -> EngineClient:
        """An EngineClient view bound to one env, for an EnvManager."""
        return _EnvBoundClient(self, env_key)


class _EnvBoundClient:
    def __init__(self, router: Router, env_key: Hashable) -> None:
        self._router = router
        self._env_key = env_key

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await self._router.generate(request, self._env_key)

    async def abort(self, request_ids: list[str]) -> None:
        await self._router.abort(request_ids, env_key=self._env_key)

    def end_episode(self) -> None:
        """The env's episode ended: release its replica binding."""
        self._router.end_episode(self._env_key)
