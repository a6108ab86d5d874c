"""FakeEngine: a FAKE inference engine for fast scheduling tests. It runs no model.

It has the real engine's async API (generate, abort, pause, resume, stats,
get_weight_version, update_weights) and its abort semantics: an aborted or
pause-aborted request returns ``finish_reason="abort"`` with the tokens
"generated" so far. Latency is simulated per request and per token; the tokens
come from ``output_fn`` (default: a fixed token repeated). Every request it
receives is recorded, so tests can check exactly which ids were sent.

Use it in-process or as a Ray actor (``ray.remote(FakeEngine)``); for Ray, read
the record with ``await handle.received_requests.remote()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from roll_async.engine.zmq_engine_client import ServesRequestsOverZmq
from roll_async.errors import InvalidInputError, RollAsyncError
from roll_async.trajectory import GenerationRequest, GenerationResult

OutputFn = Callable[[GenerationRequest], list[int]]


class FakeEngineError(RollAsyncError, RuntimeError):
    """An injected failure (``fail_requests``)."""


@dataclass
class _InFlight:
    request: GenerationRequest
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


class FakeEngine(ServesRequestsOverZmq):
    """A fake engine: deterministic tokens after a configurable delay.

    Args:
        output_fn: request -> token ids to "generate" (cut to ``max_tokens``);
            default ``[default_token_id] * tokens_per_request``.
        latency_s: delay before the first token of every request.
        token_latency_s: delay per token (makes partial output on abort observable).
        latency_fn: request -> extra delay, for per-request latencies.
        logprob: the logprob reported for every token.
        fail_requests: the first N generate calls raise FakeEngineError.
        error_requests: the first N generate calls (after any that raise) end with vLLM's retryable
            ``error`` finish reason after half their tokens.
        weight_version: initial weight version. Each token is tagged with the version current when it
            was "generated" (``token_versions``), so an update during a ``keep`` pause shows as two versions.
    """

    def __init__(
        self,
        output_fn: OutputFn | None = None,
        *,
        tokens_per_request: int = 4,
        default_token_id: int = 5,
        latency_s: float = 0.0,
        token_latency_s: float = 0.0,
        latency_fn: Callable[[GenerationRequest], float] | None = None,
        logprob: float = -0.5,
        fail_requests: int = 0,
        error_requests: int = 0,
        weight_version: int = 0,
    ) -> None:
        self._output_fn = output_fn or (
            lambda request: [default_token_id] * tokens_per_request
        )
        self.latency_s = latency_s
        self.token_latency_s = token_latency_s
        self._latency_fn = latency_fn
        self.logprob = logprob
        self._fail_remaining = fail_requests
        self._error_remaining = error_requests
        self.weight_version = weight_version
        self.requests: list[GenerationRequest] = []
        self.aborted_request_ids: list[str] = []
        self._in_flight: dict[str, _InFlight] = {}
        self._pause_mode: str | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._waiting = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0

    # -- test helpers ------------------------------------------------------------------

    @property
    def prompts(self) -> list[list[int]]:
        return [list(r.prompt_token_ids) for r in self.requests]

    async def received_requests(self) -> list[GenerationRequest]:
        return list(self.requests)

    def fail_next(self, count: int) -> None:
        self._fail_remaining = count

    def error_next(self, count: int) -> None:
        """The next ``count`` generate calls end with finish reason ``error`` after half their tokens."""
        self._error_remaining = count

    # -- engine API --------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        if self._fail_remaining > 0:
            self._fail_remaining -= 1
            raise FakeEngineError(f"injected failure for request {request.request_id}")
        await self._wait_until_resumed()
        planned = list(self._output_fn(request))
        tokens = planned[: request.max_tokens]
        errored = self._error_remaining > 0
        if errored:
            self._error_remaining -= 1
            tokens = tokens[: len(tokens) // 2]
        state = _InFlight(request)
        self._in_flight[request.request_id] = state
        produced: list[int] = []
        versions: list[int] = []
        try:
            delay = self.latency_s + (
                self._latency_fn(request) if self._latency_fn else 0.0
            )
            if await self._sleep_unless_aborted(state, delay):
                for token in tokens:
                    if not await self._sleep_unless_aborted(
                        state, self.token_latency_s
                    ):
                        break
                    produced.append(token)
                    versions.append(self.weight_version)
        finally:
            self._in_flight.pop(request.request_id, None)
        if errored:
            finish = "error"
        elif state.aborted.is_set() and len(produced) < len(tokens):
            finish = "abort"
        elif len(planned) > request.max_tokens:
            finish = "length"
        else:
            finish = "stop"
        self._prompt_tokens += len(request.prompt_token_ids)
        self._generation_tokens += len(produced)
        return GenerationResult(
            request_id=request.request_id,
            output_token_ids=produced,
            logprobs=[self.logprob] * len(produced),
            finish_reason=finish,  # type: ignore[arg-type]
            weight_version=versions[-1] if versions else self.weight_version,
            num_prompt_tokens=len(request.prompt_token_ids),
            token_versions=versions,
        )

    async def _wait_until_resumed(self) -> None:
        if not self._resumed.is_set():
            self._waiting += 1
            try:
                await self._resumed.wait()
            finally:
                self._waiting -= 1

    async def _sleep_unless_aborted(self, state: _InFlight, seconds: float) -> bool:
        """Sleep (frozen while paused in 'keep' mode); False if the request was aborted meanwhile."""
        if state.aborted.is_set():
            return False
        if seconds > 0:
            try:
                await asyncio.wait_for(state.aborted.wait(), timeout=seconds)
                return False
            except TimeoutError:
                pass
        if self._pause_mode == "keep":
            await self._resumed.wait()
        return not state.aborted.is_set()

    async def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            state = self._in_flight.get(request_id)
            if state is not None:
                self.aborted_request_ids.append(request_id)
                state.aborted.set()

    async def pause(self, mode: str = "abort") -> None:
        """abort: in-flight requests return now; wait: let them finish; keep: freeze them. New ones wait."""
        if mode not in ("abort", "wait", "keep"):
            raise InvalidInputError(
                f"pause mode {mode!r} is unknown; use abort, wait or keep"
            )
        self._pause_mode = mode
        self._resumed.clear()
        if mode == "abort":
            await self.abort(list(self._in_flight))
        elif mode == "wait":
            while self._in_flight:
                await asyncio.sleep(0.001)

    async def resume(self) -> None:
        self._pause_mode = None
        self._resumed.set()

    async def stats(self) -> dict[str, Any]:
        return {
            "running": len(self._in_flight),
            "waiting": self._waiting,
            "in_flight": len(self._in_flight),
            "kv_cache_usage": 0.0,
            "prompt_tokens": self._prompt_tokens,
            "generation_tokens": self._generation_tokens,
            "weight_version": self.weight_version,
        }

    async def get_weight_version(self) -> int:
        return self.weight_version

    async def advance_weight_version(self, version: int) -> None:
        """Record ``version`` without weights (the simulated trainer)."""
        self.weight_version = version

    async def update_weights(self, weights: object, version: int) -> float:
        self.weight_version = version
        return 0.0
