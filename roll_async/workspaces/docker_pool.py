"""Warm containers, so an episode's start is off the critical path.

Starting a container costs a few hundred milliseconds to seconds (more under load, much more when the
image must be built first); an episode should not wait for it. The pool keeps up to ``size`` started
and prepared containers per spec (the spec without its ``files``: the image, limits and network a
container is created with) and refills in the background after each take. A take from an empty pool
starts one on the spot (a miss). Containers created while or after the pool closes are removed, so a
shutdown that races a refill leaks nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from roll_async.workspaces.interface import WorkspaceSpec

logger = logging.getLogger(__name__)


#: A pool key's ``files`` when the spec has files: which files does not matter to the container, whether
#: any come does (a workdir that receives files is a tmpfs; one the image fills is a plain volume).
FILES_GIVEN = Path("<files copied in after the take>")


def pool_key(spec: WorkspaceSpec) -> WorkspaceSpec:
    """What a warm container is interchangeable on: everything but which files are copied in after the take."""
    return dataclasses.replace(spec, files=None if spec.files is None else FILES_GIVEN)


class WarmPool:
    """Per-spec queues of ready container ids, refilled in the background to ``size``."""

    def __init__(
        self,
        size: int,
        create: Callable[[WorkspaceSpec], Awaitable[str]],
        remove: Callable[[str], Awaitable[None]],
    ) -> None:
        self._size = size
        self._create = create
        self._remove = remove
        self._ready: dict[WorkspaceSpec, list[str]] = {}
        self._filling: dict[WorkspaceSpec, asyncio.Task[None]] = {}
        # creations under way, those whose awaiter was cancelled (their container belongs to nobody),
        # and removals of such containers
        self._inflight: set[asyncio.Task[str]] = set()
        self._orphans: set[asyncio.Task[str]] = set()
        self._removals: set[asyncio.Task[None]] = set()
        self._closed = False

    def idle(self) -> int:
        """How many warm containers wait, over every spec."""
        return sum(len(ids) for ids in self._ready.values())

    async def take(self, spec: WorkspaceSpec) -> tuple[str, bool]:
        """A started container for ``spec`` and whether it came warm (True) or was started now (False)."""
        key = pool_key(spec)
        ready = self._ready.setdefault(key, [])
        if ready:
            container_id = ready.pop()
            self._refill(key)
            return container_id, True
        container_id = await self._created(key)
        self._refill(key)  # after the cold start, which it would otherwise slow down
        return container_id, False

    async def warm(self, spec: WorkspaceSpec) -> None:
        """Fill ``spec``'s pool now and wait until it is full (before the first episode, say)."""
        key = pool_key(spec)
        self._ready.setdefault(key, [])
        self._refill(key)
        task = self._filling.get(key)
        if task is not None:
            await asyncio.shield(task)

    async def close(self) -> None:
        """Stop refilling, wait for containers being created, and remove every warm one."""
        self._closed = True
        for task in list(self._filling.values()):
            task.cancel()
        await asyncio.gather(*self._filling.values(), return_exceptions=True)
        # a cancelled refill leaves its creation running in a thread: remove what it lands (a cold
        # take that still waits for its container gets it, and its runtime, shut down, removes it too)
        pending = list(self._inflight | self._orphans)
        landed = await asyncio.gather(*pending, return_exceptions=True)
        ready = [cid for ids in self._ready.values() for cid in ids]
        ready += [cid for cid in landed if isinstance(cid, str)]
        self._ready.clear()
        await asyncio.gather(
            *(self._remove(cid) for cid in ready),
            *list(self._removals),
            return_exceptions=True,
        )

    async def _created(self, key: WorkspaceSpec) -> str:
        task = asyncio.ensure_future(self._create(key))
        self._inflight.add(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # the creation goes on in its thread (or just finished): its container is nobody's
            self._orphans.add(task)
            task.add_done_callback(self._remove_orphan)
            raise
        finally:
            self._inflight.discard(task)

    def _remove_orphan(self, task: asyncio.Task[str]) -> None:
        if self._closed:
            return  # close() removes what the orphans land
        self._orphans.discard(task)
        if not task.cancelled() and task.exception() is None:
            removal = asyncio.ensure_future(self._remove(task.result()))
            self._removals.add(removal)
            removal.add_done_callback(self._removals.discard)

    def _refill(self, key: WorkspaceSpec) -> None:
        if self._closed or self._size <= 0:
            return
        running = self._filling.get(key)
        if running is None or running.done():
            self._filling[key] = asyncio.ensure_future(self._fill(key))

    async def _fill(self, key: WorkspaceSpec) -> None:
        ready = self._ready.setdefault(key, [])
        while not self._closed and len(ready) < self._size:
            try:
                container_id = await self._created(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # the next take starts its container on the spot and raises the error where it is seen
                logger.warning("warm pool for %s: %s", key.image, exc)
                return
            if self._closed:
                await self._remove(container_id)
                return
            ready.append(container_id)
