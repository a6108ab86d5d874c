"""vLLM's start-up options for one engine: the dtype it runs in and its AsyncEngineArgs.

What an engine is started with is decided before any engine process exists, and
preflight asks the same question (can this CPU run the configured dtype?) before
any actor starts; keeping the dtype decision and the EngineConfig-to-vLLM
translation here lets both ask it without the engine wrapper (roll_async.engine.vllm_engine)
and keeps that wrapper about running an engine, not configuring one.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from roll_async.config.schema import EngineConfig
from roll_async.engine import process_deaths
from roll_async.engine.cpu_bf16_probe import cpu_bf16_probe
from roll_async.engine.lora_adapters import LoraServing
from roll_async.errors import ConfigError, EngineStartupError

# vLLM is imported inside the functions that use it: importing vLLM is slow.

logger = logging.getLogger(__name__)

#: vLLM ``logprobs_mode``: logprobs after temperature / top-k / top-p (see roll_async.sampling).
BEHAVIOUR_LOGPROBS_MODE = "processed_logprobs"
GiB = 1 << 30


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    cpu: bool = current_platform.is_cpu()
    return cpu


def engine_dtype(dtype: str, key: str = "engine.dtype") -> str:
    """The dtype vLLM gets for the engine configured at ``key``: the one place that decides it.

    On vLLM's CPU backend ``auto`` means bfloat16, whose kernels some CPUs list
    but cannot run (an Intel Xeon VM with AMX: SIGILL in the engine's worker at
    start-up). There :func:`cpu_bf16_probe` (a child process, once per process)
    decides: ``auto`` becomes float32 with one warning, an explicit ``bfloat16``
    is a ConfigError naming ``<key>=float32``. Any other dtype or device: unchanged.
    """
    if dtype not in ("auto", "bfloat16") or not is_cpu_platform():
        return dtype
    probe = cpu_bf16_probe()
    if probe.usable:
        return dtype
    if dtype == "bfloat16":
        raise ConfigError(
            f"{key}=bfloat16: this CPU cannot run vLLM's bfloat16 kernels ({probe.detail}); "
            f"set {key}=float32"
        )
    _warn_float32_once(key, probe.detail)
    return "float32"


@functools.cache
def _warn_float32_once(key: str, detail: str) -> None:
    logger.warning(
        "%s=auto runs the engine in float32: this CPU cannot run vLLM's bfloat16 kernels (%s); "
        "set %s=float32 to say so in the config",
        key,
        detail,
        key,
    )


def build_engine_args(
    model_path: str, config: EngineConfig, lora: LoraServing | None = None
) -> Any:
    """Translate EngineConfig into vLLM's AsyncEngineArgs, naming any option vLLM rejects.

    ``lora``: serve the run's LoRA adapters (trainer.lora.sync=adapter; roll_async.engine.lora_adapters).
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    kwargs: dict[str, Any] = dict(
        model=model_path,
        dtype=engine_dtype(config.dtype),
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        enable_prefix_caching=config.enable_prefix_caching,
        enforce_eager=config.enforce_eager,
        tensor_parallel_size=config.tensor_parallel_size,
        seed=config.seed,
        disable_log_stats=False,  # our stat logger needs the scheduler stats
        worker_extension_cls="roll_async.engine.worker_extension.WeightSyncExtension",
        # Behaviour logprobs of the distribution that sampled (temperature, top-k, top-p applied and
        # renormalised), the one the trainer scores under (roll_async.sampling); vLLM's default is raw.
        logprobs_mode=BEHAVIOUR_LOGPROBS_MODE,
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
        kwargs["max_num_batched_tokens"] = max(
            config.max_num_batched_tokens or 0, config.max_model_len
        )
        # vLLM's multiprocess executor (what the CPU backend uses) that records a worker's death by a
        # signal, so a failed start names it (process_deaths) instead of "EngineCore encountered an issue".
        kwargs["distributed_executor_backend"] = process_deaths.RECORDING_EXECUTOR
    else:
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
    if lora is not None:
        kwargs.update(lora.engine_kwargs())
    for key, value in config.engine_kwargs.items():
        kwargs[key] = value
    try:
        return AsyncEngineArgs(**kwargs)
    except TypeError as exc:
        raise EngineStartupError(
            f"engine option rejected by vLLM: {exc}. Check engine.engine_kwargs "
            f"({sorted(config.engine_kwargs)}) against vllm.AsyncEngineArgs"
        ) from None
