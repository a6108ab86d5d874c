"""Hand-overs retried after a dropped connection: each env's last hand-over, answered once.

An env's hand-over (a finished trajectory, a request for a seat, or both) travels
over a ZMQ call socket; when the connection drops mid-call its answer is lost and
the worker retries it under the same id. Applying a retry again would count a
trajectory twice or hand the env a second seat, so the queue actor keeps, per env,
the id of its last hand-over and the task that handles it, and answers a retry
with that task's result. An env makes one hand-over at a time, so one entry per
env bounds the ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class HandoverLedger:
    """Runs each (env, hand-over id) once; a retry of the env's last hand-over gets the same answer."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        #: Retries answered from the ledger (the hand-over had already been handled or was being handled).
        self.retries = 0

    async def run(
        self,
        env_id: int,
        handover_id: str | None,
        handle: Callable[[], Awaitable[T]],
    ) -> T:
        """``handle()`` once for ``handover_id``; its result (or error) again for a retry of the same id."""
        if handover_id is None:
            return await handle()
        last = self._last.get(env_id)
        if last is not None and last[0] == handover_id:
            self.retries += 1
            task = last[1]
        else:
            task = asyncio.ensure_future(handle())
            self._last[env_id] = (handover_id, task)
        # The first caller's connection may be gone; the work goes on for the retry.
        return await asyncio.shield(task)

    def forget(self, env_id: int) -> None:
        """The env's worker was replaced: its hand-overs are never retried."""
        self._last.pop(env_id, None)
