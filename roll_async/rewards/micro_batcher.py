"""Gathers items that callers submit one by one into batches for a single model forward pass.

A reward model scores one text per finished episode, and episodes finish one
at a time; running each alone wastes the forward pass, so requests that arrive
within a short window are run together, up to a batch size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from roll_async.errors import InvalidInputError

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class BatchStats:
    batches: int = 0
    items: int = 0
    max_batch_size: int = 0


class MicroBatcher(Generic[Item, Result]):
    """``await submit(items)`` -> their results; ``run_batch`` sees at most ``batch_size`` items at a time.

    The first waiting item opens a window of ``window_s`` seconds (closed early when the batch is full);
    items whose caller gave up (cancelled) before their batch runs are left out of it.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Item]], Awaitable[list[Result]]],
        *,
        batch_size: int,
        window_s: float,
    ) -> None:
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1")
        self._run_batch = run_batch
        self.batch_size = batch_size
        self.window_s = window_s
        self.stats = BatchStats()
        self._pending: list[tuple[Item, asyncio.Future[Result]]] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: list[tuple[Item, asyncio.Future[Result]]] = []

    async def submit(self, items: Sequence[Item]) -> list[Result]:
        if not items:
            return []
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Result]] = [loop.create_future() for _ in items]
        self._pending.extend(zip(items, futures))
        self._arrived.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._serve(), name="micro_batcher")
        return list(await asyncio.gather(*futures))

    async def close(self) -> None:
        """Stop serving; waiting callers get CancelledError."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for _, future in self._pending + self._running:
            future.cancel()
        self._pending.clear()
        self._running = []

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._pending = [(i, f) for i, f in self._pending if not f.done()]
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            deadline = loop.time() + self.window_s
            while len(self._pending) < self.batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except TimeoutError:
                    break
            batch = [
                (i, f) for i, f in self._pending[: self.batch_size] if not f.done()
            ]
            del self._pending[: self.batch_size]
            if batch:
                await self._run(batch)

    async def _run(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        self.stats.batches += 1
        self.stats.items += len(batch)
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(batch))
        self._running = batch
        try:
            results = await self._run_batch([item for item, _ in batch])
            if len(results) != len(batch):
                raise InvalidInputError(
                    f"batch function returned {len(results)} results for {len(batch)} items"
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self._running = []
        for (_, future), result in zip(batch, results):
            if not future.done():
                future.set_result(result)
