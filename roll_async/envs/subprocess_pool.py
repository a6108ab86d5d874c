"""Reusable helper processes that answer JSON requests, each call bounded in time by killing its helper.

Signal-based time-outs only work in a main thread and envs run in worker
threads, so work that can hang on bad input (a symbolic check of
``9^{9^{9^{9}}}``) runs in a child process: past the deadline the child is
killed and replaced on the next call. Children are reused, so their start-up
(importing heavy libraries) is paid once, outside any call's limit; each reads
one JSON request per line on stdin (:func:`serve_json_lines`) and exits when
stdin closes, so none outlives its parent.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from roll_async.errors import InvalidInputError, RollAsyncError

_READY = {"ready": True}


class PoolCallTimeout(RollAsyncError):
    """The child did not answer within the call's time limit; it was killed."""


class PoolWorkerFailed(RollAsyncError):
    """The child died, could not start, or answered something that is not a JSON line."""


class _Worker:
    """One child process and the line protocol with it."""

    def __init__(
        self, command: Sequence[str], env: dict[str, str], startup_timeout_s: float
    ) -> None:
        self.calls = 0
        self._buffer = b""
        try:
            self.proc = subprocess.Popen(
                list(command),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            raise PoolWorkerFailed(
                f"helper {list(command)} could not start: {e}"
            ) from None
        try:
            ready = self._read_reply(time.monotonic() + startup_timeout_s)
        except PoolCallTimeout:
            self.kill()
            raise PoolWorkerFailed(
                f"helper {list(command)} did not start within {startup_timeout_s:g}s"
            ) from None
        except PoolWorkerFailed:
            self.kill()
            raise
        if ready != _READY:
            self.kill()
            raise PoolWorkerFailed(f"helper {list(command)} sent {ready!r} at start")

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
        except OSError as e:
            raise PoolWorkerFailed(f"helper is gone: {e}") from None
        self.calls += 1
        return self._read_reply(time.monotonic() + timeout_s)

    def _read_reply(self, deadline: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolCallTimeout()
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise PoolWorkerFailed(
                    f"helper exited (status {self.proc.poll()}) before answering"
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            raise PoolWorkerFailed(
                f"helper wrote a line that is not JSON: {line[:200]!r}"
            ) from None
        if not isinstance(reply, dict):
            raise PoolWorkerFailed(f"helper wrote {reply!r}, not a JSON object")
        return reply

    def kill(self) -> None:
        """SIGKILL the child and reap it; safe to call twice."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class SubprocessPool:
    """Up to ``max_workers`` reusable children running ``command``; thread-safe.

    :meth:`call` sends one request and waits at most ``timeout_s`` for the reply
    (not counting the child's start-up); past it the child is killed and
    :class:`PoolCallTimeout` is raised. A child is replaced after
    ``max_calls_per_worker`` calls so caches inside it cannot grow without bound.
    """

    def __init__(
        self,
        command: Sequence[str],
        max_workers: int = 2,
        startup_timeout_s: float = 60.0,
        max_calls_per_worker: int = 2000,
        env: dict[str, str] | None = None,
    ) -> None:
        if max_workers < 1:
            raise InvalidInputError(f"max_workers must be >= 1, got {max_workers}")
        self.command = list(command)
        self.max_workers = max_workers
        self.startup_timeout_s = startup_timeout_s
        self.max_calls_per_worker = max_calls_per_worker
        self.env = dict(os.environ if env is None else env)
        self._slots = threading.BoundedSemaphore(max_workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._pid = os.getpid()
        #: Children killed because a call ran past its limit (for tests and diagnostics).
        self.num_killed = 0
        self.num_started = 0

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The child's reply; raises PoolCallTimeout past ``timeout_s`` or PoolWorkerFailed if it dies."""
        with self._slots:
            worker = self._take_idle() or self._start()
            with self._lock:
                self._busy.add(worker)
            try:
                reply = worker.call(request, timeout_s)
            except BaseException as e:
                worker.kill()
                if isinstance(e, PoolCallTimeout):
                    with self._lock:
                        self.num_killed += 1
                raise
            finally:
                with self._lock:
                    self._busy.discard(worker)
            if worker.calls >= self.max_calls_per_worker:
                worker.kill()
            else:
                with self._lock:
                    self._idle.append(worker)
            return reply

    def busy_pids(self) -> list[int]:
        """Process ids of the children answering a call right now (for tests and diagnostics)."""
        with self._lock:
            return [worker.proc.pid for worker in self._busy]

    def close(self) -> None:
        """Kill the idle children (busy ones are killed by their callers when they fail)."""
        with self._lock:
            idle, self._idle = self._idle, []
        if os.getpid() != self._pid:
            return  # inherited over fork: the children belong to the parent
        for worker in idle:
            worker.kill()

    def _take_idle(self) -> _Worker | None:
        with self._lock:
            # forked: the pipes belong to the parent's children
            if os.getpid() != self._pid:
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
                worker.kill()
        return None

    def _start(self) -> _Worker:
        worker = _Worker(self.command, self.env, self.startup_timeout_s)
        with self._lock:
            self.num_started += 1
        return worker


def serve_json_lines(handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The child's side: answer each JSON line on stdin with ``handle(request)`` as one JSON line on stdout.

    Anything the handler's libraries print goes to stderr, so it cannot corrupt the
    replies. Returns when stdin closes (the parent is done or gone).
    """
    replies: IO[str] = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr
    replies.write(json.dumps(_READY) + "\n")
    replies.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = handle(json.loads(line))
        except Exception as e:  # a bug in the handler: report it, keep serving
            reply = {"error": f"{type(e).__name__}: {e}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


_shared_lock = threading.Lock()
_pools_to_close: list[SubprocessPool] = []


def close_at_exit(pool: SubprocessPool) -> SubprocessPool:
    """Register ``pool`` to be closed when the interpreter exits; returns it."""
    with _shared_lock:
        if not _pools_to_close:
            atexit.register(_close_all)
        _pools_to_close.append(pool)
    return pool


def _close_all() -> None:
    for pool in _pools_to_close:
        pool.close()
