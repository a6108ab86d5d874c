"""The one config schema: dataclasses loaded from YAML with OmegaConf, plus the rules between fields.

Loading order: the YAML's ``defaults`` list (paths relative to the YAML, merged
first to last), then the YAML itself, then ``key=value`` overrides. Unknown
keys fail with a did-you-mean suggestion, and every cross-field rule is checked
by :func:`validate_config` before any actor starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from roll_async.config.dotted_paths import check_not_moved
from roll_async.errors import ConfigError
from roll_async.runtime.sched_policy import POLICIES as SCHED_POLICIES
from roll_async.sampling import SamplingSettings


@dataclass
class ModelConfig:
    #: Local HF model directory or hub id; None means the offline tiny model (built on first use).
    path: str | None = None
    trust_remote_code: bool = False
    #: A Jinja chat template file that replaces the tokenizer's own (for templates that cannot be used as shipped).
    chat_template: str | None = None
    #: Extra variables for every chat-template render, e.g. {enable_thinking: false} for Qwen3.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


#: engine.request_transport values (roll_async/runtime/zmq_calls.py; ray: one actor call per request or hand-over).
REQUEST_TRANSPORTS = ("zmq", "ray")


@dataclass
class EngineConfig:
    num_replicas: int = 1
    dtype: str = "auto"
    max_model_len: int = 2048
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    #: GPU: fraction of GPU memory for weights + KV cache. Ignored on CPU (see cpu_kv_cache_space_gib).
    gpu_memory_utilization: float = 0.85
    #: CPU only: GiB of host memory reserved for the KV cache (VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_cache_space_gib: float = 1.0
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    seed: int = 0
    #: Seconds to wait for an engine replica to come up before failing with its log tail.
    startup_timeout_s: float = 600.0
    #: How EnvManagerWorkers send each turn's generate request to an engine replica, and each episode's
    #: hand-over to the queue actor: zmq (the actor's ZMQ socket: IPC on its node, TCP across nodes; ~0.22 ms
    #: of CPU per call) or ray (an actor call, ~1.35 ms; benchmarks/ray_call_cost.py). Control calls (abort,
    #: stats, weights, get_batch) are Ray calls either way. See roll_async/runtime/zmq_calls.py.
    request_transport: str = "zmq"
    #: Extra vllm.AsyncEngineArgs keyword arguments, passed through unchanged.
    engine_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerationConfig:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    #: Retries of a failed engine request before the error surfaces (naming env, turn, request).
    max_retries: int = 2
    retry_backoff_s: float = 0.5
    request_timeout_s: float = 600.0


@dataclass
class CustomEnvConfig:
    """One ``custom_envs.<Tag>`` entry: which env to build and how it talks to the model."""

    env_type: str = MISSING
    env_config: dict[str, Any] = field(default_factory=dict)
    max_steps: int = 10
    max_tokens_per_step: int = 64
    system_prompt: str = "You are an agent solving a task step by step. Reply with your action inside <answer></answer>."
    #: First user message; fields: {instruction}, {observation}.
    instruction_template: str = "{instruction}\n{observation}"
    #: Later user messages; fields: {observation}, {reward}, {turn}.
    observation_template: str = "{observation}"
    #: Stop strings for this env's turns (NeMo-RL style per-env stops); kept in the output.
    stop: list[str] = field(default_factory=lambda: ["</answer>"])
    #: Agent session (``env_type: agent``): ``pkg.module:function`` naming ``async def agent(client, task)``;
    #: the agent's requests set their own messages and stop strings (system_prompt, templates, stop unused).
    agent: str | None = None
    #: Run this tag's envs on env servers (``roll-async env-server``): one URL or a list, spread by load.
    service_url: Any = None
    #: Retries of transport errors per env-server call before the server counts as down.
    service_max_retries: int = 3
    #: none: envs run in the worker's threads; process: each env instance in its own child process
    #: (a call past env_step_timeout_s kills it; a crash is contained); inline: sync env calls run on the
    #: worker's event loop, no thread hop (for fast, trusted envs: a call past env_step_timeout_s fails
    #: its episode only once it returns, and a hang stops every env of its worker).
    isolation: str = "none"


@dataclass
class EnvManagerConfig:
    num_env_groups: int = 4
    group_size: int = 4
    group_size_redundancy: int = 0
    tags: list[str] = field(default_factory=list)
    #: Groups per tag, same length as ``tags``; empty means split num_env_groups evenly.
    num_groups_partition: list[int] = field(default_factory=list)
    max_env_num_per_worker: int = 16
    env_step_timeout_s: float = 60.0
    #: Threads per worker for synchronous env reset/step calls.
    env_threads_per_worker: int = 8
    #: EnvManagerWorker processes: allocations between young garbage collections, after freezing what the
    #: worker built (roll_async/runtime/gc_tuning.py); 0 keeps Python's default (700).
    worker_gc_threshold: int = 250_000
    #: Linux scheduling policy of the EnvManagerWorker and GroupQueueActor processes (roll_async/runtime/sched_policy.py):
    #: batch (SCHED_BATCH: same CPU share, but their wake-ups do not preempt vLLM's steps on a shared core) | normal.
    rollout_sched_policy: str = "batch"
    #: Ray CPUs reserved by each EnvManagerWorker actor.
    num_cpus_per_worker: float = 0.0
    #: spread: Ray's SPREAD strategy puts workers on as many nodes as it can; pack: Ray's default (the driver's
    #: node first). With num_cpus_per_worker > 0, each worker also holds its CPUs wherever it lands.
    worker_placement: str = "spread"
    #: Name of a group filter (see roll_async.scheduler.filters): none | zero_variance.
    group_filter: str = "none"
    #: An env that makes no progress for this long is reported by the watchdog.
    watchdog_timeout_s: float = 300.0
    #: EnvManagerWorkers that die (process killed, crash) are restarted this many times in total; one more fails the run.
    max_worker_restarts: int = 3
    #: Train only. fifo: serve the oldest groups (no bias to short episodes; envs may idle behind a slow group).
    #: first_complete: serve the first groups to complete; the rest continue into later steps within the
    #: staleness bound, and every env group is kept busy (see roll_async.scheduler.group_queue "Serving").
    serve_order: str = "fifo"
    #: Validation only: an env-config parquet (roll-async make-env-dataset) with the fixed val episodes.
    dataset: str | None = None


@dataclass
class TrainerConfig:
    """GRPO-style policy-gradient training of the same HF model the engine serves."""

    #: Dotted path ``package.module:Class`` of a custom Trainer; empty means the built-in GRPO trainer.
    trainer_cls: str = ""
    device: str = "auto"
    dtype: str = "float32"
    lr: float = 1e-5
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    max_grad_norm: float = 1.0
    micro_batch_size: int = 8
    #: Optimizer passes over each rollout batch (PPO epochs).
    ppo_epochs: int = 1
    #: grpo: (r - mean) / std within a group; rloo: leave-one-out baseline.
    advantage_estimator: str = "grpo"
    normalize_advantage_std: bool = True
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    #: Truncated importance sampling cap on pi_train/pi_behaviour (off-policy correction); 0 disables.
    tis_cap: float = 2.0
    #: KL penalty to the initial (reference) policy; 0 disables and loads no reference model.
    kl_coef: float = 0.0
    #: token_mean: mean over all response tokens of the batch; seq_mean: mean of per-sequence means.
    loss_agg: str = "token_mean"
    gradient_checkpointing: bool = False
    #: Drop from the loss tokens sampled by weights more than this many versions older than the
    #: trainer's current ones (per-token versions; -1 disables). Masked share: train/token_lag/masked_fraction.
    max_token_lag: int = -1
    #: > 0: no model is trained; each step takes this many seconds without CPU and the version advances
    #: (roll_async.trainer.simulated, SkyRL-style), for measuring the rollout side and async overlap.
    simulate_step_s: float = 0.0
    #: With simulate_step_s: seconds each weight sync takes (engines paused as for a real sync; no weights move).
    simulate_sync_s: float = 0.0
    #: Where the trainer runs: ``driver`` (in the pipeline's process, on ``device``) or ``ray_actor`` (a Ray actor
    #: holding ``num_gpus`` GPUs that Ray assigns; weights go from it to the engines through the object store).
    placement: str = "driver"
    #: ray_actor only: GPUs the trainer actor reserves (fractions allowed); 0 trains on the actor's CPU.
    num_gpus: float = 0.0


@dataclass
class WeightSyncConfig:
    #: Push trainer weights to the engine every this many steps.
    interval: int = 1
    #: Async mode, what happens to turns in flight during an update: abort (and regenerate), wait, keep.
    in_flight: str = "abort"


@dataclass
class SFTWarmupConfig:
    """Brief supervised warm start on env-solver demonstrations (the offline learning demo)."""

    enabled: bool = False
    num_demos: int = 64
    #: Fraction of each demo's turns that are kept (partial demos keep initial success low).
    demo_fraction: float = 0.5
    steps: int = 50
    lr: float = 1e-3
    batch_size: int = 8


@dataclass
class CheckpointConfig:
    #: Save every this many steps (0: only at the end).
    save_interval: int = 0
    #: Keep this many most recent checkpoints.
    keep_last: int = 2
    #: A run directory (or its checkpoints/step_N) to continue from.
    resume_from: str | None = None


@dataclass
class LoggingConfig:
    console: bool = True
    progress_bar: bool = True
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "roll-async"
    #: Write trajectories.jsonl (with decoded text) in the run directory.
    save_trajectories: bool = True
    #: Console level of roll-async's own messages (INFO adds start-up lines); vLLM, Ray and transformers reach
    #: the console only at ERROR. Everything at INFO and above goes to RUN_DIR/logs/ (roll_async.run_output.logs).
    level: str = "WARNING"
    #: Write each step's collated training batch to RUN_DIR/batches/ (replay it with replay.from=RUN_DIR).
    save_batches: bool = False


@dataclass
class ReplayConfig:
    """Train on the batches a run saved (logging.save_batches) instead of rolling out: no engine, no env, no Ray.

    Written ``replay.from=RUN_DIR`` (``from`` is the user-facing name of ``from_dir``).
    """

    from_dir: str | None = None


@dataclass
class PipelineConfig:
    mode: str = "sync"
    #: Async only: how many steps a group may lag the consuming step. None means 1 in async mode.
    max_staleness: int | None = None
    rollout_batch_size: int = 16
    sequence_length: int = 1024
    max_steps: int = 10
    #: Rollout pipeline: how many batches to collect.
    num_batches: int = 2
    #: Run validation every this many steps (0: never).
    eval_steps: int = 0
    seed: int = 42
    output_dir: str | None = None
    ray_address: str | None = None
    ray_num_cpus: int | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    train_env_manager: EnvManagerConfig = field(default_factory=EnvManagerConfig)
    val_env_manager: EnvManagerConfig = field(
        default_factory=lambda: EnvManagerConfig(num_env_groups=0, group_size=1)
    )
    custom_envs: dict[str, CustomEnvConfig] = field(default_factory=dict)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    sft_warmup: SFTWarmupConfig = field(default_factory=SFTWarmupConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    @property
    def staleness_bound(self) -> int:
        """Steps a group may lag; 0 in sync mode (every group is for the step it serves)."""
        if self.mode == "sync":
            return 0
        return 1 if self.max_staleness is None else self.max_staleness


# ---------------------------------------------------------------------------
# Loading


def _schema_keys(node: Any) -> list[str]:
    if dataclasses.is_dataclass(node):
        return [f.name for f in dataclasses.fields(node)]
    return []


def _suggest(key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def _load_yaml_with_defaults(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(
            f"config file {str(path)!r} does not exist; pass a path to a YAML file, e.g. configs/sokoban.yaml"
        )
    if path in seen:
        raise ConfigError(
            f"config 'defaults' form a cycle through {str(path)!r}; remove one of the includes"
        )
    try:
        raw = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_line(path, exc)) from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping at the top level"
        )
    defaults = raw.pop("defaults", [])
    merged = OmegaConf.create({})
    for entry in defaults:
        if entry == "_self_":
            continue
        base = path.parent / str(entry)
        if base.suffix not in (".yaml", ".yml"):
            base = base.with_suffix(".yaml")
        merged = OmegaConf.merge(merged, _load_yaml_with_defaults(base, seen + (path,)))
    return OmegaConf.merge(merged, raw)


def _yaml_error_line(path: Path, exc: yaml.YAMLError) -> str:
    """``file:line:column: YAML syntax error: problem`` (1-based, as editors count)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = (
        f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    )
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return f"{where}: YAML syntax error: {problem}" + (
        f" ({context})" if context else ""
    )


