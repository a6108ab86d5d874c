"""The env server: registered envs (and importable dotted paths) served over HTTP with aiohttp.

Rollouts on one machine may need envs hosted elsewhere (heavy simulators,
untrusted code, other hardware); ``roll-async env-server`` hosts env instances
so that a hung or crashing env never hangs or kills the server. aiohttp, rather
than a WSGI/ASGI stack, gives one dependency for both server and client and an
asyncio server that holds thousands of idle connections cheaply.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import importlib
import inspect
import itertools
import json
import logging
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from roll_async.env_service.fd_limit import raise_open_files_limit
from roll_async.env_service.process_env import EnvProcessError, ProcessEnv
from roll_async.env_service.thread_pool import EnvThreadPool, NoFreeThread
from roll_async.env_service.wire import (
    API,
    BadRequest,
    encode_observation,
    require,
    require_seq,
    to_jsonable,
)
from roll_async.envs import make_env, registered_envs, resolve_env_class

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("process", "none")
#: Default --max-envs: a process per env costs tens of MB; an in-thread env, kilobytes.
DEFAULT_MAX_ENVS = {"process": 256, "none": 4096}
#: Most requests aiohttp's listening socket queues before accepting (2,000 sessions may connect at once).
LISTEN_BACKLOG = 4096
#: Closed or dropped env ids remembered (why, and a failed call to answer again), newest kept.
GONE_KEPT = 10_000


class _CallFailed(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind

    def again(self) -> _CallFailed:
        """A fresh copy, to answer a repeat of the failed call."""
        return _CallFailed(self.status, self.kind, str(self))


@dataclass
class _Applied:
    """One call that changes an env (create, reset, step) and its answer, kept to answer a repeat.

    ``key`` is the call's op and arguments: a repeat must be the same call, not just the same number.
    """

    seq: int
    op: str
    key: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    response: dict[str, Any] | None = None
    failure: _CallFailed | None = None

    def settle(
        self,
        response: dict[str, Any] | None = None,
        failure: _CallFailed | None = None,
    ) -> None:
        self.response, self.failure = response, failure
        self.done.set()

    async def answer(self) -> dict[str, Any]:
        """The call's answer, once it has one (bounded: the call itself is bounded by its timeout)."""
        await self.done.wait()
        if self.failure is not None:
            raise self.failure.again()
        assert self.response is not None
        return self.response


@dataclass
class _Hosted:
    env: Any
    env_type: str
    last: _Applied
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class _Gone:
    """Why an env id is no longer served, and its failed last call (answered again to a repeat)."""

    why: str
    failed: _Applied | None = None


