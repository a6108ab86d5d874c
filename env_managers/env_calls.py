"""An env's own code may be slow, hang, raise or leak, and many envs share one
event loop; this module keeps every call into an env instance (``make_env``,
``reset``, ``step``, ``close``) bounded by a timeout and away from the loop, so
one bad env costs its own episode and nothing else.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from roll_async.env_managers.env_status import EnvManagerStats
from roll_async.errors import CallTimeoutError, EnvCallError, EnvServiceUnavailable

logger = logging.getLogger(__name__)

#: How long to wait for an env close before giving up on it.
ENV_CLOSE_TIMEOUT_S = 5.0
#: Least time an out-of-process env gets to start (``env.prepare()``: fork a process, create a server instance).
_ENV_PREPARE_TIMEOUT_S = 120.0

EnvBuilder = Callable[[dict[str, Any]], Any]


def close_env_now(env: Any) -> None:
    """Close ``env`` in the calling thread (an abandoned call's thread, once the call returned)."""
    close = getattr(env, "close", None)
    if not callable(close):
        return
    try:
        result = close()
        if inspect.isawaitable(result):
            asyncio.run(_await(result))
    except Exception:
        logger.debug("closing an abandoned env failed", exc_info=True)


async def _await(awaitable: Any) -> Any:
    return await awaitable


class ThreadCall:
    """One sync env call in a thread: timed from when it starts running; cleans up after itself if abandoned.

    ``env`` is the env the call runs on; None means the call builds an env (make_env) and its result is the
    env to close if nobody waits for it any more. The thread records when the call starts and how much CPU
    it used; the event loop learns the start time only when its timer checks (no wake-up per start), so a
    call costs one thread hop and one timer.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], env: Any) -> None:
        self.fn, self.args, self.env = fn, args, env
        self._lock = threading.Lock()
        self._finished = self._abandoned = False
        self.started_at: float | None = (
            None  # on the event loop's clock, read in the thread
        )
        self.cpu_s = 0.0  # the call's own CPU time (its thread's), for the rollout's CPU accounting

    def _call(self, clock: Callable[[], float]) -> Any:
        self.started_at = clock()
        cpu0 = time.thread_time()
        result = None
        try:
            result = self.fn(*self.args)
            return result
        finally:
            self.cpu_s = time.thread_time() - cpu0
            with self._lock:
                self._finished = True
                abandoned = self._abandoned
            if abandoned:
                close_env_now(self.env if self.env is not None else result)

    async def run(self, executor: Executor | None, timeout: float) -> Any:
        """The call's result; TimeoutError once it has RUN for ``timeout`` s (time queued for a thread is free)."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(executor, self._call, loop.time)
        async with asyncio.timeout(None) as scope:
            timer: asyncio.TimerHandle | None = None

            def check() -> None:
                nonlocal timer
                started = self.started_at
                # still queued behind other calls: look again a timeout later
                if started is None:
                    timer = loop.call_later(timeout, check)
                else:
                    # in the past: the scope times out now
                    scope.reschedule(started + timeout)

            timer = loop.call_later(timeout, check)
            try:
                return await future
            except asyncio.CancelledError:
                future.cancel()  # a call still queued never runs
                raise
            finally:
                timer.cancel()

    def abandon(self) -> bool:
        """Nobody waits for the result any more; True if the call is still running (its thread cleans up)."""
        with self._lock:
            self._abandoned = True
            return not self._finished


class EnvCaller:
    """Holds one env instance and makes every call on it, within ``timeout_s``.

    Sync env methods run in a thread pool so a slow or hung env never blocks the
    event loop that hosts the other envs; ``async def`` methods are awaited with
    the same timeout. The timeout counts from when a call starts running, not
    while it waits for a free thread. A call that raised or was interrupted
    (timeout, or episode cancelled mid-call) leaves the env in an unknown state,
    so the instance is marked dirty and rebuilt for the next episode. After a
    timeout the hung thread cannot be killed; this caller then moves to a private
    one-thread executor so the shared pool does not shrink, and the env is closed
    by that thread as soon as its call returns (never leaked). For an env that
    must really be stopped, ``isolation: process`` runs it in a child process that
    is killed at the timeout (``roll_async.env_service``). With ``inline`` (envs
    whose calls take microseconds, where a thread hop costs more than the call)
    sync calls run on the event loop itself; a call that overran the timeout fails
    once it returns, but nothing can interrupt it. ``EnvServiceUnavailable`` (no
    env server of the tag answers) passes through unchanged; every other failure
    is an :class:`EnvCallError`.
    """

    def __init__(
        self,
        env_id: int,
        make_env: EnvBuilder,
        *,
        timeout_s: float,
        stats: EnvManagerStats,
        executor: Executor | None = None,
        inline: bool = False,
    ) -> None:
        self.env_id = env_id
        self._make_env = make_env
        self.timeout_s = timeout_s
        self.stats = stats
        self._executor = executor
        self._inline = inline
        self._env: Any = None
        self._env_config: dict[str, Any] | None = None
        self._env_dirty = False
        self._env_maybe_busy = False
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def env(self) -> Any:
        """The env instance held now (None before the first build or after a discard)."""
        return self._env

    def holds(self, env_config: dict[str, Any]) -> bool:
        """True if the current env was built from ``env_config`` and is still usable."""
        return (
            self._env is not None
            and not self._env_dirty
            and env_config == self._env_config
        )

    async def ensure(
        self, env_config: dict[str, Any], before_build: Callable[[], None]
    ) -> None:
        """Keep the env if it was built from ``env_config`` and is still usable; else call ``before_build``
        (the caller's phase) and build one."""
        if self.holds(env_config):
            return
        before_build()
        await self.build(env_config)

    def mark_dirty(self) -> None:
        """The env's state is unknown (its episode failed): rebuild it before the next episode."""
        self._env_dirty = True

    async def build(self, env_config: dict[str, Any]) -> None:
        """Discard the current env and build (and, out of process, start) one from ``env_config``."""
        self.discard()
        env = await self._run_with_timeout(
            self._make_env, env_config, what="make_env"
        )  # env=None: close what it builds
        self._env, self._env_config, self._env_dirty = env, env_config, False
        if inspect.iscoroutinefunction(getattr(env, "prepare", None)):
            # An out-of-process env starts its process / server instance here, so reset/step timeouts
            # measure only the env's own calls.
            timeout = max(self.timeout_s, _ENV_PREPARE_TIMEOUT_S)
            await self._run_with_timeout(
                env.prepare, what="env.prepare", env=env, timeout=timeout
            )
        self.stats.env_builds += 1

    async def call(self, method_name: str, *args: Any) -> Any:
        """``env.<method_name>(*args)`` within the timeout."""
        env = self._env
        return await self._run_with_timeout(
            getattr(env, method_name), *args, what=f"env.{method_name}", env=env
        )

    def discard(self) -> None:
        """Forget the current env; close it in the background unless it may still be running a call."""
        env, busy = self._env, self._env_maybe_busy
        self._env, self._env_config, self._env_dirty, self._env_maybe_busy = (
            None,
            None,
            False,
            False,
        )
        if env is None or busy:
            return
        close = getattr(env, "close", None)
        if close is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._close_quietly(close))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def wait_closed(self, timeout: float = ENV_CLOSE_TIMEOUT_S) -> None:
        """Wait (bounded) for env closes still running in the background (a remote env's DELETE, a process kill)."""
        pending = [task for task in self._background if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def _run_with_timeout(
        self,
        fn: Callable[..., Any],
        *args: Any,
        what: str,
        env: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """Await ``fn(*args)`` (async) or run it in the thread pool (sync; on the loop with ``isolation: inline``),
        within the timeout.

        An interrupted sync call (timeout or cancellation) keeps its thread until it returns; then ``env`` (or,
        for make_env, the env it built) is closed in that thread, so no env leaks. An interrupted async call
        is cancelled (a ProcessEnv kills its child process) and its env closed by :meth:`discard`.
        """
        timeout = timeout or self.timeout_s
        thread_call: ThreadCall | None = None
        try:
            if inspect.iscoroutinefunction(fn):
                # one deadline for the call; no extra Task per call
                async with asyncio.timeout(timeout):
                    result = await fn(*args)
            else:
                if self._inline:
                    result = self._call_inline(fn, args, env, timeout)
                else:
                    thread_call = ThreadCall(fn, args, env)
                    result = await thread_call.run(self._executor, timeout)
                    self.stats.env_cpu_s += thread_call.cpu_s
                if inspect.isawaitable(result):
                    async with asyncio.timeout(timeout):
                        result = await result
            return result
        except TimeoutError:
            self.stats.env_timeouts += 1
            self._env_dirty = True
            if thread_call is not None and thread_call.abandon():
                self._env_maybe_busy = (
                    True  # its thread closes the env when the call returns
                )
                self._move_off_hung_thread()
            raise EnvCallError(
                f"{what} exceeded env_step_timeout_s={timeout}s"
            ) from None
        except asyncio.CancelledError:
            self._env_dirty = True  # interrupted mid-call: the env's state is unknown
            if thread_call is not None and thread_call.abandon():
                self._env_maybe_busy = True
            raise
        except EnvServiceUnavailable:
            raise  # no env server of the tag answers: the rollout cannot go on (get_batch reports it)
        except Exception as exc:
            self._env_dirty = True
            raise EnvCallError(f"{what} raised {type(exc).__name__}: {exc}") from exc

    def _call_inline(
        self, fn: Callable[..., Any], args: tuple[Any, ...], env: Any, timeout: float
    ) -> Any:
        """``isolation: inline``: call on the event loop; an overrun is a timeout once the call returns."""
        started, cpu0 = time.monotonic(), time.thread_time()
        result = fn(*args)
        self.stats.env_cpu_s += time.thread_time() - cpu0
        if time.monotonic() - started > timeout:
            if env is None:
                # make_env overran: the env it built is not used (a used env is discarded)
                close_env_now(result)
            raise CallTimeoutError
        return result

    def _move_off_hung_thread(self) -> None:
        """A timed-out sync call keeps its thread; continue on a private thread so the shared pool keeps its size."""
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"env{self.env_id}"
        )

    async def _close_quietly(self, close: Callable[[], Any]) -> None:
        try:
            if inspect.iscoroutinefunction(close):
                await asyncio.wait_for(close(), ENV_CLOSE_TIMEOUT_S)
            elif self._inline:
                close()
            else:
                future = asyncio.get_running_loop().run_in_executor(
                    self._executor, close
                )
                await asyncio.wait_for(future, ENV_CLOSE_TIMEOUT_S)
        except Exception:
            logger.debug("env %s close failed", self.env_id, exc_info=True)
