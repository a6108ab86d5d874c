"""One rollout side's settings, resolved from the PipelineConfig once.

A run has up to two rollouts, training and validation, described by one config
whose sections mean different things for each side (validation plays single,
greedy episodes in fixed rounds, with no filter and no redundant seats). The
pipeline resolves each side here, once, so the schedulers, the group queue and
the env-manager workers read plain settings instead of re-testing a side name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    GroupFilterName,
    Mode,
    ModelConfig,
    PipelineConfig,
    RequestTransport,
    ServeOrder,
    validate_config,
)
from roll_async.config.sections import staleness_bound
from roll_async.config.validation import trajectories_per_episode
from roll_async.errors import InvalidInputError

RolloutRole = Literal["train", "val"]
RolloutSection = Literal["train_env_manager", "val_env_manager"]


@dataclass(frozen=True)
class RolloutSpec:
    """Everything one rollout side (train or val) reads from the config, already resolved for that side."""

    role: RolloutRole
    #: The config section this side comes from (``train_env_manager`` or ``val_env_manager``), for messages.
    section: RolloutSection
    #: That section as configured: env layout, workers, timeouts, restarts. How the queue makes and
    #: serves groups is resolved below (validation overrides some of the section's keys).
    env_manager: EnvManagerConfig
    #: The ``custom_envs`` entries of this side's tags.
    custom_envs: Mapping[str, CustomEnvConfig]
    model: ModelConfig
    generation: GenerationConfig
    sequence_length: int
    request_transport: RequestTransport
    seed: int
    mode: Mode
    #: Steps a pending group may lag the policy before it is dropped (config.staleness_bound resolves it;
    #: 0 in sync mode, and validation plays in sync mode). Everything downstream reads this value.
    staleness_bound: int
    #: Groups in each batch the trainer takes (rollout_batch_size / group_size; 1 for validation): the
    #: queue's quota, and the size of every ``get_batch``. A game tag's group is group_size games, each
    #: giving one trajectory per policy seat: rollout_batch_size / (group_size x policy seats) groups.
    groups_per_batch: int
    #: Extra seats per group beyond group_size (the section's group_size_redundancy; 0 for validation).
    seat_redundancy: int
    group_filter: GroupFilterName
    serve_order: ServeOrder
    #: The queue plays given episodes (``run_fixed_round``) instead of creating groups: validation.
    fixed_rounds: bool
    #: Decode greedily (temperature 0): validation.
    greedy: bool
    #: The pipeline pushes weights after step s when (s + 1) % interval == 0 (weight_sync.interval; 1 for
    #: validation): the queue counts a group's staleness from the version the engines served when it was made.
    weight_sync_interval: int = 1


def rollout_spec(config: PipelineConfig, role: RolloutRole) -> RolloutSpec:
    """Check ``config`` (config mistakes fail here, before any actor or env starts) and resolve side ``role``."""
    if role not in ("train", "val"):
        raise InvalidInputError(f"role={role!r}: use 'train' or 'val'")
    validate_config(config)
    train = role == "train"
    mode: Mode = config.mode if train else "sync"
    em = config.train_env_manager if train else config.val_env_manager
    return RolloutSpec(
        role=role,
        section="train_env_manager" if train else "val_env_manager",
        env_manager=em,
        custom_envs={
            tag: env for tag, env in config.custom_envs.items() if tag in em.tags
        },
        model=config.model,
        generation=config.generation,
        sequence_length=config.sequence_length,
        request_transport=config.engine.request_transport,
        seed=config.seed,
        mode=mode,
        staleness_bound=staleness_bound(mode, config.max_staleness),
        groups_per_batch=max(
            1,
            config.rollout_batch_size
            // (em.group_size * trajectories_per_episode(config)),
        )
        if train
        else 1,
        seat_redundancy=em.group_size_redundancy if train else 0,
        group_filter=em.group_filter if train else "none",
        serve_order=em.serve_order if train else "fifo",
        fixed_rounds=not train,
        greedy=not train,
        weight_sync_interval=config.weight_sync.interval if train else 1,
    )