@dataclass
class ServerStats:
    created: int = 0
    closed: int = 0
    calls: int = 0
    env_errors: int = 0
    timeouts: int = 0
    crashes: int = 0
    bad_requests: int = 0
    reaped_idle: int = 0
    overloaded: int = 0
    #: calls answered from the last call's record instead of being applied again
    repeats: int = 0
    out_of_sequence: int = 0


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
            raise ValueError(
                f"isolation={isolation!r}; use one of {list(ISOLATION_MODES)}"
            )
        self.isolation = isolation
        self.env_timeout_s = float(env_timeout_s)
        self.max_envs = int(
            DEFAULT_MAX_ENVS[isolation] if max_envs is None else max_envs
        )
        #: A new env process may take this long to start and build its env (not counted in call timeouts).
        self.start_timeout_s = float(start_timeout_s)
        #: An env nobody called for this long is closed (its client died without closing it); 0 disables.
        self.idle_timeout_s = float(idle_timeout_s)
        self._reaper: asyncio.Task | None = None
        self.envs: dict[str, _Hosted] = {}
        #: envs being built, by id (a repeated create waits for the first one)
        self._creating: dict[str, _Hosted] = {}
        self._gone: collections.OrderedDict[str, _Gone] = collections.OrderedDict()
        self.stats = ServerStats()
        self._ids = itertools.count()
        self._pool = EnvThreadPool(threads, max_threads=max(threads, max_threads))

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
            self._reaper = asyncio.create_task(self._reap_idle())

    async def _reap_idle(self) -> None:
        """Close envs idle past idle_timeout_s: a client killed without closing them must not leak them."""
        while True:
            await asyncio.sleep(max(1.0, min(60.0, self.idle_timeout_s / 4)))
            now = time.monotonic()
            for env_id, hosted in list(self.envs.items()):
                if (
                    not hosted.lock.locked()
                    and now - hosted.last_used > self.idle_timeout_s
                ):
                    self.envs.pop(env_id, None)
                    self.stats.reaped_idle += 1
                    self._bury(
                        env_id,
                        f"closed after idle_timeout_s={self.idle_timeout_s:g} without a call",
                    )
                    await self._dispose(hosted.env)

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
                "threads": self._pool.stats(),
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
        ops = {
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
            except _CallFailed as exc:
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
        key = _call_key(env_type, env_config, seed)
        env_id = body.get("env_id")
        if env_id is not None:
            if not isinstance(env_id, str) or not env_id:
                raise BadRequest(
                    f"field 'env_id' must be a non-empty string, got {env_id!r}"
                )
            hosted = self._session(env_id, 0, "create", key)
            if hosted is not None and hosted.last.seq != 0:
                self.stats.out_of_sequence += 1
                raise _CallFailed(
                    409,
                    "out_of_sequence",
                    f"env {env_id!r} exists and its session is past its create (last call "
                    f"seq={hosted.last.seq}); a new env needs a new env_id",
                )
            if hosted is not None:
                return await self._repeat(env_id, hosted.last, 0, "create", key)
        else:
            env_id = f"e{next(self._ids)}"
            while env_id in self.envs or env_id in self._creating:
                env_id = f"e{next(self._ids)}"
        if len(self.envs) + len(self._creating) >= self.max_envs:
            raise _CallFailed(
                429,
                "full",
                f"the server holds max_envs={self.max_envs} envs; close some or start another server",
            )
        try:
            resolve_env_class(env_type)
        except ValueError as exc:
            raise _CallFailed(404, "not_found", str(exc)) from None
        hosted = _Hosted(env=None, env_type=env_type, last=_Applied(0, "create", key))
        self._creating[env_id] = hosted

        async def build() -> dict[str, Any]:
            try:
                hosted.env = await self._build(env_type, env_config, timeout)
            finally:
                self._creating.pop(env_id, None)
            self.envs[env_id] = hosted
            self.stats.created += 1
            out: dict[str, Any] = {"env_id": env_id}
            if seed is not None:
                out.update(await self._reset_env(env_id, hosted, seed, timeout))
            return out

        return await self._apply_once(env_id, hosted, hosted.last, None, build)

    async def _build(
        self, env_type: str, env_config: dict[str, Any], timeout: float
    ) -> Any:
        builder = functools.partial(make_env, env_type, env_config)
        if self.isolation == "process":
            env: Any = ProcessEnv(builder, name=f"{env_type}-env")
            start_timeout = max(timeout, self.start_timeout_s)
            try:  # start() is bounded by its own timeout; the pool's is a backstop
                await self._pool.run(
                    env.start, start_timeout, timeout=start_timeout + 10
                )
            except Exception as exc:
                env.kill("start failed")
                self.stats.env_errors += 1
                raise _CallFailed(500, "env_error", f"make_env: {exc}") from None
            return env
        return await self._timed(
            self._pool.run(builder, timeout=timeout, cleanup=_close_quietly),
            timeout,
            "make_env",
            None,
        )

    async def _reset(self, body: Any) -> dict[str, Any]:
        seed = require(body, "seed", int)
        seq = require_seq(body)
        timeout = self._timeout(body)

        async def reset(env_id: str, hosted: _Hosted) -> dict[str, Any]:
            return await self._reset_env(env_id, hosted, seed, timeout)

        return await self._sequenced(body, seq, "reset", _call_key(seed), reset)

    async def _reset_env(
        self, env_id: str, hosted: _Hosted, seed: int, timeout: float
    ) -> dict[str, Any]:
        observation, info = await self._call(
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

        async def step(env_id: str, hosted: _Hosted) -> dict[str, Any]:
            observation, reward, terminated, truncated, info = await self._call(
                env_id, hosted, "step", action, timeout=timeout
            )
            return {
                "observation": encode_observation(observation),
                "reward": float(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "info": to_jsonable(info),
            }

        return await self._sequenced(body, seq, "step", _call_key(action), step)

    async def _close(self, body: Any) -> dict[str, Any]:
        env_id = require(body, "env_id", str)
        hosted = self.envs.pop(env_id, None)
        if hosted is None:
            if env_id in self._creating:
                raise _CallFailed(
                    409,
                    "busy",
                    f"env {env_id!r} is still being created; close it once its create answers",
                )
            raise self._not_found(env_id)
        self.stats.closed += 1
        self._bury(env_id, "closed by its client")
        await self._dispose(
            hosted.env, after_failure=hosted.lock.locked()
        )  # busy: kill, do not wait for the call
        return {"closed": True}

    # -- exactly once ----------------------------------------------------------------
    async def _sequenced(
        self, body: Any, seq: int, op: str, key: str, run: Any
    ) -> dict[str, Any]:
        """Apply call ``seq`` of an env's session once: the next number runs, the last one is answered again."""
        env_id = require(body, "env_id", str)
        hosted = self._session(env_id, seq, op, key)
        if hosted is None:
            raise self._not_found(env_id)
        last = hosted.last
        if seq == last.seq:
            return await self._repeat(env_id, last, seq, op, key)
        if seq != last.seq + 1:
            self.stats.out_of_sequence += 1
            raise _CallFailed(
                409,
                "out_of_sequence",
                f"env {env_id!r}: {op} seq={seq} is neither the next call (seq={last.seq + 1}) "
                f"nor a repeat of the last (seq={last.seq}); nothing was applied: close this env "
                "and start a new one",
            )
        if not last.done.is_set():
            raise _CallFailed(
                409,
                "busy",
                f"env {env_id!r} is still running call seq={last.seq}; wait for its answer",
            )
        applied = _Applied(seq, op, key)
        hosted.last = applied
        return await self._apply_once(
            env_id, hosted, applied, last, functools.partial(run, env_id, hosted)
        )

    async def _apply_once(
        self,
        env_id: str,
        hosted: _Hosted,
        applied: _Applied,
        before: _Applied | None,
        run: Any,
    ) -> dict[str, Any]:
        """Run ``run()`` and record its answer in ``applied``, even if the request that asked is gone.

        The call runs as its own task: a client that disconnects mid-call does not cancel it, and its
        retry gets the answer. A failure that left the env in place (not called: 503, 409) frees the
        number again (``before`` is the record again); one that dropped the env is remembered.
        """

        async def settle() -> dict[str, Any]:
            try:
                response = await run()
            except _CallFailed as exc:
                if env_id in self.envs or env_id in self._creating:
                    if before is not None:
                        hosted.last = before
                elif exc.status >= 500 and exc.kind != "overloaded":
                    self._bury(env_id, str(exc), applied)
                applied.settle(failure=exc)
                raise
            except BaseException as exc:
                failure = _CallFailed(
                    500, "env_error", f"{applied.op} seq={applied.seq}: {exc!r}"
                )
                self._bury(env_id, str(failure), applied)
                dropped = self.envs.pop(env_id, None)
                if dropped is not None and isinstance(dropped.env, ProcessEnv):
                    dropped.env.kill("its call was interrupted")
                applied.settle(failure=failure)
                raise
            applied.settle(response=response)
            return response

        task = asyncio.ensure_future(settle())
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _repeat(
        self, env_id: str, applied: _Applied, seq: int, op: str, key: str
    ) -> dict[str, Any]:
        if (applied.op, applied.key) != (op, key):
            self.stats.out_of_sequence += 1
            raise _CallFailed(
                409,
                "out_of_sequence",
                f"env {env_id!r}: seq={seq} was already used for a {applied.op} with other "
                "arguments; a repeat must resend the same call",
            )
        self.stats.repeats += 1
        return await applied.answer()

    def _session(self, env_id: str, seq: int, op: str, key: str) -> _Hosted | None:
        """The env's record; None if the id is unknown; a gone env's failed call is answered again."""
        hosted = self.envs.get(env_id) or self._creating.get(env_id)
        if hosted is not None:
            return hosted
        gone = self._gone.get(env_id)
        if gone is None:
            return None
        failed = gone.failed
        if failed is not None and (failed.seq, failed.op, failed.key) == (seq, op, key):
            assert failed.failure is not None
            self.stats.repeats += 1
            raise failed.failure.again()
        raise _CallFailed(404, "not_found", f"env {env_id!r} is gone: {gone.why}")

    def _not_found(self, env_id: str) -> _CallFailed:
        gone = self._gone.get(env_id)
        if gone is not None:
            return _CallFailed(404, "not_found", f"env {env_id!r} is gone: {gone.why}")
        return _CallFailed(
            404,
            "not_found",
            f"no env with id {env_id!r} on this server: never created here, or the server "
            "restarted since and lost it (envs do not survive a restart); start a new env",
        )

    def _bury(self, env_id: str, why: str, failed: _Applied | None = None) -> None:
        self._gone[env_id] = _Gone(why, failed)
        self._gone.move_to_end(env_id)
        while len(self._gone) > GONE_KEPT:
            self._gone.popitem(last=False)

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

    async def _call(
        self, env_id: str, hosted: _Hosted, method: str, *args: Any, timeout: float
    ) -> Any:
        if hosted.lock.locked():
            raise _CallFailed(
                409, "busy", f"env {env_id} is already running a call; wait for it"
            )
        async with hosted.lock:
            self.stats.calls += 1
            fn = getattr(hosted.env, method)
            if inspect.iscoroutinefunction(fn):
                call = asyncio.wait_for(fn(*args), timeout)
            else:  # timed by the pool from when it starts; a hung call closes its env when it returns
                env = hosted.env
                call = self._pool.run(
                    fn, *args, timeout=timeout, cleanup=lambda _: _close_quietly(env)
                )
            try:
                return await self._timed(call, timeout, method, env_id)
            finally:
                hosted.last_used = time.monotonic()

    async def _timed(
        self, call: Any, timeout: float, method: str, env_id: str | None
    ) -> Any:
        """Await ``call`` (bounded by ``timeout`` itself); on failure the env is dropped (its process killed) and 500 names why.

        A call that found no free thread never ran: the env is kept and 503 ``overloaded`` says so.
        """
        try:
            return await call
        except NoFreeThread as exc:
            self.stats.overloaded += 1
            raise _CallFailed(
                503, "overloaded", f"{method}: {exc}; the env was not called"
            ) from None
        except TimeoutError:
            self.stats.timeouts += 1
            await self._drop(env_id)
            raise _CallFailed(
                500,
                "timeout",
                f"{method} exceeded timeout_s={timeout:g}; the env was killed",
            ) from None
        except BadRequest:
            raise
        except Exception as exc:
            crashed = isinstance(exc, EnvProcessError) and exc.crashed
            if crashed:
                self.stats.crashes += 1
            else:
                self.stats.env_errors += 1
            await self._drop(env_id)
            raise _CallFailed(
                500,
                "crashed" if crashed else "env_error",
                f"{method}: {type(exc).__name__}: {exc}",
            ) from None

    async def _drop(self, env_id: str | None) -> None:
        hosted = self.envs.pop(env_id, None) if env_id is not None else None
        if hosted is not None:
            await self._dispose(hosted.env, after_failure=True)

    async def _dispose(self, env: Any, after_failure: bool = False) -> None:
        if isinstance(env, ProcessEnv):
            if after_failure:
                env.kill("dropped after a failed call")
            else:
                await env.close()
            return
        if after_failure:
            return  # an in-thread env may still be running its call: that call's thread closes it
        if callable(getattr(env, "close", None)):
            try:
                await self._pool.run(_close_quietly, env, timeout=5.0)
            except Exception:
                logger.debug("env close failed", exc_info=True)

    async def _json(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except Exception as exc:
            raise web.HTTPBadRequest(
                text=_dumps(
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

    async def _respond(self, op: Any, body: Any) -> web.Response:
        try:
            return web.json_response(await op(body))
        except BadRequest as exc:
            self.stats.bad_requests += 1
            return self._error(400, "bad_request", str(exc))
        except _CallFailed as exc:
            return self._error(exc.status, exc.kind, str(exc))

    @staticmethod
    def _error(status: int, kind: str, message: str) -> web.Response:
        return web.json_response({"error": message, "kind": kind}, status=status)

    async def _on_shutdown(self, app: web.Application) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for env_id in list(self.envs):
            hosted = self.envs.pop(env_id)
            if isinstance(hosted.env, ProcessEnv):
                hosted.env.kill("server shutdown")
        self._pool.shutdown()


def _call_key(*args: Any) -> str:
    """A call's arguments as one comparable string (a repeat must be the same call)."""
    return json.dumps(list(args), sort_keys=True, default=str)


def _retrieve(task: asyncio.Future) -> None:
    """Mark a call task's failure as seen: its requester may be gone, and its record holds the answer."""
    if not task.cancelled():
        task.exception()


def _close_quietly(env: Any) -> None:
    """Close an in-thread env (in a pool thread); an env that fails to close is only logged."""
    close = getattr(env, "close", None)
    if callable(close):
        try:
            result = close()
            if inspect.isawaitable(result):
                asyncio.run(_await(result))
        except Exception:
            logger.debug("env close failed", exc_info=True)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _dumps(obj: Any) -> str:
    return json.dumps(obj)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: loopback only)",
    )
    parser.add_argument(
        "--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)"
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it may register envs with roll_async.envs.register_env); repeatable",
    )
    parser.add_argument(
        "--isolation",
        choices=ISOLATION_MODES,
        default="process",
        help="process (default): one child process per env",
    )
    parser.add_argument(
        "--env-timeout-s",
        type=float,
        default=60.0,
        help="default per-call timeout (a request may pass timeout_s)",
    )
    parser.add_argument(
        "--max-envs",
        type=int,
        default=None,
        help="most env instances held at once (429 beyond); default 256 with "
        "--isolation process, 4096 with none",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=32,
        help="threads kept free for short env calls (sync envs; process starts)",
    )
    parser.add_argument(
        "--max-threads",
        type=int,
        default=1024,
        help="most threads in all: slow or hung calls get extra threads up to this "
        "(a hung call holds its thread until it returns); default 1024",
    )
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=900.0,
        help="close an env nobody called for this long (its client died); 0 disables (default 900)",
    )


def main(args: argparse.Namespace) -> int:
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise SystemExit(
                f"roll-async env-server: --import {module}: {exc}"
            ) from None
    before, after = raise_open_files_limit()
    if after != before:
        print(
            f"roll-async env-server: raised the open-files limit from {before} to {after} "
            "(every session holds a connection)",
            flush=True,
        )
    if 0 <= after < 4096:
        print(
            f"roll-async env-server: warning: the open-files limit is {after} (the hard limit); "
            "each session holds a connection, so that many sessions at most",
            flush=True,
        )
    server = EnvServer(
        isolation=args.isolation,
        env_timeout_s=args.env_timeout_s,
        max_envs=args.max_envs,
        threads=args.threads,
        max_threads=args.max_threads,
        idle_timeout_s=args.idle_timeout_s,
    )

    async def serve() -> None:
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port, backlog=LISTEN_BACKLOG)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(
            f"roll-async env-server listening on http://{args.host}:{port} (isolation={args.isolation})",
            flush=True,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


def _drain(stream: Any, tail: collections.deque) -> None:
    """Read a child's output to its end, keeping the last lines (the pipe never fills)."""
    for line in stream:
        tail.append(line)


def launch_server_process(
    *extra_args: str, host: str = "127.0.0.1", timeout_s: float = 120.0
) -> tuple[Any, str]:
    """Start ``roll-async env-server`` as a subprocess on a free port; returns (Popen, url) once it listens.

    For tests and benchmarks; the caller terminates the process.
    """
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "roll_async.cli",
            "env-server",
            "--host",
            host,
            "--port",
            "0",
            *extra_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout_s
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            break
        lines.append(line)
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].split()[0]
            # Keep reading its output: a full pipe would block the server at its next log line.
            threading.Thread(
                target=_drain,
                args=(process.stdout, collections.deque(lines, maxlen=200)),
                name="env-server-output",
                daemon=True,
            ).start()
            return process, url
    process.kill()
    raise RuntimeError("env-server did not start: " + "".join(lines[-20:]))
