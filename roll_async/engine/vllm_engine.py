"""VLLMEngine: one vLLM ``AsyncLLM`` behind a small token-in/token-out API.

It runs inside a Ray actor (see ``engine_actor.py``) or in-process (tests,
benchmarks). Every EnvManager calls ``generate`` concurrently; vLLM's continuous
batching does the rest. The API is the one DESIGN.md fixes: generate, abort,
pause/resume, update_weights, stats, shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from roll_async.config import EngineConfig
from roll_async.protocol import GenerationRequest, GenerationResult

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "wait", "keep")
GiB = 1 << 30


class EngineStartupError(RuntimeError):
    """The engine could not start; the message names the option or path and the fix."""


@dataclass
class _SchedulerSnapshot:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0


def _stat_logger_factory(snapshot: _SchedulerSnapshot):
    """A vLLM stat logger that keeps only the latest scheduler numbers (no console spam)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _LatestSchedulerStats(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                snapshot.running = scheduler_stats.num_running_reqs
                snapshot.waiting = scheduler_stats.num_waiting_reqs
                snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage

        def log_engine_initialized(self) -> None:
            pass

    return _LatestSchedulerStats


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def build_engine_args(model_path: str, config: EngineConfig) -> Any:
    """Translate EngineConfig into vLLM's AsyncEngineArgs, naming any option vLLM rejects."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs: dict[str, Any] = dict(
        model=model_path,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        enable_prefix_caching=config.enable_prefix_caching,
        enforce_eager=config.enforce_eager,
        tensor_parallel_size=config.tensor_parallel_size,
        seed=config.seed,
        disable_log_stats=False,  # our stat logger needs the scheduler stats
        worker_extension_cls="roll_async.engine.worker_extension.WeightSyncExtension",
    )
    if config.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = config.max_num_batched_tokens
    if is_cpu_platform():
        # On CPU gpu_memory_utilization is a fraction of host RAM that must be free at start;
        # a fixed KV-cache size is predictable instead.
        kwargs["kv_cache_memory_bytes"] = int(config.cpu_kv_cache_space_gib * GiB)
        # vLLM rewinds a seeded request's generator when a chunked prefill discards its sample,
        # which CPU generators cannot do ("CPU Generator does not use offset") and which kills
        # the engine. Whole-prompt prefills avoid it; each step then must fit one full prompt.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(config.max_num_batched_tokens or 0, config.max_model_len)
    else:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
    for key, value in config.engine_kwargs.items():
        kwargs[key] = value
    try:
        return AsyncEngineArgs(**kwargs)
    except TypeError as exc:
        raise EngineStartupError(
            f"engine option rejected by vLLM: {exc}. Check engine.engine_kwargs "
            f"({sorted(config.engine_kwargs)}) against vllm.AsyncEngineArgs"
        ) from None


class VLLMEngine:
    """Owns one AsyncLLM. Construction is cheap; :meth:`start` loads the model."""

    def __init__(self, model_path: str, config: EngineConfig | None = None) -> None:
        self.model_path = model_path
        self.config = config or EngineConfig()
        self._llm: Any = None
        self._weight_version = 0
        self._snapshot = _SchedulerSnapshot()
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished_requests = 0
        self._in_flight: set[str] = set()
        self._max_model_len = self.config.max_model_len
        self._info: dict[str, Any] = {}

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> dict[str, Any]:
        """Build the AsyncLLM; returns facts about the running engine."""
        from vllm.v1.engine.async_llm import AsyncLLM

        if not os.path.exists(self.model_path) and self.model_path.startswith(("/", ".", "~")):
            raise EngineStartupError(
                f"model path {self.model_path!r} does not exist; run `roll-async make-tiny-model` "
                "or set model.path to a local HF model directory"
            )
        args = build_engine_args(self.model_path, self.config)
        try:
            self._llm = AsyncLLM.from_engine_args(
                args, stat_loggers=[_stat_logger_factory(self._snapshot)]
            )
        except Exception as exc:  # vLLM raises many types for bad options; name them all the same way
            raise EngineStartupError(
                f"vLLM could not start model {self.model_path!r} with engine options "
                f"dtype={self.config.dtype}, max_model_len={self.config.max_model_len}, "
                f"max_num_seqs={self.config.max_num_seqs}, engine_kwargs={dict(self.config.engine_kwargs)}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._max_model_len = self._llm.model_config.max_model_len
        await self._warm_up()
        self._info = {
            "model": self.model_path,
            "max_model_len": self._max_model_len,
            "device": "cpu" if is_cpu_platform() else "cuda",
            "pid": os.getpid(),
        }
        return self._info

    def info(self) -> dict[str, Any]:
        """What start() reported: model, max_model_len, device, pid of the process hosting the engine."""
        return dict(self._info)

    async def _warm_up(self) -> None:
        """Run a few throwaway requests so the first real batch does not pay kernel set-up costs."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=1.0)

        async def one(index: int) -> None:
            async for _ in self._llm.generate(
                TokensPrompt(prompt_token_ids=[1, 2, 3, 4]), params, request_id=f"roll_async-warmup-{index}"
            ):
                pass

        for batch in (1, min(8, self.config.max_num_seqs)):
            await asyncio.gather(*(one(i) for i in range(batch)))

    async def shutdown(self) -> None:
        """Stop the engine core process; nothing of vLLM stays behind."""
        if self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()

    def _require_started(self) -> Any:
        if self._llm is None:
            raise RuntimeError("engine is not started (call start()) or was shut down")
        return self._llm

    # -- generation ----------------------------------------------------------------

    def _sampling_params(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k if request.top_k > 0 else 0,
            stop=list(request.stop) or None,
            seed=request.seed,
            logprobs=0 if request.logprobs else None,
            ignore_eos=request.ignore_eos,
            include_stop_str_in_output=True,  # token ids and text must agree for token-in/token-out
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def _check_request(self, request: GenerationRequest) -> None:
        n_prompt = len(request.prompt_token_ids)
        if n_prompt == 0:
            raise ValueError(f"request {request.request_id}: prompt_token_ids is empty")
        if not isinstance(request.prompt_token_ids[0], int):
            raise TypeError(
                f"request {request.request_id}: prompt_token_ids must be a list of int token ids, got "
                f"{type(request.prompt_token_ids[0]).__name__} (pass tokenize output with return_dict=False)"
            )
        if request.max_tokens < 1:
            raise ValueError(f"request {request.request_id}: max_tokens={request.max_tokens} must be >= 1")
        if n_prompt + request.max_tokens > self._max_model_len:
            raise ValueError(
                f"request {request.request_id}: prompt of {n_prompt} tokens + max_tokens={request.max_tokens} "
                f"exceeds engine.max_model_len={self._max_model_len}; lower max_tokens "
                f"(at most {max(0, self._max_model_len - n_prompt)}) or raise engine.max_model_len"
            )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate for one prompt; returns ids, their logprobs, finish reason and weight version."""
        from vllm.inputs import TokensPrompt

        llm = self._require_started()
        self._check_request(request)
        params = self._sampling_params(request)
        final = None
        self._in_flight.add(request.request_id)
        try:
            async for output in llm.generate(
                TokensPrompt(prompt_token_ids=list(request.prompt_token_ids)),
                params,
                request_id=request.request_id,
            ):
                final = output
        finally:
            self._in_flight.discard(request.request_id)
        version = self._weight_version
        if final is None or not final.outputs:
            return GenerationResult(request.request_id, [], [], "abort", version, "", len(request.prompt_token_ids))
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = _sampled_logprobs(completion.logprobs, token_ids) if request.logprobs else []
        finish = completion.finish_reason or "abort"
        if finish not in ("stop", "length", "abort"):
            finish = "stop"
        self._prompt_tokens += len(request.prompt_token_ids)
        self._generation_tokens += len(token_ids)
        self._finished_requests += 1
        return GenerationResult(
            request_id=request.request_id,
            output_token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,  # type: ignore[arg-type]
            weight_version=version,
            text=completion.text,
            num_prompt_tokens=len(request.prompt_token_ids),
        )

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in-flight requests; their generate calls return finish_reason 'abort'."""
        llm = self._require_started()
        live = [rid for rid in request_ids if rid in self._in_flight]
        if live:
            await llm.abort(live)

    async def pause(self, mode: str = "abort") -> None:
        """Stop scheduling. abort: in-flight requests end now; wait: let them finish; keep: freeze them."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {mode!r} is unknown; use one of {PAUSE_MODES}")
        llm = self._require_started()
        # Keep the prefix cache on pause; update_weights resets it when weights really change.
        await llm.pause_generation(mode=mode, clear_cache=False)

    async def resume(self) -> None:
        await self._require_started().resume_generation()

    async def is_paused(self) -> bool:
        return await self._require_started().is_paused()

    # -- weights -------------------------------------------------------------------

    async def update_weights(self, weights: dict[str, Any] | bytes | list[Any], version: int) -> float:
        """Load new weights in place (no restart), reset the prefix cache, record ``version``.

        ``weights`` is a name→tensor dict in HF checkpoint naming, safetensors bytes, or a list of
        safetensors buckets (bytes or object refs; ``roll_async.engine.weight_transport``), loaded in order.
        Callers pause first when no request may see a mix of old and new weights.
        Returns the seconds spent.
        """
        llm = self._require_started()
        if version < self._weight_version:
            raise ValueError(
                f"update_weights version={version} is older than the engine's version {self._weight_version}"
            )
        start = time.perf_counter()
        if isinstance(weights, list):  # buckets (bytes or object refs, roll_async.engine.weight_transport)
            from roll_async.engine.weight_transport import resolve_bucket

            buckets = [bytes(await resolve_bucket(bucket)) for bucket in weights]
            await llm.collective_rpc("roll_async_load_weights", args=(buckets,))
        else:
            payload = weights if isinstance(weights, (bytes, bytearray)) else _to_safetensors_bytes(weights)
            await llm.collective_rpc("roll_async_load_weights", args=(bytes(payload),))
        await llm.reset_prefix_cache()
        self._weight_version = version
        return time.perf_counter() - start

    def get_weight_version(self) -> int:
        return self._weight_version

    async def advance_weight_version(self, version: int) -> None:
        """Record ``version`` without loading weights (trainer.simulate_step_s: no model is trained).

        The prefix cache is reset as a real update resets it, so a simulated run pays the same recomputation.
        """
        llm = self._require_started()
        if version < self._weight_version:
            raise ValueError(f"advance_weight_version version={version} is older than the engine's {self._weight_version}")
        await llm.reset_prefix_cache()
        self._weight_version = version

    # -- observability -------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "running": self._snapshot.running,
            "waiting": self._snapshot.waiting,
            "kv_cache_usage": self._snapshot.kv_cache_usage,
            "in_flight": len(self._in_flight),
            "prompt_tokens": self._prompt_tokens,
            "generation_tokens": self._generation_tokens,
            "finished_requests": self._finished_requests,
            "weight_version": self._weight_version,
        }

    def ready(self) -> bool:
        return self._llm is not None


def _sampled_logprobs(entries: Any, token_ids: list[int]) -> list[float]:
    """vLLM returns one {token_id: Logprob} map per position; keep the sampled token's value."""
    if entries is None:
        return [0.0] * len(token_ids)
    values: list[float] = []
    for position, token_id in enumerate(token_ids):
        entry = entries[position]
        values.append(float(entry[token_id].logprob))
    return values


def _to_safetensors_bytes(weights: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in weights.items()}
    return save(tensors)

