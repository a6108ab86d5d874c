"""The env server's threads for sync env calls: a slow or hung env never makes the others wait.

With ``--isolation none`` every sync ``reset``/``step`` of every session runs in
the server's threads. A fixed pool (``ThreadPoolExecutor``) lets a few hung or
slow envs hold all its threads, and then every other session's call queues
behind them until it times out; a hung thread also cannot be killed, and a
non-daemon one blocks the server's exit. ``EnvThreadPool`` keeps ``threads``
threads free for short calls: a call that has run longer than ``long_call_s``
no longer counts, and a new thread replaces it, up to ``max_threads`` in all.
Its threads are daemons, and a call's timeout counts from when it starts.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from roll_async.errors import (
    CallTimeoutError,
    InvalidInputError,
    LifecycleError,
    RollAsyncError,
)

logger = logging.getLogger(__name__)


class NoFreeThread(RollAsyncError, TimeoutError):
    """A call waited its whole timeout with all ``max_threads`` threads busy; it never ran (the env was not called)."""


class _Work:
    __slots__ = (
        "fn",
        "args",
        "loop",
        "future",
        "started_at",
        "cancelled",
        "abandoned",
        "finished",
        "cleanup",
        "lock",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop,
        cleanup: Callable[[Any], None] | None,
    ) -> None:
        self.fn, self.args, self.loop, self.cleanup = fn, args, loop, cleanup
        self.future: asyncio.Future[Any] = loop.create_future()
        self.started_at: float | None = None  # time.monotonic(), set by the thread
        self.cancelled = False  # never start it (set under the pool's lock)
        self.abandoned = False  # nobody waits for it: its thread runs cleanup(result)
        self.finished = False
        self.lock = threading.Lock()

    def execute(self) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error = exc
        with self.lock:
            self.finished = True
            abandoned = self.abandoned
        if abandoned:
            if self.cleanup is not None:
                try:
                    self.cleanup(None if error else result)
                except Exception:
                    logger.debug(
                        "cleanup after an abandoned call failed", exc_info=True
                    )
            return
        try:
            self.loop.call_soon_threadsafe(self._settle, result, error)
        except RuntimeError:  # the loop is closed: nobody to tell
            pass

    def abandon(self) -> bool:
        """Nobody waits for the result any more; False if the call already finished (its result is on its way)."""
        with self.lock:
            self.abandoned = not self.finished
            return self.abandoned

    def _settle(self, result: Any, error: BaseException | None) -> None:
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class EnvThreadPool:
    """Threads for sync env calls that always has ``threads`` of them free of long calls.

    ``await pool.run(fn, *args, timeout=T)`` runs ``fn`` in a thread and raises
    ``TimeoutError`` once it has *run* for ``T`` seconds (time queued for a thread
    is not counted), or :class:`NoFreeThread` if it is still queued after ``T``
    with all ``max_threads`` threads busy (it then never runs).
    A timed-out call keeps its thread until it returns (a thread cannot be
    killed); then ``cleanup(result)`` runs in that thread (close the env). A
    watchdog counts the calls running longer than ``long_call_s`` (slow or hung)
    every ``long_call_s`` and starts threads so that ``threads`` are left for the
    rest, never more than ``max_threads``; extra threads exit after
    ``idle_exit_s`` idle.
    """

    def __init__(
        self,
        threads: int = 32,
        *,
        max_threads: int = 1024,
        long_call_s: float = 0.1,
        idle_exit_s: float = 10.0,
        name: str = "env-server",
    ) -> None:
        if threads < 1 or max_threads < threads:
            raise InvalidInputError(
                f"threads={threads}, max_threads={max_threads}: need 1 <= threads <= max_threads"
            )
        self.threads, self.max_threads = int(threads), int(max_threads)
        self.long_call_s, self.idle_exit_s = float(long_call_s), float(idle_exit_s)
        self.name = name
        self._cond = threading.Condition()
        self._queue: collections.deque[_Work] = collections.deque()
        self._running: dict[int, float] = {}  # worker number -> start; oldest first
        self._workers = 0
        self._idle = 0
        self._long = 0  # calls running > long_call_s, as of the watchdog's last look
        self._numbers = iter(range(1 << 62))
        self._closed = False
        self._wake = threading.Event()
        #: The watchdog sleeps until woken (nothing was running at its last look).
        self._watchdog_asleep = True
        #: Calls timed out while running (their threads may still be busy).
        self.abandoned = 0
        threading.Thread(
            target=self._watch, name=f"{name}-watchdog", daemon=True
        ).start()

    # -- the event loop's side -------------------------------------------------------
    async def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float,
        cleanup: Callable[[Any], None] | None = None,
    ) -> Any:
        loop = asyncio.get_running_loop()
        work = _Work(fn, args, loop, cleanup)
        self._submit(work)
        timer: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal timer
            if work.future.done():
                return
            started = work.started_at
            if started is None:
                with self._cond:
                    # Queued a whole timeout: fail only if every thread is taken (a long queue of
                    # short calls, as under CPU overload, drains by itself: wait on).
                    if work.started_at is None and self._workers >= self.max_threads:
                        work.cancelled = True
                if work.started_at is None and not work.cancelled:
                    timer = loop.call_later(timeout, check)
                    return
                if work.cancelled:
                    work.future.set_exception(
                        NoFreeThread(
                            f"no free thread for {timeout:g}s (all {self.max_threads} threads busy)"
                        )
                    )
                    return
                started = work.started_at
                # unstarted work either waits on or was cancelled above
                assert started is not None
            left = started + timeout - time.monotonic()
            if left > 0:
                timer = loop.call_later(left, check)
            elif work.abandon():
                self.abandoned += 1
                work.future.set_exception(CallTimeoutError())
            # else it has just finished: its result is on its way to the loop

        timer = loop.call_later(timeout, check)
        try:
            return await work.future
        except asyncio.CancelledError:
            with self._cond:
                if work.started_at is None:
                    work.cancelled = True
            if not work.cancelled:
                work.abandon()
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "threads": self._workers,
                "idle": self._idle,
                "running": len(self._running),
                "long_running": self._long,
                "queued": len(self._queue),
                "abandoned": self.abandoned,
            }

    def shutdown(self) -> None:
        """Idle threads exit; busy ones (daemons) exit when their call returns or with the process."""
        with self._cond:
            self._closed = True
            for work in self._queue:
                work.cancelled = True
            self._queue.clear()
            self._cond.notify_all()
        self._wake.set()

    # -- the threads' side -----------------------------------------------------------
    def _submit(self, work: _Work) -> None:
        with self._cond:
            if self._closed:
                raise LifecycleError(f"{self.name} thread pool is shut down")
            self._queue.append(work)
            self._grow_locked()
            self._cond.notify()
            if self._queue and not self._idle:
                self._wake.set()  # the watchdog looks again soon

    def _grow_locked(self) -> None:
        while (
            len(self._queue) > self._idle
            and self._workers < self.max_threads
            and self._workers - self._long < self.threads
        ):
            self._workers += 1
            self._idle += 1  # counted idle until it takes its first call
            threading.Thread(
                target=self._worker,
                args=(next(self._numbers),),
                name=f"{self.name}-{self._workers}",
                daemon=True,
            ).start()

    def _worker(self, number: int) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue:
                    if self._closed:
                        self._idle -= 1
                        self._workers -= 1
                        return
                    if (
                        not cond.wait(self.idle_exit_s)
                        and not self._queue
                        and self._workers - self._long > self.threads
                    ):
                        self._idle -= 1
                        self._workers -= 1
                        return
                work = self._queue.popleft()
                if work.cancelled:
                    continue
                self._idle -= 1
                work.started_at = time.monotonic()
                self._running[number] = work.started_at
                # the watchdog must look while calls run, to replace hung ones
                if self._watchdog_asleep:
                    self._watchdog_asleep = False
                    self._wake.set()
            try:
                work.execute()
            finally:
                with cond:
                    del self._running[number]
                    self._idle += 1

    def _watch(self) -> None:
        """Every long_call_s while calls run: count the long ones and start threads to replace them."""
        while True:
            self._wake.clear()  # before looking: a wake-up set after this is not lost
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                long_ = 0
                # Oldest first (a thread re-enters at the end): stop at the first short one.
                for started in self._running.values():
                    if now - started <= self.long_call_s:
                        break
                    long_ += 1
                self._long = long_
                self._grow_locked()
                busy = bool(self._running or self._queue)
                self._watchdog_asleep = not busy
            self._wake.wait(self.long_call_s if busy else None)
