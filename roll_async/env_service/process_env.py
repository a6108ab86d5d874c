"""ProcessEnv: one env instance in its own child process, so a hung or crashing env can really be stopped.

A thread running a hung env cannot be stopped and a segfault takes the worker
with it; a child process can be killed and its death reported, so
``isolation: process`` and the env server run envs here.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import logging
import multiprocessing
import os
import signal
import traceback
from collections.abc import Callable
from multiprocessing import (
    context,
    forkserver,
    popen_forkserver,
    reduction,
    spawn,
    util,
)
from typing import Any

from roll_async.errors import RollAsyncError

logger = logging.getLogger(__name__)

#: How long a polite ``close`` may take before the child is killed.
_CLOSE_TIMEOUT_S = 5.0
#: Imported once in the forkserver so a new env process is a bare fork (this module itself is needed to unpickle).
_PRELOAD = ["roll_async.envs", "roll_async.env_service.process_env"]
_context: Any = None


class EnvProcessError(RollAsyncError, RuntimeError):
    """The env process died (crash, kill) or its env raised; the message says which."""

    def __init__(self, message: str, *, crashed: bool = False) -> None:
        super().__init__(message)
        #: True when the process died on its own (segfault, OOM kill, exit) rather than the env raising.
        self.crashed = crashed


class _EnvPopen(popen_forkserver.Popen):
    """forkserver Popen that does not re-run the parent's main module in the child.

    multiprocessing normally re-imports ``__main__`` in every child (so functions
    defined there unpickle). Our builders live in importable modules, and the
    parent's main is a Ray worker script, pytest or the CLI: re-running it would
    cost a second per env process, or worse. Same as the stdlib ``_launch``
    otherwise.
    """

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        # _fds (set by Popen.__init__) and util.close_fds are internals typeshed does not list.
        fds = self._fds  # type: ignore[attr-defined]
        self.sentinel, w = forkserver.connect_to_new_process(fds)
        _parent_w = os.dup(w)
        close_fds = util.close_fds  # type: ignore[attr-defined]
        self.finalizer = util.Finalize(self, close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _EnvProcess(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _EnvPopen(process_obj)


def _mp_context() -> Any:
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _context = ctx
    return _context


def _child_main(conn: Any, builder: Callable[[], Any]) -> None:
    """The child: build the env, then answer (method, args) requests until told to close or the parent leaves."""
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # Ctrl-C goes to the parent, which kills us
    try:
        env = builder()
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
        conn.send(("error", f"building the env raised {type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", None))
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            result = getattr(env, method)(*args)
            if inspect.isawaitable(result):
                result = asyncio.run(_await(result))
            conn.send(("ok", result))
        except BaseException as exc:  # noqa: BLE001
            tb = traceback.format_exc(limit=4)
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{tb}"))
        if method == "close":
            return


async def _await(awaitable: Any) -> Any:
    return await awaitable


def describe_exit(exitcode: int | None) -> str:
    """``killed by SIGSEGV`` / ``exited with code 3`` / ``still running``."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class ProcessEnv:
    """Async proxy to an env living in a child process.

    ``builder`` is a picklable zero-argument callable returning the env (e.g.
    ``functools.partial(make_env, "sokoban", {...})``). ``start()`` launches the
    child and builds the env (blocking, from a thread); the first call starts it
    if nobody did.

    An env's ``reset``/``step`` run in the child; the parent awaits the answer on a
    pipe without blocking its event loop. Cancelling a call (the EnvManager's
    ``env_step_timeout_s`` fired, or the episode was cancelled) SIGKILLs the child:
    a hung env stops for real instead of leaking a thread. A child that dies on its
    own (segfault, OOM kill, ``os._exit``) surfaces as :class:`EnvProcessError`
    naming the exit code or signal. Either way this proxy is dead afterwards; the
    caller builds a fresh one (a fresh process) for the next episode, so at most
    one child per proxy ever exists and killed children are reaped at once.

    Children come from a ``forkserver`` whose process preloads the env registry, so
    a new env process costs a fork (milliseconds), not a Python start, and is never
    forked from a multi-threaded Ray worker or trainer. The child also exits when
    its parent goes away (the pipe closes), so a killed worker leaves no orphans.
    """

    def __init__(self, builder: Callable[[], Any], *, name: str = "env") -> None:
        self._builder = builder
        self.name = name
        self._process: Any = None
        self._conn: Any = None
        self._dead_reason: str | None = None
        self._lock: asyncio.Lock | None = None

    # -- the env API -----------------------------------------------------------------
    async def reset(self, seed: int) -> Any:
        return await self._call("reset", seed)

    async def step(self, action_text: str) -> Any:
        return await self._call("step", action_text)

    async def close(self) -> None:
        """Ask the env to close itself (bounded), then make sure the process is gone."""
        if self._process is None:
            # a start still under way kills what it started
            self._dead_reason = self._dead_reason or "closed"
            return
        try:
            if self._dead_reason is None and self._process.is_alive():
                await asyncio.wait_for(self._call("close"), _CLOSE_TIMEOUT_S)
        except Exception:
            logger.debug(
                "%s: close failed; killing its process", self.name, exc_info=True
            )
        finally:
            self.kill("closed")

    async def prepare(self) -> None:
        """Start the child and build the env without blocking the loop (the EnvManager calls it after make_env)."""
        await asyncio.get_running_loop().run_in_executor(None, self.start)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        return (
            self._process is not None
            and self._dead_reason is None
            and self._process.is_alive()
        )

    def kill(self, reason: str = "killed") -> None:
        """SIGKILL the child (if any) and reap it; the proxy is unusable afterwards."""
        if self._dead_reason is None:
            self._dead_reason = reason
        process, self._process = self._process, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if process is None:
            return
        if process.exitcode is None:
            try:
                process.kill()
            except (OSError, ValueError):
                pass
        process.join(timeout=5.0)  # a SIGKILLed process is reaped within milliseconds
        try:
            process.close()
        except ValueError:
            logger.warning(
                "%s: env process %s did not exit after SIGKILL", self.name, process.pid
            )

    # -- plumbing --------------------------------------------------------------------
    async def _call(self, method: str, *args: Any) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._dead_reason is not None:
                raise EnvProcessError(
                    f"{self.name}: its process is gone ({self._dead_reason}); build a new env"
                )
            if self._process is None:
                await asyncio.get_running_loop().run_in_executor(None, self.start)
            try:
                self._conn.send((method, args))
                status, value = await self._receive()
            except asyncio.CancelledError:
                self.kill(f"{method} was interrupted (timeout or cancellation)")
                raise
            if status == "error":
                # the env's state is unknown after an exception: never reuse it
                self.kill(f"{method} raised")
                raise EnvProcessError(f"{self.name}.{method} raised {value}")
            return value

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the child and build the env there (blocking; call it from a thread). Idempotent.

        Kept apart from ``reset``/``step`` so their timeouts measure the env call, not a process start.
        """
        if self._process is not None or self._dead_reason is not None:
            return
        # the first start also starts the forkserver (a second or so)
        ctx = _mp_context()
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = _EnvProcess(
            target=_child_main,
            args=(child_conn, self._builder),
            name=f"roll-async-{self.name}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        self._process, self._conn = process, parent_conn
        try:
            if not parent_conn.poll(timeout_s):
                raise EnvProcessError(
                    f"{self.name}: building the env took longer than {timeout_s:g}s"
                )
            status, value = parent_conn.recv()
        except (EOFError, OSError):
            process.join(timeout=5.0)
            reason = f"env process {process.pid} {describe_exit(process.exitcode)} while building the env"
            self.kill(reason)
            raise EnvProcessError(f"{self.name}: {reason}", crashed=True) from None
        except BaseException:
            self.kill("start failed")
            raise
        if status == "error":
            self.kill("building the env failed")
            raise EnvProcessError(f"{self.name}: {value}")
        if self._dead_reason is not None:  # closed or killed while it was starting
            self._dead_reason = None
            self.kill("closed while starting")

    async def _receive(self) -> tuple[str, Any]:
        """Wait (without blocking the loop) for the child's answer, or for its death."""
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = self._conn.fileno()

        def on_readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, on_readable)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        try:
            answer: tuple[str, Any] = self._conn.recv()
            return answer
        except (EOFError, OSError):
            process = self._process
            process.join(timeout=5.0)
            reason = f"env process {process.pid} {describe_exit(process.exitcode)}"
            self.kill(reason)
            raise EnvProcessError(f"{self.name}: {reason}", crashed=True) from None

    def __del__(self) -> None:  # last resort: never leave a child behind
        process = getattr(self, "_process", None)
        if process is not None and process.exitcode is None:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except OSError:
                pass
