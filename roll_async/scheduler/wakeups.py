"""Waking the rollout's waiters: env loops waiting for a seat, and the trainer waiting for a batch.

Thousands of env loops may wait for a seat at once, so waking all of them on
every event would cost O(envs) per event; these waiters wake one env loop per
event and let each pass the turn on only if another seat is free (a relay), and
wake the trainer side only when a batch may be ready.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class WakeupCounters:
    """How many waiters the scheduler woke, and on how many events (tests check O(1) per event)."""

    #: Env loops woken while waiting for a seat.
    seat: int = 0
    #: get_batch / run_fixed_round waiters woken.
    batch: int = 0
    #: Seat-opening events (seat given back, group dropped or served, resume, quota change).
    seat_events: int = 0


class SeatWaiters:
    """Per tag, the env loops waiting for a seat, woken one at a time.

    The queue wakes one waiter per seat-opening event; a waiter that takes a seat wakes the next only if
    another seat is free (a relay), so each event costs O(1) wake-ups however many envs wait.
    """

    def __init__(self, tags: Sequence[str], wakeups: WakeupCounters) -> None:
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {
            tag: deque() for tag in tags
        }
        self._wakeups = wakeups

    def any(self, tag: str) -> bool:
        return bool(self._waiters[tag])

    def wait(self, tag: str, *, keep_place: bool) -> asyncio.Future[None]:
        """A future woken by ``wake_one``; ``keep_place``: it was woken before but lost the seat, so goes first."""
        future = asyncio.get_running_loop().create_future()
        if keep_place:
            self._waiters[tag].appendleft(future)
        else:
            self._waiters[tag].append(future)
        return future

    def wake_one(self, tag: str) -> None:
        """Wake the longest-waiting env loop of ``tag`` (skipping any whose wait was cancelled)."""
        waiters = self._waiters[tag]
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                self._wakeups.seat += 1
                return

    def wake_all(self) -> None:
        """Shutdown or failure: every waiting loop must see it and stop."""
        for tag, waiters in self._waiters.items():
            while waiters:
                self.wake_one(tag)


class TrainerWakeup:
    """Wake every waiter on a state change (check state, then wait; no lost wake-ups in one event loop).

    Only the trainer side waits here (one get_batch or run_fixed_round at a time), so a notify wakes at most one.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.waiters = 0

    def notify(self) -> int:
        woken = self.waiters
        self._event.set()
        self._event = asyncio.Event()
        self.waiters = 0
        return woken

    async def wait(self) -> None:
        self.waiters += 1
        await self._event.wait()
