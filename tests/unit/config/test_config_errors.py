"""Config mistakes in one line: YAML syntax errors with file:line:column, keys in the wrong section name the right one."""

from __future__ import annotations

import pytest

from roll_async.config.schema import load_config
from roll_async.errors import ConfigError


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("mode: sync\ntrain_env_manager:\n  tags: [a\n  group_size: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    # the parser notices the unclosed list on line 4
    assert message.startswith(f"{path}:4:")
    assert "YAML syntax error" in message and "\n" not in message


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "env_step_timeout_s=5",
            "train_env_manager.env_step_timeout_s or val_env_manager.env_step_timeout_s",
        ),
        (
            "trainer.group_size=2",
            "train_env_manager.group_size or val_env_manager.group_size",
        ),
        ("max_tokens_per_step=8", "custom_envs.<Tag>.max_tokens_per_step"),
        ("engine.lr=0.1", "trainer.lr"),
    ],
)
def test_key_in_the_wrong_section_names_the_sections_where_it_exists(
    override, expected
):
    with pytest.raises(
        ConfigError,
        match="it belongs in "
        + expected.replace(".", r"\.").replace("<", ".").replace(">", "."),
    ):
        load_config("configs/frozen_lake.yaml", [override])


def test_a_misspelt_key_still_gets_did_you_mean():
    with pytest.raises(ConfigError, match="Did you mean 'max_steps'"):
        load_config("configs/frozen_lake.yaml", ["max_step=3"])


def test_replay_from_is_the_user_facing_key(tmp_path):
    (tmp_path / "batches").mkdir()
    config = load_config("configs/frozen_lake.yaml", [f"replay.from={tmp_path}"])
    assert config.replay.from_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="logging.save_batches=true"):
        load_config("configs/frozen_lake.yaml", [f"replay.from={tmp_path / 'nothing'}"])


def test_unknown_request_transport_names_the_key_and_the_choices():
    with pytest.raises(
        ConfigError,
        match=r"engine\.request_transport='zeromq' is unknown; use zmq or ray\. Did you mean 'zmq'\?",
    ):
        load_config("configs/frozen_lake.yaml", ["engine.request_transport=zeromq"])
    assert (
        load_config(
            "configs/frozen_lake.yaml", ["engine.request_transport=ray"]
        ).engine.request_transport
        == "ray"
    )
    assert load_config("configs/frozen_lake.yaml").engine.request_transport == "zmq"


def test_every_bad_single_key_is_reported_in_one_error():
    """Limits declared beside the fields are checked in one pass: two bad keys, one error naming both."""
    with pytest.raises(ConfigError) as info:
        load_config(
            "configs/frozen_lake.yaml",
            ["train_env_manager.group_size=0", "trainer.lr=0", "engine.dtype=bf16"],
        )
    lines = str(info.value).splitlines()
    assert sorted(lines) == [
        "engine.dtype='bf16' is unknown; use auto, half, float16, bfloat16, float or float32. "
        "Did you mean 'bfloat16'?",
        "train_env_manager.group_size=0: must be >= 1",
        "trainer.lr=0.0: must be > 0",
    ]
