"""``defaults`` includes: next to the including file first, then the repository's ready configs/; a miss lists both."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll_async.config.loading import SHIPPED_CONFIGS
from roll_async.config.schema import load_config
from roll_async.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]

ENV = """
custom_envs:
  SimpleSokoban:
    env_type: sokoban
    max_steps: 2
train_env_manager: {tags: [SimpleSokoban], num_env_groups: 1, group_size: 4}
rollout_batch_size: 4
"""


def test_the_shipped_configs_are_the_repositorys():
    assert SHIPPED_CONFIGS == REPO / "configs"
    assert (SHIPPED_CONFIGS / "base.yaml").is_file()


def test_a_config_anywhere_includes_base_from_the_shipped_configs(tmp_path):
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("defaults: [base]\n" + ENV)
    config = load_config(config_file)
    shipped = load_config(SHIPPED_CONFIGS / "sokoban.yaml")
    # base.yaml's own settings, which the schema's defaults differ from
    assert config.sequence_length == shipped.sequence_length == 768
    assert config.engine.dtype == "float32"


def test_a_sibling_file_wins_over_a_shipped_one_of_the_same_name(tmp_path):
    (tmp_path / "base.yaml").write_text("sequence_length: 640\n")
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("defaults: [base]\n" + ENV)
    config = load_config(config_file)
    assert config.sequence_length == 640
    assert config.engine.dtype == "auto"  # the shipped base.yaml (float32) was not read


def test_a_missing_include_names_every_place_looked(tmp_path):
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("defaults: [no_such_base]\n" + ENV)
    with pytest.raises(ConfigError) as info:
        load_config(config_file)
    message = str(info.value)
    assert "the include 'no_such_base' (defaults) was not found" in message
    assert repr(str(tmp_path.resolve() / "no_such_base.yaml")) in message
    assert repr(str(SHIPPED_CONFIGS / "no_such_base.yaml")) in message
    assert "\n" not in message
