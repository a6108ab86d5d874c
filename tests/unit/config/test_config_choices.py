"""Keys with a fixed set of words: one generic check at load names the key, the choices and the closest word."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from roll_async.config.schema import (
    GroupFilterName,
    PipelineConfig,
    RolloutSchedPolicy,
    TrainerDtype,
    load_config,
    validate_config,
)
from roll_async.config.validation import check_fields
from roll_async.errors import ConfigError

FROZEN_LAKE = "configs/frozen_lake.yaml"


def _literal_keys(cls: type = PipelineConfig, prefix: str = "") -> list[str]:
    """Every dotted key typed with a Literal (``custom_envs`` entries under the config's tag)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Literal:
            keys.append(prefix + f.name)
        elif dataclasses.is_dataclass(hint):
            keys += _literal_keys(hint, f"{prefix}{f.name}.")
        elif typing.get_origin(hint) is dict:
            entry = typing.get_args(hint)[1]
            if dataclasses.is_dataclass(entry):
                keys += _literal_keys(entry, f"{prefix}{f.name}.FrozenLake3.")
    return keys


def test_the_schema_declares_the_word_sets_as_literals():
    keys = set(_literal_keys())
    assert {
        "mode",
        "engine.request_transport",
        "engine.dtype",
        "trainer.advantage_estimator",
        "trainer.loss_agg",
        "trainer.placement",
        "trainer.dtype",
        "weight_sync.in_flight",
        "train_env_manager.serve_order",
        "train_env_manager.group_filter",
        "train_env_manager.worker_placement",
        "train_env_manager.rollout_sched_policy",
        "val_env_manager.group_filter",
        "custom_envs.FrozenLake3.isolation",
    } <= keys


@pytest.mark.parametrize("key", _literal_keys())
def test_every_literal_key_rejects_an_unknown_word_naming_key_and_choices(key):
    with pytest.raises(ConfigError) as info:
        load_config(FROZEN_LAKE, [f"{key}=bogus"])
    message = str(info.value)
    assert message.startswith(f"{key}='bogus' is unknown; use "), message


def test_a_close_word_gets_a_suggestion_and_a_yaml_value_is_checked_too(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        f"defaults: [{Path(FROZEN_LAKE).resolve()}]\nweight_sync:\n  in_flight: abrot\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"^weight_sync\.in_flight='abrot' is unknown; use abort, wait or keep\. Did you mean 'abort'\?$",
    ):
        load_config(path)


def test_a_config_built_in_code_is_checked_by_validate_config():
    config = load_config(FROZEN_LAKE)
    config.trainer.loss_agg = "sum"  # type: ignore[assignment]
    with pytest.raises(
        ConfigError,
        match="trainer.loss_agg='sum' is unknown; use token_mean or seq_mean",
    ):
        validate_config(config)


def test_raw_mappings_are_checked_without_the_keys_they_do_not_set():
    check_fields(PipelineConfig, {"engine": {"dtype": "bfloat16"}, "unknown": 1})
    with pytest.raises(ConfigError, match=r"custom_envs\.A\.isolation='thread'"):
        check_fields(PipelineConfig, {"custom_envs": {"A": {"isolation": "thread"}}})


def test_the_config_word_sets_match_what_the_runtime_implements():
    from roll_async.runtime.sched_policy import POLICIES
    from roll_async.scheduler.filters import GROUP_FILTERS
    from roll_async.trainer.grpo_trainer import _DTYPES

    assert set(typing.get_args(GroupFilterName)) == set(GROUP_FILTERS)
    assert set(typing.get_args(RolloutSchedPolicy)) == set(POLICIES)
    assert set(typing.get_args(TrainerDtype)) == set(_DTYPES)
