"""VLLMEngine: one vLLM ``AsyncLLM`` behind a small token-in/token-out API.

The rollout needs exact token ids and behaviour logprobs, pausing for weight
syncs and in-place weight updates, whether the engine runs inside a Ray actor or
in-process (tests, benchmarks); this wraps vLLM's async engine in exactly that:
generate, abort, pause/resume, update_weights, stats, shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roll_async.config.schema import EngineConfig
from roll_async.engine import process_deaths
from roll_async.engine.engine_args import build_engine_args, is_cpu_platform
from roll_async.engine.engine_outputs import (
    engine_finish_reason,
    sampled_logprobs,
    versions_per_token,
)
from roll_async.engine.lora_adapters import AdapterVersions, LoraServing
from roll_async.engine.weight_transport import resolve_bucket
from roll_async.engine.zmq_engine_client import ServesRequestsOverZmq
from roll_async.errors import (
    ConfigError,
    EngineStartupError,
    InvalidInputError,
    InvalidTypeError,
    LifecycleError,
    WeightSyncError,
)
from roll_async.prompts.images import input_only_logit_bias, model_is_vision_language
from roll_async.runtime import node_files
from roll_async.trajectory import GenerationRequest, GenerationResult

# vLLM and safetensors are imported inside the functions that use them: importing vLLM is slow,
# and this module is imported where no engine starts.

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "wait", "keep")


@dataclass
class _SchedulerSnapshot:
    """The latest scheduler numbers, and counts per engine step (what tokens/s is made of).

    tokens/s = steps/s x tokens per step: a rollout that batches well but whose steps are slow
    (CPU taken by other processes on the engine's cores) is told apart from one that starves
    the engine of requests (few tokens per step).
    """

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    steps: int = 0
    step_generation_tokens: int = 0
    step_prompt_tokens: int = 0
    step_running_sum: int = 0


def _stat_logger_factory(snapshot: _SchedulerSnapshot) -> type[Any]:
    """A vLLM stat logger that keeps only the latest scheduler numbers (no console spam)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _LatestSchedulerStats(StatLoggerBase):  # type: ignore[misc]  # vllm is not followed (pyproject [tool.mypy]): its classes are Any
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            # one per engine step whose outputs reached this front-end
            if iteration_stats is not None:
                snapshot.steps += 1
                snapshot.step_generation_tokens += iteration_stats.num_generation_tokens
                snapshot.step_prompt_tokens += iteration_stats.num_prompt_tokens
            if scheduler_stats is not None:
                snapshot.step_running_sum += scheduler_stats.num_running_reqs
                snapshot.running = scheduler_stats.num_running_reqs
                snapshot.waiting = scheduler_stats.num_waiting_reqs
                snapshot.kv_cache_usage = scheduler_stats.kv_cache_usage

        def log_engine_initialized(self) -> None:
            pass

    return _LatestSchedulerStats


@functools.cache
def supports_flat_logprobs() -> bool:
    """``SamplingParams(flat_logprobs=...)`` exists from vLLM 0.12 on; an older vLLM lacks it."""
    from vllm import SamplingParams

    return "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ())


class VLLMEngine(ServesRequestsOverZmq):
    """Owns one AsyncLLM. Construction is cheap; :meth:`start` loads the model."""

    def __init__(
        self,
        model_path: str,
        config: EngineConfig | None = None,
        lora: LoraServing | None = None,
    ) -> None:
        self.model_path = model_path
        self.config = config or EngineConfig()
        self._lora = lora
        #: trainer.lora.sync=adapter: weight syncs bring adapter versions, served as vLLM LoRA requests.
        self._adapters: AdapterVersions | None = None
        self._llm: Any = None
        self._weight_version = 0
        self._snapshot = _SchedulerSnapshot()
        self._prompt_tokens = 0
        #: Prompt tokens served from the prefix cache (vLLM's per-request num_cached_tokens), summed.
        self._prefix_cache_hit_tokens = 0
        self._generation_tokens = 0
        self._finished_requests = 0
        self._in_flight: set[str] = set()
        self._max_model_len = self.config.max_model_len
        self._info: dict[str, Any] = {}
        self._images_received = 0
        #: A VL model's image token gets -100 logit bias (never sampled); logprobs stay raw, as the trainer scores.
        self._input_only_bias: dict[int, float] | None = None
        self._recent_multimodal_prompts: collections.deque[tuple[str, list[int]]] = (
            collections.deque(maxlen=64)
        )

    # -- lifecycle -----------------------------------------------------------------

    def model_dir_on_node(self) -> bool:
        """Whether ``model.path`` can be read on this replica's node (else the driver ships the files to start)."""
        return node_files.path_is_on_this_node(self.model_path)

    def use_model_dir_on_node(
        self, model_files: Mapping[str, bytes] | None = None
    ) -> str:
        """The model directory this replica loads: ``model.path`` if its node has it, else the driver's
        shipped ``model_files`` written to a node-local cache (``node_files.local_dir``); raises if neither."""
        self.model_path = node_files.local_dir(self.model_path, model_files)
        if not node_files.path_is_on_this_node(self.model_path):
            raise EngineStartupError(
                f"model.path {self.model_path!r} does not exist on node {platform.node()!r} (this engine replica's "
                "node) and the driver had no files to ship: run `roll-async make-tiny-model`, set model.path to a "
                "local HF model directory on the driver, or put it on a filesystem every node shares"
            )
        return self.model_path

    async def start(
        self, model_files: Mapping[str, bytes] | None = None
    ) -> dict[str, Any]:
        """Build the AsyncLLM; returns facts about the running engine.

        ``model_files``: the model directory's files, given (by ``launch_engines``) only when this node lacks it.
        """
        from vllm.v1.engine.async_llm import AsyncLLM

        shipped = model_files is not None
        self.use_model_dir_on_node(model_files)
        try:
            args = build_engine_args(self.model_path, self.config, self._lora)
        except ConfigError as exc:  # engine.dtype=bfloat16 on a CPU that cannot run it
            raise EngineStartupError(str(exc)) from None
        if self._lora is not None:
            self._adapters = AdapterVersions(self._lora)
        started_at = time.time()
        try:
            self._llm = AsyncLLM.from_engine_args(
                args, stat_loggers=[_stat_logger_factory(self._snapshot)]
            )
        except Exception as exc:
            self._raise_if_a_process_died(started_at, args.dtype)
            # vLLM raises many types for bad options; name them all the same way
            raise EngineStartupError(
                f"vLLM could not start model {self.model_path!r} with engine options "
                f"dtype={self.config.dtype}, max_model_len={self.config.max_model_len}, "
                f"max_num_seqs={self.config.max_num_seqs}, engine_kwargs={dict(self.config.engine_kwargs)}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._max_model_len = self._llm.model_config.max_model_len
        try:
            # vLLM labels every engine step's tokens with this version (per-token truth, see generate).
            await self._llm.update_weight_version(str(self._weight_version))
            self._input_only_bias = input_only_logit_bias(self.model_path) or None
            # the first model steps: where a worker whose kernel the CPU cannot run dies
            await self._warm_up()
        except Exception:
            self._raise_if_a_process_died(started_at, args.dtype)
            raise
        self._info = {
            "model": self.model_path,
            "model_files_shipped": shipped,
            "max_model_len": self._max_model_len,
            "device": "cpu" if is_cpu_platform() else "cuda",
            "pid": os.getpid(),
            "lora": self._lora is not None,
        }
        return self._info

    def _raise_if_a_process_died(self, since: float, dtype: str) -> None:
        """A failed start whose worker or EngineCore died by a signal: raise naming the signal and its cause.

        Workers are reaped by the EngineCore process, which records their deaths
        (roll_async.engine.exit_recording_executor); the EngineCore is this process's child.
        """
        deaths = process_deaths.deaths_since(os.getpid(), since)
        process_deaths.forget_deaths(os.getpid())
        manager = getattr(
            getattr(getattr(self._llm, "engine_core", None), "resources", None),
            "engine_manager",
            None,
        )
        finished = manager.finished_procs() if manager is not None else {}
        for name, exitcode in finished.items():
            text = process_deaths.describe_exit(f"engine process {name}", exitcode)
            if text is not None:
                deaths.append(text)
        if deaths:
            raise EngineStartupError(
                f"engine for model {self.model_path!r} (dtype={dtype}) failed to start: {deaths[0]}"
            ) from None

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
                TokensPrompt(prompt_token_ids=[1, 2, 3, 4]),
                params,
                request_id=f"roll_async-warmup-{index}",
            ):
                pass

        for batch in (1, min(8, self.config.max_num_seqs)):
            await asyncio.gather(*(one(i) for i in range(batch)))

    async def shutdown(self) -> None:
        """Stop the engine core process; nothing of vLLM stays behind."""
        await self.close_call_socket()
        if self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()
        if self._adapters is not None:
            self._adapters.close()

    def _require_started(self) -> Any:
        if self._llm is None:
            raise LifecycleError(
                "engine is not started (call start()) or was shut down"
            )
        return self._llm

    # -- generation ----------------------------------------------------------------

    def _sampling_params(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # A few flat lists per request instead of a dict and a Logprob object per token, where vLLM has it.
        flat = {"flat_logprobs": True} if supports_flat_logprobs() else {}
        return SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k if request.top_k > 0 else 0,
            stop=list(request.stop) or None,
            seed=request.seed,
            logprobs=0 if request.logprobs else None,
            ignore_eos=request.ignore_eos,
            logit_bias=self._input_only_bias,
            include_stop_str_in_output=True,  # token ids and text must agree for token-in/token-out
            output_kind=RequestOutputKind.FINAL_ONLY,
            # Callers decode ids themselves (token-in/token-out), so vLLM's incremental detokenizer (every
            # token of every request, in the engine's front-end process) is only paid where stop strings need it.
            detokenize=bool(request.stop),
            **flat,
        )

    def _check_request(self, request: GenerationRequest) -> None:
        n_prompt = len(request.prompt_token_ids)
        if n_prompt == 0:
            raise InvalidInputError(
                f"request {request.request_id}: prompt_token_ids is empty"
            )
        if not isinstance(request.prompt_token_ids[0], int):
            raise InvalidTypeError(
                f"request {request.request_id}: prompt_token_ids must be a list of int token ids, got "
                f"{type(request.prompt_token_ids[0]).__name__} (pass tokenize output with return_dict=False)"
            )
        if request.max_tokens < 1:
            raise InvalidInputError(
                f"request {request.request_id}: max_tokens={request.max_tokens} must be >= 1"
            )
        if n_prompt + request.max_tokens > self._max_model_len:
            raise InvalidInputError(
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
        # With adapters: the newest adapter now; the request keeps it to the end, whatever syncs come.
        lora_request, adapter_version = (
            self._adapters.acquire(request.adapter_lag)
            if self._adapters is not None
            else (None, None)
        )
        start_version = self._weight_version
        try:
            prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
            if request.multi_modal_data:
                prompt["multi_modal_data"] = request.multi_modal_data
                self._images_received += sum(
                    len(items) for items in request.multi_modal_data.values()
                )
            async for output in llm.generate(
                prompt,
                params,
                request_id=request.request_id,
                lora_request=lora_request,
            ):
                final = output
        finally:
            self._in_flight.discard(request.request_id)
            if self._adapters is not None:
                self._adapters.release(adapter_version)
                await self._remove_unused_adapters(llm)
        version = self._weight_version
        if self._adapters is not None:
            # every token was sampled with the adapter the request started on (the base before the first)
            version = adapter_version if adapter_version is not None else start_version
        if final is None or not final.outputs:
            return GenerationResult(
                request.request_id,
                [],
                [],
                "abort",
                version,
                "",
                len(request.prompt_token_ids),
            )
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = (
            sampled_logprobs(completion.logprobs, token_ids) if request.logprobs else []
        )
        finish = engine_finish_reason(completion.finish_reason)
        if finish == "error":
            logger.warning(
                "request %s ended with vLLM's retryable 'error' finish reason",
                request.request_id,
            )
        token_versions = (
            [version] * len(token_ids)
            if self._adapters is not None
            else versions_per_token(completion.weight_versions, len(token_ids), version)
        )
        self._prompt_tokens += len(request.prompt_token_ids)
        self._prefix_cache_hit_tokens += int(final.num_cached_tokens or 0)
        self._generation_tokens += len(token_ids)
        self._finished_requests += 1
        # With images vLLM expands each image token; its prompt is the one the model saw.
        engine_prompt = list(final.prompt_token_ids or request.prompt_token_ids)
        if request.multi_modal_data:
            self._recent_multimodal_prompts.append((request.request_id, engine_prompt))
        return GenerationResult(
            request_id=request.request_id,
            output_token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            weight_version=token_versions[-1] if token_versions else version,
            text=completion.text,
            num_prompt_tokens=len(engine_prompt),
            token_versions=token_versions,
        )

    def recent_multimodal_prompts(self) -> list[tuple[str, list[int]]]:
        """(request id, prompt ids after vLLM's image expansion) of the last multimodal requests, newest last."""
        return list(self._recent_multimodal_prompts)

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in-flight requests; their generate calls return finish_reason 'abort'."""
        llm = self._require_started()
        live = [rid for rid in request_ids if rid in self._in_flight]
        if live:
            await llm.abort(live)

    async def pause(self, mode: str = "abort") -> None:
        """Stop scheduling. abort: in-flight requests end now; wait: let them finish; keep: freeze them."""
        if mode not in PAUSE_MODES:
            raise InvalidInputError(
                f"pause mode {mode!r} is unknown; use one of {PAUSE_MODES}"
            )
        llm = self._require_started()
        # Keep the prefix cache on pause; update_weights resets it when weights really change.
        await llm.pause_generation(mode=mode, clear_cache=False)

    async def resume(self) -> None:
        await self._require_started().resume_generation()

    async def is_paused(self) -> bool:
        paused: bool = await self._require_started().is_paused()
        return paused

    # -- weights -------------------------------------------------------------------

    async def update_weights(
        self, weights: dict[str, Any] | bytes | list[Any], version: int
    ) -> float:
        """Load new weights in place (no restart), drop every KV block of the old weights, record ``version``.

        ``weights`` is a name→tensor dict in HF checkpoint naming, safetensors bytes, or a list of
        safetensors buckets (bytes or object refs; ``roll_async.engine.weight_transport``), loaded in order.
        Callers pause first when no request may see a mix of old and new weights.
        Returns the seconds spent.

        No prefix computed under old weights is reused, in any pause mode: the prefix cache
        is reset with ``reset_running_requests=True``, which also preempts requests frozen
        by ``pause("keep")`` (vLLM's plain reset silently does nothing while they hold
        blocks); they keep their tokens and recompute their KV under the new weights on
        resume. vLLM's own weight-version label is set before resume, so every token
        sampled afterwards is tagged ``version`` (``GenerationResult.token_versions``).
        """
        llm = self._require_started()
        if version < self._weight_version:
            raise InvalidInputError(
                f"update_weights version={version} is older than the engine's version {self._weight_version}"
            )
        start = time.perf_counter()
        if self._adapters is not None:
            await self._load_adapter(llm, weights, version)
            return time.perf_counter() - start
        if isinstance(
            weights, list
        ):  # buckets (bytes or object refs, roll_async.engine.weight_transport)
            buckets = [bytes(await resolve_bucket(bucket)) for bucket in weights]
            await llm.collective_rpc("roll_async_load_weights", args=(buckets,))
        else:
            payload = (
                weights
                if isinstance(weights, (bytes, bytearray))
                else _to_safetensors_bytes(weights)
            )
            await llm.collective_rpc("roll_async_load_weights", args=(bytes(payload),))
        await self._enter_version(llm, version)
        return time.perf_counter() - start

    async def _load_adapter(
        self, llm: Any, weights: dict[str, Any] | bytes | list[Any], version: int
    ) -> None:
        """trainer.lora.sync=adapter: ``weights`` is the adapter; new requests use it, running ones keep theirs.

        The base weights do not change, so no KV is dropped (vLLM keys cached blocks by adapter).
        """
        from safetensors.torch import load

        assert self._adapters is not None
        if isinstance(weights, list):
            blobs = [bytes(await resolve_bucket(bucket)) for bucket in weights]
        elif isinstance(weights, (bytes, bytearray)):
            blobs = [bytes(weights)]
        else:
            blobs = [_to_safetensors_bytes(weights)]
        tensors: dict[str, Any] = {}
        for blob in blobs:
            tensors.update(load(blob))
        request = self._adapters.write(version, tensors)
        await llm.add_lora(request)
        await llm.update_weight_version(str(version))
        self._weight_version = version
        await self._remove_unused_adapters(llm)

    async def _remove_unused_adapters(self, llm: Any) -> None:
        """Unload adapter versions older than the newest max_loras that no request in flight uses."""
        assert self._adapters is not None
        for request in self._adapters.removable():
            await llm.remove_lora(request.lora_int_id)

    async def _enter_version(self, llm: Any, version: int) -> None:
        """Label every later engine step ``version`` and drop all KV (and image embeddings) of older weights."""
        await llm.update_weight_version(str(version))
        if not await llm.reset_prefix_cache(reset_running_requests=True):
            raise WeightSyncError(
                f"vLLM could not reset its prefix cache after the update to version {version}; "
                "KV computed under the old weights would be reused"
            )
        if model_is_vision_language(self.model_path):
            # Image embeddings of the old vision tower must not be reused; this also keeps vLLM's
            # scheduler-side and worker-side encoder caches in step (a miss kills the engine).
            await llm.reset_encoder_cache()
        self._weight_version = version

    def get_weight_version(self) -> int:
        return self._weight_version

    async def advance_weight_version(self, version: int) -> None:
        """Record ``version`` without loading weights (trainer.simulate_step_s: no model is trained).

        The prefix cache is reset and tokens are labelled as after a real update, so a simulated run pays the
        same recomputation and its per-token versions tell the same story.
        """
        llm = self._require_started()
        if version < self._weight_version:
            raise InvalidInputError(
                f"advance_weight_version version={version} is older than the engine's {self._weight_version}"
            )
        await self._enter_version(llm, version)

    # -- observability -------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "running": self._snapshot.running,
            "waiting": self._snapshot.waiting,
            "kv_cache_usage": self._snapshot.kv_cache_usage,
            # cumulative per-step counts (see _SchedulerSnapshot): differences over a window give
            # steps/s, generated tokens per step and requests running per step
            "engine_steps": self._snapshot.steps,
            "engine_step_generation_tokens": self._snapshot.step_generation_tokens,
            "engine_step_prompt_tokens": self._snapshot.step_prompt_tokens,
            "engine_step_running_sum": self._snapshot.step_running_sum,
            "in_flight": len(self._in_flight),
            "prompt_tokens": self._prompt_tokens,
            "prefix_cache_hit_tokens": self._prefix_cache_hit_tokens,
            "generation_tokens": self._generation_tokens,
            "finished_requests": self._finished_requests,
            "weight_version": self._weight_version,
            "images_received": self._images_received,
            "lora_versions_loaded": len(self._adapters.loaded_versions())
            if self._adapters is not None
            else 0,
        }

    def lora_versions(self) -> list[int]:
        """The adapter versions this replica has loaded, oldest first ([] without LoRA serving)."""
        return self._adapters.loaded_versions() if self._adapters is not None else []

    def ready(self) -> bool:
        return self._llm is not None


def _to_safetensors_bytes(weights: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    tensors = {
        name: tensor.detach().to("cpu").contiguous() for name, tensor in weights.items()
    }
    return save(tensors)
