"""Ctrl-C and SIGTERM that keep the work: the first one stops the run at a safe point, a second one exits at once.

The first SIGINT/SIGTERM sets :class:`InterruptFlag`. Waits that may take long
(engine start, rollout, validation, weight sync) are raced against it with
:meth:`InterruptFlag.race`; a train step in progress is let finish, because
stopping it halfway would leave the weights half-updated. The train pipeline
then saves a checkpoint of the last completed step, shuts its actors down and
raises :class:`RunInterrupted` (the rollout pipeline: :class:`RolloutInterrupted`,
its batches are already written), which the CLI prints as one line and turns
into exit status 128 + the signal number: 130 for SIGINT, 143 for SIGTERM, as a
shell reports a process the signal ended. ``ray.init`` on the main thread installs
Ray's own SIGTERM handler (``sys.exit``), so the pipelines start Ray on the loop's
thread and call :meth:`InterruptFlag.reclaim` right after it (from another thread
``ray.init`` leaves the handlers alone and logs a warning). A second signal while the run
stops exits the process immediately (``os._exit``, same status); Ray's
processes share the driver's fate and go with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: Exit status of a run stopped by SIGINT (the shell's 128 + SIGINT); SIGTERM gives 143 (exit_status).
EXIT_INTERRUPTED = 130


def exit_status(signal_name: str) -> int:
    """128 + the signal's number (130 for SIGINT, 143 for SIGTERM); 130 for an unknown name."""
    try:
        return 128 + int(signal.Signals[signal_name])
    except KeyError:
        return EXIT_INTERRUPTED


class SignalReceived(Exception):
    """Raised inside the pipeline where a wait was stopped by the first signal (its name is the message)."""


@dataclass
class RunInterrupted(Exception):
    """The run stopped on a signal; ``checkpoint`` is None when no step had completed."""

    step: int
    run_dir: str
    checkpoint: str | None
    signal_name: str = "SIGINT"

    def __str__(self) -> str:
        where = (
            f"checkpoint at {self.checkpoint}"
            if self.checkpoint
            else "no completed step to checkpoint"
        )
        return f"interrupted at step {self.step} ({self.signal_name}); {where}"


@dataclass
class RolloutInterrupted(Exception):
    """A rollout run stopped on a signal while collecting batch ``batch``; the ``batch`` before it are written."""

    batch: int
    run_dir: str
    signal_name: str = "SIGINT"

    def __str__(self) -> str:
        return (
            f"interrupted at batch {self.batch} ({self.signal_name}); "
            f"{self.batch} batches kept in {self.run_dir}"
        )


class InterruptFlag:
    """Installed on the running loop for SIGINT and SIGTERM; ``uninstall`` restores the previous handlers."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signal_name = ""
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> InterruptFlag:
        self._loop = asyncio.get_running_loop()
        self._add_handlers()
        return self

    def reclaim(self) -> None:
        """Take SIGINT/SIGTERM back after a library replaced their handlers (``ray.init`` does); no-op if not installed.

        Safe from any thread: a worker thread (``asyncio.to_thread``) has no running loop and may not
        set handlers, so from there the handlers are re-added on the flag's own loop.
        """
        loop = self._loop
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # no loop in this thread
            on_loop = False
        if on_loop:
            self._add_handlers()
        else:
            loop.call_soon_threadsafe(self._add_handlers)

    def _add_handlers(self) -> None:
        if self._loop is None:  # uninstalled meanwhile
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(signum, self._on_signal, signum)

    def uninstall(self) -> None:
        if self._loop is None:
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._loop.remove_signal_handler(signum)
        self._loop = None

    def _on_signal(self, signum: int) -> None:
        if self.event.is_set():
            os._exit(exit_status(signal.Signals(signum).name))  # second signal: at once
        self.signal_name = signal.Signals(signum).name
        self.event.set()

    @property
    def is_set(self) -> bool:
        return self.event.is_set()

    async def race(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` unless a signal comes first; then cancel it and raise ``SignalReceived``."""
        task = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except BaseException:
            # the cancelled wait's own error is not the story; the interrupt is
            pass
        raise SignalReceived(self.signal_name)