def _sections_with_key(leaf: str, node: Any = None, prefix: str = "") -> list[str]:
    """Every dotted path in the schema whose last part is ``leaf`` (``custom_envs.<Tag>`` for env entries)."""
    node = PipelineConfig() if node is None else node
    found: list[str] = []
    for f in dataclasses.fields(node):
        path = f"{prefix}{f.name}"
        value = getattr(node, f.name)
        if f.name == leaf:
            found.append(path)
        if dataclasses.is_dataclass(value):
            found.extend(_sections_with_key(leaf, value, path + "."))
        elif f.name == "custom_envs":
            found.extend(
                _sections_with_key(
                    leaf, CustomEnvConfig(env_type="x"), path + ".<Tag>."
                )
            )
    return found


def _explain_unknown_key(exc: ConfigKeyError) -> ConfigError:
    full_key = getattr(exc, "full_key", None) or ""
    parts = full_key.split(".")
    node: Any = PipelineConfig()
    for part in parts[:-1]:
        if isinstance(node, dict):
            node = CustomEnvConfig()
            continue
        node = getattr(node, part, None)
    choices = _schema_keys(node)
    leaf = parts[-1]
    elsewhere = [p for p in _sections_with_key(leaf) if p != full_key]
    if elsewhere:
        where = "the top level" if len(parts) == 1 else f"'{'.'.join(parts[:-1])}'"
        return ConfigError(
            f"unknown config key '{full_key}': '{leaf}' is not a key of {where}; it belongs in "
            f"{' or '.join(elsewhere)}"
        )
    return ConfigError(
        f"unknown config key '{full_key}'.{_suggest(leaf, choices)} "
        f"Valid keys here: {', '.join(choices) if choices else '(none)'}"
    )


