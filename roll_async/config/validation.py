"""The rules a loaded config must meet that span fields or sections.

Every rule runs in :func:`validate_config` before any actor starts, so a mistake fails at load with the key
and the fix rather than inside a worker. A single key's rules (the words of a ``Literal`` key, a number's
limits declared with ``bounded`` beside the field) are checked first, all at once, by one generic pass
(roll_async.config.field_checks.check_fields); this module keeps only the rules between keys.
"""

from __future__ import annotations

from pathlib import Path

from roll_async.config.dotted_paths import check_not_moved
from roll_async.config.field_checks import check_fields, did_you_mean
from roll_async.config.seat_rules import (
    check_snapshots,
    trained_seats,
    validate_seats,
)
from roll_async.config.sections import (
    AGENT_WORKSPACE_ENV_TYPES,
    CustomEnvConfig,
    EnvManagerConfig,
    PipelineConfig,
    TrainerConfig,
)
from roll_async.errors import ConfigError
from roll_async.sampling import SamplingSettings


def _validate_env_manager(
    name: str, em: EnvManagerConfig, config: PipelineConfig, *, train: bool
) -> None:
    if em.num_env_groups == 0 and not train:
        return
    if em.num_env_groups < 1:
        # 0 switches validation off; the training side needs groups to roll out
        raise ConfigError(
            f"{name}.num_env_groups={em.num_env_groups}: needs at least 1 group"
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
    """Check every single key at once (words, limits), then every rule between keys; ConfigError names the key and the fix."""
    check_fields(PipelineConfig, config)
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
    if config.sequence_length > config.engine.max_model_len:
        raise ConfigError(
            f"sequence_length={config.sequence_length} exceeds engine.max_model_len={config.engine.max_model_len}; "
            "lower sequence_length or raise engine.max_model_len"
        )
    _validate_sampling(config)
    played = {*config.train_env_manager.tags, *config.val_env_manager.tags}
    for tag, env in config.custom_envs.items():
        _validate_env_placement(tag, env)
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
            if env.reward.per_turn and env.agent_function:
                raise ConfigError(
                    f"custom_envs.{tag}.reward.per_turn=true needs env steps to score; an agent session "
                    "returns one reward at its end: set per_turn to false (the finished episode is scored)"
                )
        validate_seats(
            tag,
            env.seats,
            agent=env.agent,
            service_url=env.service_url,
            isolation=env.isolation,
            has_reward=env.reward is not None,
        )
        if tag in played:  # a tag the run does not play needs no snapshot it reaches
            check_snapshots(
                tag,
                env.seats,
                pool_last_k=env.pool.last_k,
                versions_in_run=config.max_steps // config.weight_sync.interval,
            )
        if (env.env_type == "agent" and not env.agent) or (
            env.agent and env.env_type != "agent" and not env.drives_workspace
        ):
            raise ConfigError(
                f"custom_envs.{tag}: an agent session needs both env_type: agent and agent: pkg.module:function, "
                f"or an env whose workspace the agent drives (env_type: {' | '.join(AGENT_WORKSPACE_ENV_TYPES)}) "
                f"(got env_type={env.env_type!r}, agent={env.agent!r})"
            )
        if env.drives_workspace and (env.service_url or env.isolation == "process"):
            raise ConfigError(
                f"custom_envs.{tag}: an agent driving env_type: {env.env_type} uses the workspace in its worker; "
                "remove service_url and set isolation: none"
            )
    _validate_env_manager(
        "train_env_manager", config.train_env_manager, config, train=True
    )
    _validate_env_manager(
        "val_env_manager", config.val_env_manager, config, train=False
    )
    gs = config.train_env_manager.group_size * trajectories_per_episode(config)
    if config.rollout_batch_size < 1 or config.rollout_batch_size % gs != 0:
        per = "" if gs == config.train_env_manager.group_size else " x policy seats"
        raise ConfigError(
            f"rollout_batch_size={config.rollout_batch_size} is not a positive multiple of "
            f"train_env_manager.group_size{per}={gs}; use e.g. rollout_batch_size={max(1, config.rollout_batch_size // gs) * gs}"
        )
    if config.trainer.trainer_cls:
        check_not_moved(config.trainer.trainer_cls, "trainer.trainer_cls")
    _validate_training(config)
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


def _validate_training(config: PipelineConfig) -> None:
    trainer = config.trainer
    if 0 < trainer.max_tokens_per_micro_batch < config.sequence_length:
        raise ConfigError(
            f"trainer.max_tokens_per_micro_batch={trainer.max_tokens_per_micro_batch} is below "
            f"sequence_length={config.sequence_length}, the longest trajectory a rollout can produce, which would "
            "then fit in no micro-batch; raise it to at least sequence_length, or set it to 0 to micro-batch by "
            "trainer.micro_batch_size"
        )
    if len(trainer.adam_betas) != 2:
        raise ConfigError(
            f"trainer.adam_betas={list(trainer.adam_betas)}: give two values, e.g. [0.9, 0.999]"
        )
    if trainer.simulate_step_s > 0 and (
        config.sft_warmup.enabled or trainer.trainer_cls
    ):
        raise ConfigError(
            "trainer.simulate_step_s > 0 simulates the trainer (no model); it cannot be combined with "
            "sft_warmup.enabled or trainer.trainer_cls: set simulate_step_s=0 or drop those"
        )
    warm = config.sft_warmup
    demo_tag = next(iter(config.train_env_manager.tags), None)
    if (
        warm.enabled
        and warm.demonstrator == "random"
        and demo_tag in config.custom_envs
        and not config.custom_envs[demo_tag].seats
    ):
        raise ConfigError(
            f"sft_warmup.demonstrator=random: the demos play custom_envs.{demo_tag} (the first train tag), which "
            "is not a game with seats; only games have a random player: set sft_warmup.demonstrator=expert"
        )
    _validate_trainer_placement(trainer)
    _validate_trainer_strategy(trainer)
    _validate_trainer_dtype(trainer)
    _validate_lora(trainer)
    _validate_weight_sync_interval(config)


#: Largest adapter rank vLLM serves (vllm.config.lora.MaxLoRARanks).
MAX_SERVED_LORA_RANK = 512


def _validate_lora(trainer: TrainerConfig) -> None:
    """trainer.lora: a positive alpha, no dropout, a rank vLLM can serve, the built-in trainer only."""
    lora = trainer.lora
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


def trajectories_per_episode(config: PipelineConfig) -> int:
    """Trajectories one episode of a training tag gives (its policy seats; 1 for single-agent envs).

    A batch holds whole groups of ``group_size`` episodes, so every training tag must give the same
    number: ConfigError naming the tags when they differ.
    """
    per_tag = {
        tag: trained_seats(tag, config.custom_envs[tag].seats)
        for tag in config.train_env_manager.tags
        if tag in config.custom_envs
    }
    counts = sorted(set(per_tag.values()))
    if len(counts) > 1:
        raise ConfigError(
            f"train_env_manager.tags give different trajectories per episode ({per_tag}: policy seats of games, 1 "
            "for single-agent envs); a batch of whole groups needs one number: train such tags in separate runs"
        )
    return counts[0] if counts else 1
