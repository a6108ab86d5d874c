"""The one config schema: YAML + defaults + overrides, and every rule checked before any actor starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll_async.config.schema import PipelineConfig, config_to_yaml, load_config
from roll_async.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
DEFAULT = REPO / "configs" / "default.yaml"
SOKOBAN = REPO / "configs" / "sokoban.yaml"


def test_default_config_loads_with_its_includes_merged():
    # default.yaml -> demo_learn_frozen_lake.yaml -> base.yaml
    config = load_config(DEFAULT)
    assert isinstance(config, PipelineConfig)
    assert config.engine.max_model_len == 1024  # from base.yaml
    # from demo_learn_frozen_lake.yaml
    assert config.train_env_manager.tags == ["FrozenLake3"]
    assert config.max_steps == 20  # default.yaml itself wins
    assert config.sft_warmup.enabled and config.staleness_bound == 0


def test_overrides_win_and_resolved_config_round_trips(tmp_path):
    config = load_config(
        DEFAULT,
        [
            "mode=async",
            "max_staleness=2",
            "train_env_manager.group_size=8",
            "rollout_batch_size=16",
        ],
    )
    assert (
        config.mode,
        config.staleness_bound,
        config.train_env_manager.group_size,
    ) == ("async", 2, 8)
    saved = tmp_path / "config.yaml"
    saved.write_text(config_to_yaml(config))
    assert load_config(saved) == config


def test_async_without_max_staleness_defaults_to_one_step():
    assert load_config(DEFAULT, ["mode=async"]).staleness_bound == 1


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "rollout_bach_size=8",
            r"unknown config key 'rollout_bach_size'.*Did you mean 'rollout_batch_size'",
        ),
        (
            "train_env_manager.group_sise=4",
            r"'train_env_manager.group_sise'.*Did you mean 'group_size'",
        ),
        ("engine.max_model_length=9", r"Did you mean 'max_model_len'"),
        ("custom_envs.SimpleSokoban.max_step=3", r"Did you mean 'max_steps'"),
    ],
)
def test_unknown_keys_suggest_the_right_one(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(SOKOBAN, [override])


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["rollout_batch_size=10"],
            r"rollout_batch_size=10 is not a positive multiple of train_env_manager.group_size=4",
        ),
        (
            ["train_env_manager.num_groups_partition=[3]"],
            r"sums to 3, not train_env_manager.num_env_groups=8",
        ),
        (
            ["train_env_manager.num_groups_partition=[2,2]"],
            r"has 2 entries but train_env_manager.tags has 1",
        ),
        (
            ["train_env_manager.tags=[Sokoban]"],
            r"names 'Sokoban', which is not defined under custom_envs",
        ),
        (
            ["mode=async", "max_staleness=0"],
            r"max_staleness=0 with mode=async.*use mode=sync",
        ),
        (["max_staleness=2"], r"max_staleness=2 only applies to mode=async"),
        (["mode=offpolicy"], r"mode='offpolicy' is unknown"),
        (
            ["custom_envs.SimpleSokoban.max_tokens_per_step=800"],
            r"max_tokens_per_step=800 must be below sequence_length=768",
        ),
        (
            ["sequence_length=4096"],
            r"sequence_length=4096 exceeds engine.max_model_len=1024",
        ),
        (
            ["train_env_manager.group_filter=zero_varianse"],
            r"group_filter='zero_varianse' is unknown.*Did you mean 'zero_variance'",
        ),
        (["rollout_batch_size=abc"], r"rollout_batch_size"),
        (["mode"], r"is not key=value"),
    ],
)
def test_cross_field_mistakes_name_key_and_fix(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(SOKOBAN, overrides)


def test_missing_file_and_include_cycles_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("defaults: [b]\n")
    b.write_text("defaults: [a]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(a)


def test_every_shipped_config_is_valid():
    configs = sorted((REPO / "configs").glob("*.yaml"))
    assert DEFAULT in configs
    for path in configs:
        if path.name == "base.yaml":
            continue
        load_config(path)