def load_config(
    path: str | os.PathLike[str] | None = None, overrides: list[str] | None = None
) -> PipelineConfig:
    """Load YAML (with ``defaults``) and ``key=value`` overrides into a validated PipelineConfig."""
    schema = OmegaConf.structured(PipelineConfig)
    try:
        cfg = schema
        if path is not None:
            cfg = OmegaConf.merge(
                cfg, _replay_from_alias(_load_yaml_with_defaults(Path(path)))
            )
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(
                    f"override {bad[0]!r} is not key=value; write it like mode=async"
                )
            cfg = OmegaConf.merge(
                cfg, _replay_from_alias(OmegaConf.from_dotlist(list(overrides)))
            )
        config: PipelineConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except ConfigKeyError as exc:
        raise _explain_unknown_key(exc) from None
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        msg = str(exc).splitlines()[0]
        raise ConfigError(
            f"config key '{key}': {msg}" if key else f"config error: {msg}"
        ) from None
    validate_config(config)
    return config


def _replay_from_alias(raw: DictConfig) -> DictConfig:
    """``replay.from`` (what users write) is stored as ``replay.from_dir`` (``from`` is a Python keyword)."""
    replay = raw.get("replay") if isinstance(raw, DictConfig) else None
    if isinstance(replay, DictConfig) and "from" in replay:
        replay["from_dir"] = replay.pop("from")
    return raw


