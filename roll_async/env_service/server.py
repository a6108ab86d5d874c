"""The env server: registered envs (and importable dotted paths) served over HTTP with aiohttp.

Rollouts on one machine may need envs hosted elsewhere (heavy simulators,
untrusted code, other hardware); ``roll-async env-server`` hosts env instances
so that a hung or crashing env never hangs or kills the server. aiohttp, rather
than a WSGI/ASGI stack, gives one dependency for both server and client and an
asyncio server that holds thousands of idle connections cheaply. This module is
the HTTP application and its operations; the session table, the exactly-once
ledger, the env host and the command each have their own module.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from roll_async.env_service.env_host import DEFAULT_MAX_ENVS, ISOLATION_MODES, EnvHost
from roll_async.env_service.exactly_once import ExactlyOnceCalls
from roll_async.env_service.server_stats import ServerStats
from roll_async.env_service.sessions import (
    CallFailed,
    CallRecord,
    HostedEnv,
    SessionTable,
    call_key,
)
from roll_async.env_service.wire import (
    API,
    BadRequest,
    encode_observation,
    require,
    require_seq,
    to_jsonable,
)
from roll_async.envs import registered_envs, resolve_env_class
from roll_async.errors import ConfigError

#: One operation of the API: a request body in, a response body out (BadRequest / CallFailed for errors).
Operation = Callable[[Any], Awaitable[dict[str, Any]]]


class EnvServer:
    """The env table and the request handlers; ``app()`` is the aiohttp application.

    ``roll-async env-server --host 127.0.0.1 --port 8765 [--import my_envs ...]``
    hosts env instances for rollouts running elsewhere (see :mod:`~roll_async.env_service.wire` for
    the endpoints). With ``--isolation process`` (the default) every env instance
    lives in its own child process (:class:`~roll_async.env_service.process_env.ProcessEnv`):
    a call past its timeout kills that process, a crash is reported, and either way
    the env is dropped from the table, so the server itself never hangs or dies
    with an env. ``--isolation none`` runs envs in the server's threads
    (:class:`~roll_async.env_service.thread_pool.EnvThreadPool`; for trusted,
    light envs: more sessions per server). There a hung call keeps its thread
    until it returns (then the env is closed), but the pool starts another, so
    ``threads`` stay free for the other sessions, up to ``max_threads`` in all.
    A malformed request gets a 4xx naming the problem, never a crash.

    Calls that change an env are applied once: each carries its session's sequence number, and a
    repeat (a client retrying a call whose answer it lost) is answered from the env's record of
    its last call (see :mod:`~roll_async.env_service.wire`).
    """

    def __init__(
        self,
        *,
        isolation: str = "process",
        env_timeout_s: float = 60.0,
        max_envs: int | None = None,
        threads: int = 32,
        max_threads: int = 1024,
        start_timeout_s: float = 60.0,
        idle_timeout_s: float = 900.0,
    ) -> None:
        if isolation not in ISOLATION_MODES:
            raise ConfigError(
                f"isolation={isolation!r}; use one of {list(ISOLATION_MODES)}"
            )
        self.env_timeout_s = float(env_timeout_s)
        self.max_envs = int(
            DEFAULT_MAX_ENVS[isolation] if max_envs is None else max_envs
        )
        self._reaper: asyncio.Task[None] | None = None
        self.stats = ServerStats()
        self._sessions = SessionTable()
        self._calls = ExactlyOnceCalls(self._sessions, self.stats)
        self._host = EnvHost(
            self._sessions,
            self.stats,
            isolation=isolation,
            start_timeout_s=start_timeout_s,
            idle_timeout_s=idle_timeout_s,
            threads=threads,
            max_threads=max_threads,
        )

    @property
    def envs(self) -> dict[str, HostedEnv]:
        """The envs held, by id."""
        return self._sessions.envs

    @property
    def isolation(self) -> str:
        return self._host.isolation

    @property
    def start_timeout_s(self) -> float:
        """A new env process may take this long to start and build its env (not counted in call timeouts)."""
        return self._host.start_timeout_s

    @property
    def idle_timeout_s(self) -> float:
        """An env nobody called for this long is closed (its client died without closing it); 0 disables."""
        return self._host.idle_timeout_s

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.add_routes(
            [
                web.get("/health", self.health),
                web.post(f"{API}/envs", self.create),
                web.post(f"{API}/envs/{{env_id}}/reset", self.reset),
                web.post(f"{API}/envs/{{env_id}}/step", self.step),
                web.delete(f"{API}/envs/{{env_id}}", self.close),
                web.post(f"{API}/batch", self.batch),
            ]
        )
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        if self.idle_timeout_s > 0:
            self._reaper = asyncio.create_task(self._host.reap_idle())

    async def _on_shutdown(self, app: web.Application) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        self._host.shutdown()

    # -- handlers --------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "envs": len(self.envs),
                "max_envs": self.max_envs,
                "isolation": self.isolation,
                "env_timeout_s": self.env_timeout_s,
                "registered": registered_envs(),
                "stats": vars(self.stats),
                "threads": self._host.pool.stats(),
            }
        )

    async def create(self, request: web.Request) -> web.Response:
        return await self._respond(self._create, await self._json(request))

    async def reset(self, request: web.Request) -> web.Response:
        return await self._respond(self._reset, await self._json_for_env(request))

    async def step(self, request: web.Request) -> web.Response:
        return await self._respond(self._step, await self._json_for_env(request))

    async def close(self, request: web.Request) -> web.Response:
        return await self._respond(
            self._close, {"env_id": request.match_info["env_id"]}
        )

    async def batch(self, request: web.Request) -> web.Response:
        """Many calls (on different envs) in one round trip, run concurrently; each gets its own status."""
        body = await self._json(request)
        try:
            calls = require(body, "calls", list)
        except BadRequest as exc:
            return self._error(400, "bad_request", str(exc))
        ops: dict[str, Operation] = {
            "create": self._create,
            "reset": self._reset,
            "step": self._step,
            "close": self._close,
        }

        async def one(call: Any) -> dict[str, Any]:
            try:
                op = require(call, "op", str, what="a batch call")
                if op not in ops:
                    raise BadRequest(f"unknown op {op!r}; use one of {sorted(ops)}")
                return {"ok": True, "status": 200, "body": await ops[op](call)}
            except BadRequest as exc:
                self.stats.bad_requests += 1
                return {
                    "ok": False,
                    "status": 400,
                    "body": {"error": str(exc), "kind": "bad_request"},
                }
            except CallFailed as exc:
                return {
                    "ok": False,
                    "status": exc.status,
                    "body": {"error": str(exc), "kind": exc.kind},
                }

        results = await asyncio.gather(*(one(c) for c in calls))
        return web.json_response({"results": list(results)})

    # -- operations (shared by the single and batch endpoints) -------------------------
    async def _create(self, body: Any) -> dict[str, Any]:
        """Build an env (and reset it, given a seed). With a client-chosen ``env_id`` it is call 0 of
        that session: a repeat is answered from the record, never builds a second env."""
        env_type = require(body, "env_type", str)
        env_config = body.get("env_config") or {}
        if not isinstance(env_config, dict):
            raise BadRequest(
                f"field 'env_config' must be an object, got {type(env_config).__name__}"
            )
        seed = require(body, "seed", int) if "seed" in body else None
        timeout = self._timeout(body)
        key = call_key(env_type, env_config, seed)
        env_id = body.get("env_id")
        sessions = self._sessions
        if env_id is not None:
            if not isinstance(env_id, str) or not env_id:
                raise BadRequest(
                    f"field 'env_id' must be a non-empty string, got {env_id!r}"
                )
            hosted = self._calls.session(env_id, 0, "create", key)
            if hosted is not None and hosted.last.seq != 0:
                self.stats.out_of_sequence += 1
                raise CallFailed(
                    409,
                    "out_of_sequence",
                    f"env {env_id!r} exists and its session is past its create (last call "
                    f"seq={hosted.last.seq}); a new env needs a new env_id",
                )
            if hosted is not None:
                return await self._calls.repeat(env_id, hosted.last, 0, "create", key)
        else:
            env_id = sessions.new_id()
        if len(sessions.envs) + len(sessions.creating) >= self.max_envs:
            raise CallFailed(
                429,
                "full",
                f"the server holds max_envs={self.max_envs} envs; close some or start another server",
            )
        try:
            resolve_env_class(env_type)
        except ValueError as exc:
            raise CallFailed(404, "not_found", str(exc)) from None
        hosted = HostedEnv(
            env=None, env_type=env_type, last=CallRecord(0, "create", key)
        )
        sessions.creating[env_id] = hosted

        async def build() -> dict[str, Any]:
            try:
                hosted.env = await self._host.build(env_type, env_config, timeout)
            finally:
                sessions.creating.pop(env_id, None)
            sessions.envs[env_id] = hosted
            self.stats.created += 1
            out: dict[str, Any] = {"env_id": env_id}
            if seed is not None:
                out.update(await self._reset_env(env_id, hosted, seed, timeout))
            return out

        return await self._calls.apply_once(env_id, hosted, hosted.last, None, build)

    async def _reset(self, body: Any) -> dict[str, Any]:
        seed = require(body, "seed", int)
        seq = require_seq(body)
        timeout = self._timeout(body)

        async def reset(env_id: str, hosted: HostedEnv) -> dict[str, Any]:
            return await self._reset_env(env_id, hosted, seed, timeout)

        return await self._calls.sequenced(body, seq, "reset", call_key(seed), reset)

    async def _reset_env(
        self, env_id: str, hosted: HostedEnv, seed: int, timeout: float
    ) -> dict[str, Any]:
        observation, info = await self._host.call(
            env_id, hosted, "reset", seed, timeout=timeout
        )
        return {
            "env_id": env_id,
            "observation": encode_observation(observation),
            "info": to_jsonable(info),
        }

    async def _step(self, body: Any) -> dict[str, Any]:
        action = require(body, "action", str)
        seq = require_seq(body)
        timeout = self._timeout(body)

        async def step(env_id: str, hosted: HostedEnv) -> dict[str, Any]:
            observation, reward, terminated, truncated, info = await self._host.call(
                env_id, hosted, "step", action, timeout=timeout
            )
            return {
                "observation": encode_observation(observation),
                "reward": float(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": to_jsonable(info),
            }

        return await self._calls.sequenced(body, seq, "step", call_key(action), step)

    async def _close(self, body: Any) -> dict[str, Any]:
        env_id = require(body, "env_id", str)
        hosted = self._sessions.envs.pop(env_id, None)
        if hosted is None:
            if env_id in self._sessions.creating:
                raise CallFailed(
                    409,
                    "busy",
                    f"env {env_id!r} is still being created; close it once its create answers",
                )
            raise self._sessions.not_found(env_id)
        self.stats.closed += 1
        self._sessions.bury(env_id, "closed by its client")
        await self._host.dispose(
            hosted.env, after_failure=hosted.lock.locked()
        )  # busy: kill, do not wait for the call
        return {"closed": True}

    # -- plumbing --------------------------------------------------------------------
    def _timeout(self, body: Any) -> float:
        value = (
            body.get("timeout_s", self.env_timeout_s)
            if isinstance(body, dict)
            else self.env_timeout_s
        )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise BadRequest(
                f"field 'timeout_s' must be a positive number of seconds, got {value!r}"
            )
        return float(value)

    async def _json(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except Exception as exc:
            raise web.HTTPBadRequest(
                text=json.dumps(
                    {
                        "error": f"the request body is not valid JSON: {exc}",
                        "kind": "bad_request",
                    }
                ),
                content_type="application/json",
            ) from None

    async def _json_for_env(self, request: web.Request) -> Any:
        """The body with the env id of the path added (a non-object body is left for ``require`` to reject)."""
        body = await self._json(request)
        return (
            {**body, "env_id": request.match_info["env_id"]}
            if isinstance(body, dict)
            else body
        )

    async def _respond(self, op: Operation, body: Any) -> web.Response:
        try:
            return web.json_response(await op(body))
        except BadRequest as exc:
            self.stats.bad_requests += 1
            return self._error(400, "bad_request", str(exc))
        except CallFailed as exc:
            return self._error(exc.status, exc.kind, str(exc))

    @staticmethod
    def _error(status: int, kind: str, message: str) -> web.Response:
        return web.json_response({"error": message, "kind": kind}, status=status)
