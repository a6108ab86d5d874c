"""The rules a loaded config must meet beyond its types: fixed word sets, ranges, and rules between fields.

Every rule runs in :func:`validate_config` before any actor starts, so a mistake fails at load with the key
and the fix rather than inside a worker. Keys typed with a ``Literal`` are checked by one generic pass
(:func:`check_choices`) that reads the choices from the dataclasses' type hints.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from roll_async.config.dotted_paths import check_not_moved
from roll_async.config.sections import (
    CustomEnvConfig,
    EnvManagerConfig,
    PipelineConfig,
    TrainerConfig,
)
from roll_async.errors import ConfigError
from roll_async.sampling import SamplingSettings


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest of ``choices``, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def _spoken_list(words: typing.Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


@functools.cache
def _resolved_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_ABSENT = object()


def _value_of(values: Any, name: str) -> Any:
    if dataclasses.is_dataclass(values):
        return getattr(values, name, _ABSENT)
    if isinstance(values, Mapping):
        return values.get(name, _ABSENT)
    return _ABSENT  # a wrong type for a section: the loader reports it


def check_choices(cls: type, values: Any, prefix: str = "") -> None:
    """Every ``Literal``-typed key of dataclass ``cls`` found in ``values`` holds one of its choices.

    ``values`` is an instance of ``cls`` or a mapping of raw keys (a YAML file or the overrides, before
    OmegaConf sees them); nested sections and ``custom_envs.<Tag>`` entries are checked too. Interpolations
    (``${...}``) are left to the check of the loaded config.
    """
    hints = _resolved_hints(cls)
    for f in dataclasses.fields(cls):
        value = _value_of(values, f.name)
        if value is _ABSENT:
            continue
        hint, key = hints[f.name], prefix + f.name
        if typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            interpolation = isinstance(value, str) and value.startswith("${")
            if value not in choices and not interpolation:
                raise ConfigError(
                    f"{key}={value!r} is unknown; use {_spoken_list(choices)}."
                    f"{did_you_mean(str(value), choices)}"
                )
        elif dataclasses.is_dataclass(hint):
            check_choices(hint, value, key + ".")
        elif typing.get_origin(hint) is dict and isinstance(value, Mapping):
            entry_type = typing.get_args(hint)[1]
            if dataclasses.is_dataclass(entry_type):
                for name, entry in value.items():
                    check_choices(entry_type, entry, f"{key}.{name}.")


def _validate_env_manager(
    name: str, em: EnvManagerConfig, config: PipelineConfig, *, train: bool
) -> None:
    if em.num_env_groups == 0 and not train:
        return
    if em.num_env_groups < 1:
        raise ConfigError(
            f"{name}.num_env_groups={em.num_env_groups}: needs at least 1 group"
        )
    if em.group_size < 1:
        raise ConfigError(
            f"{name}.group_size={em.group_size}: needs at least 1 env per group"
        )
    if em.group_size_redundancy < 0:
        raise ConfigError(
            f"{name}.group_size_redundancy={em.group_size_redundancy}: must be >= 0"
        )
    if em.max_env_num_per_worker < 1:
        raise ConfigError(
            f"{name}.max_env_num_per_worker={em.max_env_num_per_worker}: must be >= 1"
        )
    if em.max_worker_restarts < 0:
        raise ConfigError(
            f"{name}.max_worker_restarts={em.max_worker_restarts}: must be >= 0"
        )
    if em.worker_gc_threshold < 0:
        raise ConfigError(
            f"{name}.worker_gc_threshold={em.worker_gc_threshold}: must be >= 0 (0 keeps Python's default)"
        )
    if em.env_step_timeout_s <= 0:
        raise ConfigError(
            f"{name}.env_step_timeout_s={em.env_step_timeout_s}: must be > 0 seconds"
        )
    if not em.tags:
        raise ConfigError(
            f"{name}.tags is empty; name at least one env tag from custom_envs "
            f"({', '.join(sorted(config.custom_envs)) or 'none defined'})"
        )
    for tag in em.tags:
        if tag not in config.custom_envs:
            raise ConfigError(
                f"{name}.tags names '{tag}', which is not defined under custom_envs.{did_you_mean(tag, list(config.custom_envs))} "
                f"Defined tags: {', '.join(sorted(config.custom_envs)) or '(none)'}; add custom_envs.{tag} or fix the tag"
            )
    if em.num_groups_partition:
        if len(em.num_groups_partition) != len(em.tags):
            raise ConfigError(
                f"{name}.num_groups_partition has {len(em.num_groups_partition)} entries but {name}.tags has "
                f"{len(em.tags)}; give one group count per tag"
            )
        if sum(em.num_groups_partition) != em.num_env_groups:
            raise ConfigError(
                f"{name}.num_groups_partition={list(em.num_groups_partition)} sums to {sum(em.num_groups_partition)}, "
                f"not {name}.num_env_groups={em.num_env_groups}; make them agree"
            )
        if any(n < 0 for n in em.num_groups_partition):
            raise ConfigError(
                f"{name}.num_groups_partition={list(em.num_groups_partition)}: counts must be >= 0"
            )
    elif em.num_env_groups < len(em.tags):
        raise ConfigError(
            f"{name}.num_env_groups={em.num_env_groups} is fewer than the {len(em.tags)} tags; "
            f"raise num_env_groups or set num_groups_partition"
        )


def validate_config(config: PipelineConfig) -> None:
    """Check every key with a fixed set of words, then every rule between fields; ConfigError names the key and the fix."""
    check_choices(PipelineConfig, config)
    if config.mode == "sync" and config.max_staleness is not None:
        raise ConfigError(
            f"max_staleness={config.max_staleness} only applies to mode=async; remove it or set mode=async"
        )
    if (
        config.mode == "async"
        and config.max_staleness is not None
        and config.max_staleness < 1
    ):
        raise ConfigError(
            f"max_staleness={config.max_staleness} with mode=async allows no overlap between rollout and training; "
            "use mode=sync for on-policy training, or max_staleness>=1"
        )
    if config.sequence_length < 2:
        raise ConfigError(
            f"sequence_length={config.sequence_length}: must be at least 2 tokens"
        )
    if config.sequence_length > config.engine.max_model_len:
        raise ConfigError(
            f"sequence_length={config.sequence_length} exceeds engine.max_model_len={config.engine.max_model_len}; "
            "lower sequence_length or raise engine.max_model_len"
        )
    if config.engine.num_replicas < 1:
        raise ConfigError(
            f"engine.num_replicas={config.engine.num_replicas}: must be >= 1"
        )
    if config.generation.max_retries < 0:
        raise ConfigError(
            f"generation.max_retries={config.generation.max_retries}: must be >= 0"
        )
    _validate_sampling(config)
    for tag, env in config.custom_envs.items():
        _validate_env_placement(tag, env)
        if env.max_steps < 1:
            raise ConfigError(
                f"custom_envs.{tag}.max_steps={env.max_steps}: must be >= 1"
            )
        if env.max_tokens_per_step < 1:
            raise ConfigError(
                f"custom_envs.{tag}.max_tokens_per_step={env.max_tokens_per_step}: must be >= 1"
            )
        if env.max_tokens_per_step >= config.sequence_length:
            raise ConfigError(
                f"custom_envs.{tag}.max_tokens_per_step={env.max_tokens_per_step} must be below "
                f"sequence_length={config.sequence_length}; lower it or raise sequence_length"
            )
        check_not_moved(env.env_type, f"custom_envs.{tag}.env_type")
        if env.agent:
            check_not_moved(env.agent, f"custom_envs.{tag}.agent")
        if env.reward is not None:
            env.reward.validate(tag)
            if env.reward.per_turn and env.agent:
                raise ConfigError(
                    f"custom_envs.{tag}.reward.per_turn=true needs env steps to score; an agent session "
                    "returns one reward at its end: set per_turn to false (the finished episode is scored)"
                )
        if (env.env_type == "agent") != bool(env.agent):
            raise ConfigError(
                f"custom_envs.{tag}: an agent session needs both env_type: agent and agent: pkg.module:function "
                f"(got env_type={env.env_type!r}, agent={env.agent!r})"
            )
    _validate_env_manager(
        "train_env_manager", config.train_env_manager, config, train=True
    )
    _validate_env_manager(
        "val_env_manager", config.val_env_manager, config, train=False
    )
    gs = config.train_env_manager.group_size
    if config.rollout_batch_size < 1 or config.rollout_batch_size % gs != 0:
        raise ConfigError(
            f"rollout_batch_size={config.rollout_batch_size} is not a positive multiple of "
            f"train_env_manager.group_size={gs}; use e.g. rollout_batch_size={max(1, config.rollout_batch_size // gs) * gs}"
        )
    if config.trainer.trainer_cls:
        check_not_moved(config.trainer.trainer_cls, "trainer.trainer_cls")
    _validate_training(config)
    if config.num_batches < 1:
        raise ConfigError(f"num_batches={config.num_batches}: must be >= 1")
    if (
        config.replay.from_dir is not None
        and not (Path(config.replay.from_dir) / "batches").is_dir()
    ):
        raise ConfigError(
            f"replay.from={config.replay.from_dir!r} has no batches/ directory; replay needs a run made with "
            "logging.save_batches=true"
        )


def _validate_sampling(config: PipelineConfig) -> None:
    """generation.* shape the sampling distribution; the engine must report logprobs of that distribution."""
    problem = SamplingSettings.from_generation(config.generation).problem()
    if problem:
        raise ConfigError(f"generation.{problem}")
    mode = config.engine.engine_kwargs.get("logprobs_mode")
    if mode is not None and mode != "processed_logprobs":
        raise ConfigError(
            f"engine.engine_kwargs.logprobs_mode={mode!r}: behaviour logprobs must be those of the sampling "
            "distribution the trainer scores under; remove the key (roll-async uses processed_logprobs)"
        )


def _validate_env_placement(tag: str, env: CustomEnvConfig) -> None:
    """isolation and service_url of one custom env (see roll_async.env_service)."""
    if env.service_url is None or env.service_url == "":
        return
    urls = [env.service_url] if isinstance(env.service_url, str) else env.service_url
    if not isinstance(urls, (list, tuple)) or not urls:
        raise ConfigError(
            f"custom_envs.{tag}.service_url={env.service_url!r}: give a URL or a list of URLs"
        )
    for url in urls:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"custom_envs.{tag}.service_url has {url!r}; write each as http://host:port "
                "(a roll-async env-server)"
            )
    if env.isolation != "none":
        raise ConfigError(
            f"custom_envs.{tag}: isolation='{env.isolation}' and service_url both set; the env server already runs "
            "each env in its own process (its --isolation flag): remove isolation"
        )
    if env.service_max_retries < 0:
        raise ConfigError(
            f"custom_envs.{tag}.service_max_retries={env.service_max_retries}: must be >= 0"
        )


def _validate_training(config: PipelineConfig) -> None:
    trainer = config.trainer
    if trainer.micro_batch_size < 1:
        raise ConfigError(
            f"trainer.micro_batch_size={trainer.micro_batch_size}: must be >= 1"
        )
    if trainer.max_tokens_per_micro_batch < 0:
        raise ConfigError(
            f"trainer.max_tokens_per_micro_batch={trainer.max_tokens_per_micro_batch}: must be >= 0 "
            "(0: trainer.micro_batch_size rows per pass)"
        )
    if 0 < trainer.max_tokens_per_micro_batch < config.sequence_length:
        raise ConfigError(
            f"trainer.max_tokens_per_micro_batch={trainer.max_tokens_per_micro_batch} is below "
            f"sequence_length={config.sequence_length}, the longest trajectory a rollout can produce, which would "
            "then fit in no micro-batch; raise it to at least sequence_length, or set it to 0 to micro-batch by "
            "trainer.micro_batch_size"
        )
    if trainer.lr <= 0:
        raise ConfigError(f"trainer.lr={trainer.lr}: must be > 0")
    if len(trainer.adam_betas) != 2:
        raise ConfigError(
            f"trainer.adam_betas={list(trainer.adam_betas)}: give two values, e.g. [0.9, 0.999]"
        )
    if trainer.max_token_lag < -1:
        raise ConfigError(
            f"trainer.max_token_lag={trainer.max_token_lag}: use -1 (off) or a lag >= 0 in versions"
        )
    if trainer.tis_cap < 0 or trainer.kl_coef < 0:
        raise ConfigError("trainer.tis_cap and trainer.kl_coef must be >= 0")
    if trainer.simulate_step_s < 0 or trainer.simulate_sync_s < 0:
        raise ConfigError(
            f"trainer.simulate_step_s={trainer.simulate_step_s} / simulate_sync_s={trainer.simulate_sync_s}: must be >= 0"
        )
    if trainer.simulate_step_s > 0 and (
        config.sft_warmup.enabled or trainer.trainer_cls
    ):
        raise ConfigError(
            "trainer.simulate_step_s > 0 simulates the trainer (no model); it cannot be combined with "
            "sft_warmup.enabled or trainer.trainer_cls: set simulate_step_s=0 or drop those"
        )
    _validate_trainer_placement(trainer)
    _validate_trainer_strategy(trainer)
    _validate_trainer_dtype(trainer)
    _validate_lora(trainer)
    if config.checkpoint.export_hf_interval < 0:
        raise ConfigError(
            f"checkpoint.export_hf_interval={config.checkpoint.export_hf_interval}: must be >= 0 (0: no export "
            "during the run)"
        )
    if config.weight_sync.interval < 1:
        raise ConfigError(
            f"weight_sync.interval={config.weight_sync.interval}: must be >= 1"
        )
    _validate_weight_sync_interval(config)
    if not 0.0 <= config.sft_warmup.demo_fraction <= 1.0:
        raise ConfigError(
            f"sft_warmup.demo_fraction={config.sft_warmup.demo_fraction}: must be within [0, 1]"
        )


#: Largest adapter rank vLLM serves (vllm.config.lora.MaxLoRARanks).
MAX_SERVED_LORA_RANK = 512


def _validate_lora(trainer: TrainerConfig) -> None:
    """trainer.lora: a positive alpha, no dropout, a rank vLLM can serve, the built-in trainer only."""
    lora = trainer.lora
    if lora.rank < 0:
        raise ConfigError(
            f"trainer.lora.rank={lora.rank}: must be >= 0 (0 turns LoRA off)"
        )
    if lora.rank == 0:
        return
    if lora.alpha <= 0:
        raise ConfigError(f"trainer.lora.alpha={lora.alpha}: must be > 0")
    if not 0.0 <= lora.dropout < 1.0:
        raise ConfigError(f"trainer.lora.dropout={lora.dropout}: must be within [0, 1)")
    if lora.dropout > 0:
        raise ConfigError(
            f"trainer.lora.dropout={lora.dropout}: the trainer switches dropout off so the PPO ratio and the "
            "importance weights compare the same policy (random masks would make them noise); set "
            "trainer.lora.dropout=0"
        )
    if not lora.target_modules:
        raise ConfigError(
            "trainer.lora.target_modules is empty; name the modules that get adapters, e.g. "
            "[q_proj, k_proj, v_proj, o_proj]"
        )
    if lora.sync == "adapter" and lora.rank > MAX_SERVED_LORA_RANK:
        raise ConfigError(
            f"trainer.lora.rank={lora.rank} with trainer.lora.sync=adapter: vLLM serves adapters of rank <= "
            f"{MAX_SERVED_LORA_RANK}; lower the rank or set trainer.lora.sync=merged"
        )
    if trainer.trainer_cls or trainer.simulate_step_s > 0:
        raise ConfigError(
            "trainer.lora.rank > 0 applies LoRA to the built-in trainer; it cannot be combined with "
            "trainer.trainer_cls or trainer.simulate_step_s > 0: set trainer.lora.rank=0 or drop those"
        )


def _validate_weight_sync_interval(config: PipelineConfig) -> None:
    """Sync mode promises on-policy rollouts; async mode's staleness bound counts weight versions."""
    interval = config.weight_sync.interval
    if interval > 1 and config.mode == "sync":
        raise ConfigError(
            f"weight_sync.interval={interval} with mode=sync: sync mode trains every batch on the weights that "
            "generated it, which needs a push after every step; set weight_sync.interval=1, or mode=async with "
            f"max_staleness>={interval - 1}"
        )
    if config.mode == "async" and interval - 1 > config.staleness_bound:
        raise ConfigError(
            f"weight_sync.interval={interval} with max_staleness={config.staleness_bound}: between pushes the "
            f"engines serve weights up to {interval - 1} versions behind the trainer, more than max_staleness "
            f"allows; raise max_staleness to >= {interval - 1} or lower weight_sync.interval"
        )


