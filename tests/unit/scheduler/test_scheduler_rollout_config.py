"""Config mistakes fail when a scheduler is built, before any actor or env starts."""

from __future__ import annotations

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import CustomEnvConfig, EnvManagerConfig, PipelineConfig
from roll_async.errors import ConfigError
from roll_async.scheduler.rollout_scheduler import RolloutScheduler


def config(**train) -> PipelineConfig:
    em = dict(num_env_groups=2, group_size=2, tags=["a"])
    em.update(train)
    return PipelineConfig(
        rollout_batch_size=4,
        custom_envs={
            "a": CustomEnvConfig(env_type="sokoban"),
            "b": CustomEnvConfig(env_type="sokoban"),
        },
        train_env_manager=EnvManagerConfig(**em),
    )


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(group_size=3), "rollout_batch_size=4 is not a positive multiple"),
        (dict(tags=["a", "b"], num_groups_partition=[1, 2]), "sums to 3"),
        (dict(tags=["a", "b"], num_groups_partition=[2]), "has 1 entries but"),
        (dict(tags=["c"]), "not defined under custom_envs"),
        (dict(group_filter="zero_var"), "group_filter='zero_var' is unknown"),
    ],
)
def test_bad_config_fails_before_any_actor_starts(bad, message):
    import ray

    was_up = ray.is_initialized()
    with pytest.raises(ConfigError, match=message):
        RolloutScheduler(
            rollout_spec(config(**bad), "train"),
            engine_handles=[object()],
            tokenizer_path="/nonexistent",
        )
    assert ray.is_initialized() == was_up


def test_a_good_config_builds_without_starting_anything():
    scheduler = RolloutScheduler(
        rollout_spec(config(), "train"),
        engine_handles=[object()],
        tokenizer_path="/nonexistent",
    )
    assert scheduler.num_workers == 0