def config_to_yaml(config: PipelineConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))


# ---------------------------------------------------------------------------
# Cross-field rules


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
    if em.rollout_sched_policy not in SCHED_POLICIES:
        raise ConfigError(
            f"{name}.rollout_sched_policy={em.rollout_sched_policy!r} is unknown; use one of {sorted(SCHED_POLICIES)} "
            "(batch: the rollout's wake-ups do not preempt the engine; normal: the kernel's default)"
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
                f"{name}.tags names '{tag}', which is not defined under custom_envs.{_suggest(tag, list(config.custom_envs))} "
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
    if em.worker_placement not in ("spread", "pack"):
        raise ConfigError(
            f"{name}.worker_placement='{em.worker_placement}' is unknown; use spread or pack"
        )
    if em.serve_order not in ("fifo", "first_complete"):
        raise ConfigError(
            f"{name}.serve_order='{em.serve_order}' is unknown.{_suggest(em.serve_order, ['fifo', 'first_complete'])} "
            "Choose fifo or first_complete"
        )
    from roll_async.scheduler.filters import (
        GROUP_FILTERS,  # local: filters import only protocol
    )

    if em.group_filter not in GROUP_FILTERS:
        raise ConfigError(
            f"{name}.group_filter='{em.group_filter}' is unknown.{_suggest(em.group_filter, list(GROUP_FILTERS))} "
            f"Choose one of: {', '.join(GROUP_FILTERS)}"
        )


def validate_config(config: PipelineConfig) -> None:
    """Check every rule between fields; raise ConfigError naming the key and the fix."""
    if config.mode not in ("sync", "async"):
        raise ConfigError(
            f"mode='{config.mode}' is unknown; use mode=sync or mode=async"
        )
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
    if config.engine.request_transport not in REQUEST_TRANSPORTS:
        raise ConfigError(
            f"engine.request_transport={config.engine.request_transport!r} is unknown."
            f"{_suggest(config.engine.request_transport, list(REQUEST_TRANSPORTS))} Choose one of: {', '.join(REQUEST_TRANSPORTS)}"
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


ISOLATION_MODES = ("none", "process", "inline")


def _validate_env_placement(tag: str, env: CustomEnvConfig) -> None:
    """isolation and service_url of one custom env (see roll_async.env_service)."""
    if env.isolation not in ISOLATION_MODES:
        raise ConfigError(
            f"custom_envs.{tag}.isolation='{env.isolation}' is unknown; use one of: {', '.join(ISOLATION_MODES)}"
        )
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
    if trainer.advantage_estimator not in ("grpo", "rloo"):
        raise ConfigError(
            f"trainer.advantage_estimator='{trainer.advantage_estimator}' is unknown; use grpo or rloo"
        )
    if trainer.loss_agg not in ("token_mean", "seq_mean"):
        raise ConfigError(
            f"trainer.loss_agg='{trainer.loss_agg}' is unknown; use token_mean or seq_mean"
        )
    if trainer.micro_batch_size < 1:
        raise ConfigError(
            f"trainer.micro_batch_size={trainer.micro_batch_size}: must be >= 1"
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
    if config.weight_sync.in_flight not in ("abort", "wait", "keep"):
        raise ConfigError(
            f"weight_sync.in_flight='{config.weight_sync.in_flight}' is unknown; use abort, wait or keep"
        )
    if config.weight_sync.interval < 1:
        raise ConfigError(
            f"weight_sync.interval={config.weight_sync.interval}: must be >= 1"
        )
    if not 0.0 <= config.sft_warmup.demo_fraction <= 1.0:
        raise ConfigError(
            f"sft_warmup.demo_fraction={config.sft_warmup.demo_fraction}: must be within [0, 1]"
        )


def _validate_trainer_placement(trainer: TrainerConfig) -> None:
    """trainer.placement / num_gpus: only an actor gets GPUs from Ray, and a GPU device needs one."""
    if trainer.placement not in ("driver", "ray_actor"):
        raise ConfigError(
            f"trainer.placement='{trainer.placement}' is unknown; use driver or ray_actor"
        )
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