def _validate_trainer_dtype(trainer: TrainerConfig) -> None:
    """The built-in trainer keeps float32 master weights; low precision is its compute dtype (param_dtype)."""
    if trainer.trainer_cls or trainer.simulate_step_s > 0:
        return  # a custom trainer reads trainer.dtype its own way; the simulated one has no weights
    if trainer.dtype not in ("float32", "fp32"):
        raise ConfigError(pure_low_precision_message(trainer.dtype))


def pure_low_precision_message(dtype: str) -> str:
    """Why ``trainer.dtype`` other than float32 is refused, and the key to use instead."""
    return (
        f"trainer.dtype={dtype!r}: pure {dtype} AdamW keeps no float32 master weights, so updates smaller than "
        "the weights' precision vanish (at lr 1e-6 almost no weight changes); set trainer.dtype=float32 and "
        "trainer.param_dtype=bfloat16 to compute in bfloat16 with float32 weights"
    )


def _validate_trainer_strategy(trainer: TrainerConfig) -> None:
    """trainer.strategy / num_ranks / gpus_per_rank: ranks are for fsdp2, one process for single."""
    if trainer.num_ranks < 1:
        raise ConfigError(f"trainer.num_ranks={trainer.num_ranks}: must be >= 1")
    if trainer.gpus_per_rank < 0:
        raise ConfigError(
            f"trainer.gpus_per_rank={trainer.gpus_per_rank}: must be >= 0"
        )
    if trainer.rank_call_timeout_s < 0:
        raise ConfigError(
            f"trainer.rank_call_timeout_s={trainer.rank_call_timeout_s}: must be >= 0 seconds; set it above the "
            "slowest healthy train step or checkpoint, or 0 to wait on the ranks without a deadline"
        )
    if trainer.strategy == "single":
        if trainer.num_ranks > 1 or trainer.gpus_per_rank > 0:
            raise ConfigError(
                f"trainer.num_ranks={trainer.num_ranks} / gpus_per_rank={trainer.gpus_per_rank} need "
                "trainer.strategy=fsdp2 (single is one process; give it GPUs with placement=ray_actor and "
                "num_gpus)"
            )
        return
    if trainer.trainer_cls or trainer.simulate_step_s > 0:
        raise ConfigError(
            "trainer.strategy=fsdp2 shards the built-in GRPO trainer; it cannot be combined with "
            "trainer.trainer_cls or trainer.simulate_step_s > 0: set trainer.strategy=single"
        )
    if trainer.placement != "driver" or trainer.num_gpus > 0:
        raise ConfigError(
            "trainer.strategy=fsdp2 always runs its ranks as Ray actors: leave trainer.placement and "
            "trainer.num_gpus unset and give each rank GPUs with trainer.gpus_per_rank"
        )
    if trainer.lora.rank > 0 and trainer.lora.sync == "merged":
        raise ConfigError(
            "trainer.lora.sync=merged with trainer.strategy=fsdp2: the ranks sync the adapter alone (merging "
            "would gather the whole base model); set trainer.lora.sync=adapter, or trainer.strategy=single"
        )
    if trainer.gpus_per_rank not in (0, 1):
        raise ConfigError(
            f"trainer.gpus_per_rank={trainer.gpus_per_rank}: an fsdp2 rank drives one device; use 1 (one GPU "
            "per rank) or 0 (CPU ranks)"
        )
    if trainer.device.startswith("cuda") and trainer.gpus_per_rank == 0:
        raise ConfigError(
            f"trainer.device={trainer.device!r} with trainer.gpus_per_rank=0: Ray gives the ranks no GPU; set "
            "trainer.gpus_per_rank=1 or trainer.device=auto"
        )


