"""Hosting env instances: building them, calling them within a timeout, and disposing of them.

A hung or crashing env must never hang or kill the server, so every env lives
either in its own child process (``process`` isolation: a call past its timeout
kills it) or in the server's thread pool (``none``: a hung call keeps its thread
while the pool starts another), and a failed call drops the env. How envs are
run, timed and torn down is one role, apart from the HTTP handlers and the
exactly-once ledger; the server owns one EnvHost.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable
from typing import Any

from roll_async.env_service.process_env import EnvProcessError, ProcessEnv
from roll_async.env_service.server_stats import ServerStats
from roll_async.env_service.sessions import CallFailed, HostedEnv, SessionTable
from roll_async.env_service.thread_pool import EnvThreadPool, NoFreeThread
from roll_async.env_service.wire import BadRequest
from roll_async.envs import make_env

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("process", "none")
#: Default --max-envs: a process per env costs tens of MB; an in-thread env, kilobytes.
DEFAULT_MAX_ENVS = {"process": 256, "none": 4096}


class EnvHost:
    """Builds, calls and disposes of the envs of ``sessions``, in child processes or in a thread pool.

    ``isolation="process"``: each env in its own :class:`~roll_async.env_service.process_env.ProcessEnv`.
    ``"none"``: in the threads of an :class:`~roll_async.env_service.thread_pool.EnvThreadPool` of ``threads``
    kept free, up to ``max_threads`` in all. A call that fails or runs past its timeout drops its env from
    ``sessions`` (its process killed); ``stats`` counts calls and failures.
    """

    def __init__(
        self,
        sessions: SessionTable,
        stats: ServerStats,
        *,
        isolation: str,
        start_timeout_s: float,
        idle_timeout_s: float,
        threads: int,
        max_threads: int,
    ) -> None:
        self._sessions = sessions
        self._stats = stats
        self.isolation = isolation
        #: A new env process may take this long to start and build its env (not counted in call timeouts).
        self.start_timeout_s = float(start_timeout_s)
        #: An env nobody called for this long is closed (its client died without closing it); 0 disables.
        self.idle_timeout_s = float(idle_timeout_s)
        self.pool = EnvThreadPool(threads, max_threads=max(threads, max_threads))

    async def build(
        self, env_type: str, env_config: dict[str, Any], timeout: float
    ) -> Any:
        builder = functools.partial(make_env, env_type, env_config)
        if self.isolation == "process":
            env: Any = ProcessEnv(builder, name=f"{env_type}-env")
            start_timeout = max(timeout, self.start_timeout_s)
            try:  # start() is bounded by its own timeout; the pool's is a backstop
                await self.pool.run(
                    env.start, start_timeout, timeout=start_timeout + 10
                )
            except Exception as exc:
                env.kill("start failed")
                self._stats.env_errors += 1
                raise CallFailed(500, "env_error", f"make_env: {exc}") from None
            return env
        return await self._timed(
            self.pool.run(builder, timeout=timeout, cleanup=close_quietly),
            timeout,
            "make_env",
            None,
        )

    async def call(
        self, env_id: str, hosted: HostedEnv, method: str, *args: Any, timeout: float
    ) -> Any:
        """``hosted.env.<method>(*args)`` within ``timeout``; 409 ``busy`` while another call on it runs."""
        if hosted.lock.locked():
            raise CallFailed(
                409, "busy", f"env {env_id} is already running a call; wait for it"
            )
        async with hosted.lock:
            self._stats.calls += 1
            fn = getattr(hosted.env, method)
            if inspect.iscoroutinefunction(fn):
                call = asyncio.wait_for(fn(*args), timeout)
            else:  # timed by the pool from when it starts; a hung call closes its env when it returns
                env = hosted.env
                call = self.pool.run(
                    fn, *args, timeout=timeout, cleanup=lambda _: close_quietly(env)
                )
            try:
                return await self._timed(call, timeout, method, env_id)
            finally:
                hosted.last_used = time.monotonic()

    async def _timed(
        self, call: Awaitable[Any], timeout: float, method: str, env_id: str | None
    ) -> Any:
        """Await ``call`` (bounded by ``timeout`` itself); on failure the env is dropped (its process killed) and 500 names why.

        A call that found no free thread never ran: the env is kept and 503 ``overloaded`` says so.
        """
        try:
            return await call
        except NoFreeThread as exc:
            self._stats.overloaded += 1
            raise CallFailed(
                503, "overloaded", f"{method}: {exc}; the env was not called"
            ) from None
        except TimeoutError:
            self._stats.timeouts += 1
            await self._drop(env_id)
            raise CallFailed(
                500,
                "timeout",
                f"{method} exceeded timeout_s={timeout:g}; the env was killed",
            ) from None
        except BadRequest:
            raise
        except Exception as exc:
            crashed = isinstance(exc, EnvProcessError) and exc.crashed
            if crashed:
                self._stats.crashes += 1
            else:
                self._stats.env_errors += 1
            await self._drop(env_id)
            raise CallFailed(
                500,
                "crashed" if crashed else "env_error",
                f"{method}: {type(exc).__name__}: {exc}",
            ) from None

    async def _drop(self, env_id: str | None) -> None:
        hosted = self._sessions.envs.pop(env_id, None) if env_id is not None else None
        if hosted is not None:
            await self.dispose(hosted.env, after_failure=True)

    async def dispose(self, env: Any, after_failure: bool = False) -> None:
        """Close ``env`` (``after_failure``: kill its process; an in-thread one is closed by its call's thread)."""
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
                await self.pool.run(close_quietly, env, timeout=5.0)
            except Exception:
                logger.debug("env close failed", exc_info=True)

    async def reap_idle(self) -> None:
        """Close envs idle past idle_timeout_s: a client killed without closing them must not leak them."""
        while True:
            await asyncio.sleep(max(1.0, min(60.0, self.idle_timeout_s / 4)))
            now = time.monotonic()
            for env_id, hosted in list(self._sessions.envs.items()):
                if (
                    not hosted.lock.locked()
                    and now - hosted.last_used > self.idle_timeout_s
                ):
                    self._sessions.envs.pop(env_id, None)
                    self._stats.reaped_idle += 1
                    self._sessions.bury(
                        env_id,
                        f"closed after idle_timeout_s={self.idle_timeout_s:g} without a call",
                    )
                    await self.dispose(hosted.env)

    def shutdown(self) -> None:
        """Kill every env process and stop the thread pool (the server is shutting down)."""
        envs = self._sessions.envs
        for env_id in list(envs):
            hosted = envs.pop(env_id)
            if isinstance(hosted.env, ProcessEnv):
                hosted.env.kill("server shutdown")
        self.pool.shutdown()


def close_quietly(env: Any) -> None:
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
