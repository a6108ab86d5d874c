"""Router: spreads EnvManagers' generate calls over engine replicas.

An env sticks to the replica it was first sent to, so its growing conversation
keeps hitting that replica's prefix cache; a new env goes to the replica with
the fewest requests in flight (ties: fewest sticky envs, then a rotation offset
so that routers in different EnvManagerWorkers do not all favour replica 0).
Load is what this router itself has in flight: each EnvManagerWorker owns one
router, which needs no cross-process coordination and balances well when
workers host similar numbers of envs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from roll_async.protocol import GenerationRequest, GenerationResult


class EngineClient(Protocol):
    """What an EnvManager needs from an engine: a FakeEngine, a real engine object or a Ray adapter."""

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    async def abort(self, request_ids: list[str]) -> None: ...


class RayEngineClient:
    """An engine Ray actor handle (real or fake engine) seen as an EngineClient."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await self.handle.generate.remote(request)

    async def abort(self, request_ids: list[str]) -> None:
        await self.handle.abort.remote(request_ids)

    async def stats(self) -> dict:
        return await self.handle.stats.remote()


class Router:
    """Routes requests of envs (identified by any hashable key) to replicas."""

    def __init__(self, replicas: Sequence[EngineClient], *, rotation_offset: int = 0) -> None:
        if not replicas:
            raise ValueError("Router needs at least one engine replica")
        self.replicas = list(replicas)
        self._rotation_offset = rotation_offset
        self._env_replica: dict[Hashable, int] = {}
        self._in_flight = [0] * len(self.replicas)
        self._sticky_envs = [0] * len(self.replicas)
        self._request_replica: dict[str, int] = {}

    def replica_for(self, env_key: Hashable) -> int:
        """The env's replica; assigns the least loaded one on first use."""
        index = self._env_replica.get(env_key)
        if index is None:
            n = len(self.replicas)
            index = min(
                range(n),
                key=lambda i: (self._in_flight[i], self._sticky_envs[i], (i - self._rotation_offset) % n),
            )
            self._env_replica[env_key] = index
            self._sticky_envs[index] += 1
        return index

    def forget(self, env_key: Hashable) -> None:
        """Drop an env's stickiness (e.g. the env was rebuilt and its cache is cold anyway)."""
        index = self._env_replica.pop(env_key, None)
        if index is not None:
            self._sticky_envs[index] -= 1

    def load(self) -> list[int]:
        """Requests in flight per replica, as seen by this router."""
        return list(self._in_flight)

    async def generate(self, request: GenerationRequest, env_key: Hashable) -> GenerationResult:
        index = self.replica_for(env_key)
        self._in_flight[index] += 1
        self._request_replica[request.request_id] = index
        try:
            return await self.replicas[index].generate(request)
        finally:
            self._in_flight[index] -= 1
            self._request_replica.pop(request.request_id, None)

    async def abort(self, request_ids: list[str], env_key: Hashable | None = None) -> None:
        """Abort requests on the replicas that run them.

        An id this router no longer tracks (the caller's await was cancelled,
        which ends the local bookkeeping but not a remote request) goes to the
        env's replica if ``env_key`` is known, else to every replica; engines
        ignore ids they do not run.
        """
        by_replica: dict[int, list[str]] = {}
        for request_id in request_ids:
            index = self._request_replica.get(request_id)
            if index is None and env_key is not None:
                index = self._env_replica.get(env_key)
            targets = range(len(self.replicas)) if index is None else [index]
            for target in targets:
                by_replica.setdefault(target, []).append(request_id)
        for index, ids in by_replica.items():
            await self.replicas[index].abort(ids)

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