def _validate_trainer_placement(trainer: TrainerConfig) -> None:
    """trainer.placement / num_gpus: only an actor gets GPUs from Ray, and a GPU device needs one."""
    if trainer.num_gpus < 0:
        raise ConfigError(f"trainer.num_gpus={trainer.num_gpus}: must be >= 0")
    if trainer.placement == "driver" and trainer.num_gpus > 0:
        raise ConfigError(
            f"trainer.num_gpus={trainer.num_gpus} needs trainer.placement=ray_actor (the driver process gets no GPU "
            "from Ray); set trainer.placement=ray_actor, or trainer.num_gpus=0 to train in the driver"
        )
    if trainer.placement == "ray_actor" and trainer.simulate_step_s > 0:
        raise ConfigError(
            "trainer.placement=ray_actor with trainer.simulate_step_s > 0: the simulated trainer loads no model and "
            "runs in the driver; set trainer.placement=driver"
        )
    if (
        trainer.placement == "ray_actor"
        and trainer.num_gpus == 0
        and trainer.device.startswith("cuda")
    ):
        raise ConfigError(
            f"trainer.device={trainer.device!r} with trainer.placement=ray_actor and trainer.num_gpus=0: Ray gives the "
            "actor no GPU; set trainer.num_gpus (e.g. 1) or trainer.device=auto"
        )
