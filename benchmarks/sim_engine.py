"""SimEngine: a SIMULATED inference engine for scale tests of the scheduler. It runs no model.

It has the engine's async API (``generate``, ``abort``, ``pause``, ``resume``,
``stats``, ``get_weight_version``, ``update_weights``) and a throughput model
calibrated from the engine ceiling benchmark: continuous batching, where every
decode step advances each running request by one token and takes
``DecodeLatencyModel.step_s(running)`` seconds, the time per decode step that
``benchmarks/engine_ceiling.py`` measured at that concurrency (linear
interpolation between measured concurrencies; beyond the largest one, linear
extrapolation with the last segment's slope, i.e. compute bound). At most
``max_num_seqs`` requests run; the rest wait, as in vLLM. Prefill is not a
separate phase: the ceiling's per-step time is its total time divided by its
output length, so its prefill is spread over the steps.

Each request's output length is drawn from a geometric law with mean
``output_len_mean`` (seeded by the request id, so it is repeatable), capped at
the request's ``max_tokens``; a draw below the cap finishes with ``stop`` (as a
stop string or EOS would), otherwise ``length``. Output ids come from
``token_ids`` (ids that decode to plain text), or, when ``replies`` is given,
are exactly the ids it returns for the request (a scripted policy: the reply's
length is its own, it finishes with ``stop``, or ``length`` when cut at
``max_tokens``). ``time_scale`` > 1 runs the
simulated clock faster than the wall clock (every sleep is divided by it).
The engine keeps its own clock: it does not slow down when the event loop it
shares with the env loops is busy (see ``_run``).

``cpu_s`` is the CPU time the simulator itself spent (its bookkeeping, on the
event loop thread), so callers can subtract it from the process CPU time and
keep the scheduler's own.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import json
import math
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_async.trajectory import GenerationRequest, GenerationResult


@dataclass
class DecodeLatencyModel:
    """Seconds per decode step as a function of the number of running requests."""

    concurrency: list[float]
    step_s: list[float]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.concurrency or len(self.concurrency) != len(self.step_s):
            raise ValueError(
                "DecodeLatencyModel needs matching, non-empty concurrency and step_s lists"
            )
        pairs = sorted(zip(self.concurrency, self.step_s))
        self.concurrency = [float(c) for c, _ in pairs]
        self.step_s = [float(s) for _, s in pairs]
        if any(s <= 0 for s in self.step_s) or self.concurrency[0] <= 0:
            raise ValueError(
                "DecodeLatencyModel: concurrencies and step times must be positive"
            )

    @classmethod
    def from_ceiling(cls, source: str | Path | dict[str, Any]) -> DecodeLatencyModel:
        """From an engine ceiling result (the JSON that benchmarks/engine_ceiling.py writes, or its dict)."""
        data = (
            json.loads(Path(source).read_text())
            if isinstance(source, (str, Path))
            else source
        )
        rows = data["rows"]
        return cls(
            [r["concurrency"] for r in rows],
            [r["decode_step_s"] for r in rows],
            source=str(source) if isinstance(source, (str, Path)) else "dict",
        )

    def step_time(self, running: float) -> float:
        """Seconds for one decode step with ``running`` requests (0 when nothing runs)."""
        if running <= 0:
            return 0.0
        xs, ys = self.concurrency, self.step_s
        if running <= xs[0] or len(xs) == 1:
            return ys[0] if running <= xs[0] else ys[0] * running / xs[0]
        if running >= xs[-1]:
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            return ys[-1] + slope * (running - xs[-1])
        i = bisect.bisect_right(xs, running)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (running - x0) / (x1 - x0)

    def tokens_per_s(self, running: float) -> float:
        """Decode throughput with ``running`` requests in the batch."""
        step = self.step_time(running)
        return running / step if step > 0 else 0.0


@dataclass
class _SimRequest:
    request: GenerationRequest
    length: int
    future: asyncio.Future[GenerationResult]
    start_step: int = -1
    aborted: bool = False
    done: bool = False


def output_length(request_id: str, mean_len: float, max_tokens: int) -> int:
    """Geometric draw with mean ``mean_len`` (at least 1), from a hash of the request id, capped at max_tokens + 1."""
    u = (zlib.crc32(request_id.encode()) % 1_000_003 + 0.5) / 1_000_003
    p = 1.0 / max(1.0, mean_len)
    if p >= 1.0:
        return 1
    draw = 1 + int(math.log(u) / math.log(1.0 - p))
    return min(draw, max_tokens + 1)


class SimEngine:
    """A SIMULATED engine (no model): see the module docstring."""

    def __init__(
        self,
        model: DecodeLatencyModel,
        *,
        max_num_seqs: int = 256,
        output_len_mean: float = 16.0,
        token_ids: Sequence[int] = tuple(range(10, 266)),
        time_scale: float = 1.0,
        weight_version: int = 0,
        replies: Callable[[GenerationRequest], Sequence[int]] | None = None,
    ) -> None:
        if max_num_seqs < 1 or time_scale <= 0:
            raise ValueError("SimEngine: max_num_seqs must be >= 1 and time_scale > 0")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.output_len_mean = output_len_mean
        self._pool = list(token_ids) or [10]
        self.time_scale = time_scale
        self.weight_version = weight_version
        self._replies = replies
        self._scripted: dict[str, list[int]] = {}
        self._waiting: deque[_SimRequest] = deque()
        self._running: dict[str, _SimRequest] = {}
        self._finish_heap: list[tuple[int, int, _SimRequest]] = []
        self._by_id: dict[str, _SimRequest] = {}
        self._seq = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._paused = False
        self.step = 0
        self.sim_time_s = 0.0
        self.busy_sim_s = 0.0
        self.cpu_s = 0.0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished_requests = 0

    # -- engine API --------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        cpu0 = time.thread_time()
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="sim-engine")
        if self._replies is None:
            length = output_length(
                request.request_id, self.output_len_mean, request.max_tokens
            )
        else:
            scripted = list(self._replies(request))
            self._scripted[request.request_id] = scripted
            # a reply longer than the budget is cut there and finishes with "length"
            length = (
                max(1, len(scripted))
                if len(scripted) <= request.max_tokens
                else request.max_tokens + 1
            )
        state = _SimRequest(request, length, loop.create_future())
        self._by_id[request.request_id] = state
        self._waiting.append(state)
        self.prompt_tokens += len(request.prompt_token_ids)
        assert self._wake is not None
        self._wake.set()
        self.cpu_s += time.thread_time() - cpu0
        result: GenerationResult = await state.future
        return result

    async def abort(self, request_ids: list[str]) -> None:
        cpu0 = time.thread_time()
        for request_id in request_ids:
            state = self._by_id.get(request_id)
            if state is not None and not state.done:
                state.aborted = True
                if state.start_step < 0:  # still waiting
                    try:
                        self._waiting.remove(state)
                    except ValueError:
                        pass
                self._finish(state, "abort")
        self.cpu_s += time.thread_time() - cpu0

    async def pause(self, mode: str = "abort") -> None:
        self._paused = True
        if mode == "abort":
            await self.abort(list(self._by_id))

    async def resume(self) -> None:
        self._paused = False
        if self._wake is not None:
            self._wake.set()

    async def stats(self) -> dict[str, Any]:
        return {
            "running": len(self._running),
            "waiting": len(self._waiting),
            "in_flight": len(self._by_id),
            "kv_cache_usage": 0.0,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "finished_requests": self.finished_requests,
            "weight_version": self.weight_version,
            "sim_time_s": self.sim_time_s,
            "sim_busy_s": self.busy_sim_s,
            "steps": self.step,
        }

    async def get_weight_version(self) -> int:
        return self.weight_version

    async def update_weights(self, weights: object, version: int) -> float:
        self.weight_version = version
        return 0.0

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for state in list(self._by_id.values()):
            self._finish(state, "abort")

    # -- simulation --------------------------------------------------------------------

    def _output(self, state: _SimRequest, produced: int) -> list[int]:
        scripted = self._scripted.pop(state.request.request_id, None)
        if scripted is not None:
            return scripted[:produced]
        offset = zlib.crc32(state.request.request_id.encode()) % len(self._pool)
        pool = self._pool
        return [pool[(offset + k) % len(pool)] for k in range(produced)]

    def _finish(self, state: _SimRequest, reason: str) -> None:
        if state.done:
            return
        state.done = True
        self._by_id.pop(state.request.request_id, None)
        self._running.pop(state.request.request_id, None)
        if reason == "abort":
            produced = (
                max(0, min(state.length, self.step - state.start_step))
                if state.start_step >= 0
                else 0
            )
        else:
            produced = min(state.length, state.request.max_tokens)
        self.generation_tokens += produced
        self.finished_requests += 1
        if not state.future.done():
            state.future.set_result(
                GenerationResult(
                    request_id=state.request.request_id,
                    output_token_ids=self._output(state, produced),
                    logprobs=[-1.0] * produced,
                    finish_reason=reason,  # type: ignore[arg-type]
                    weight_version=self.weight_version,
                    num_prompt_tokens=len(state.request.prompt_token_ids),
                )
            )

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_num_seqs:
            state = self._waiting.popleft()
            if state.done:
                continue
            state.start_step = self.step
            self._running[state.request.request_id] = state
            steps = min(state.length, state.request.max_tokens)
            heapq.heappush(
                self._finish_heap, (self.step + steps, next(self._seq), state)
            )

    async def _run(self) -> None:
        """Decode steps on the simulated clock, as an engine in its own process would run them.

        Step ``k`` ends ``step_time`` after step ``k - 1``, whether or not this event loop (which the simulator
        shares with the env loops) woke up on time: a late wake-up runs the missed steps back to back without
        yielding, so the engine's own throughput does not depend on how busy the scheduler keeps the loop. Only
        admitting new requests and delivering results wait for the loop, like the IPC of a real engine. (The
        catch-up ends: steps take simulated time, and without new arrivals the batch drains.)
        """
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            cpu0 = time.thread_time()
            if not self._paused:
                self._admit()
            running = 0 if self._paused else len(self._running)
            self.cpu_s += time.thread_time() - cpu0
            if running == 0:
                self._wake.clear()
                await self._wake.wait()
                last = loop.time()  # the engine was idle; it starts again now
                continue
            dt = self.model.step_time(running)
            target = last + dt / self.time_scale
            delay = target - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            # else: behind schedule (the loop was busy): run this step now, without yielding, as an engine in
            # its own process would have; results reach the env loops when the loop is free again.
            last = target
            cpu0 = time.thread_time()
            self.step += 1
            self.sim_time_s += dt
            self.busy_sim_s += dt
            heap = self._finish_heap
            while heap and heap[0][0] <= self.step:
                _, _, state = heapq.heappop(heap)
                if not state.done:
                    reason = (
                        "stop" if state.length <= state.request.max_tokens else "length"
                    )
                    self._finish(state, reason)
            self.cpu_s += time.thread_time() - cpu0
