"""build_trainer: custom trainer classes by dotted path, and clear errors for bad ones."""

from __future__ import annotations

import pytest

from roll_async.config.schema import TrainerConfig
from roll_async.errors import ConfigError
from roll_async.trainer import Trainer, build_trainer, load_trainer_class

CUSTOM = """
class EchoTrainer:
    def __init__(self, config, model_path):
        self.config, self.model_path = config, model_path
    def train_step(self, batch, step):
        return {"train/loss": 0.0}
    def state_dict_for_engine(self):
        return {}
    def save_checkpoint(self, directory, extra_state):
        pass
    def load_checkpoint(self, directory):
        return {}

class Half:
    def train_step(self, batch, step):
        return {}

not_a_class = 3
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_trainers.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_trainers"


def test_custom_trainer_cls_is_built_with_config_and_path(plugin):
    config = TrainerConfig(trainer_cls=f"{plugin}:EchoTrainer")
    trainer = build_trainer(config, "/some/model")
    assert type(trainer).__name__ == "EchoTrainer" and isinstance(trainer, Trainer)
    assert trainer.config is config and trainer.model_path == "/some/model"


@pytest.mark.parametrize(
    "path, message",
    [
        ("my_trainers.EchoTrainer", "not a dotted path"),
        ("no_such_module_xyz:Trainer", "cannot import module 'no_such_module_xyz'"),
        ("my_trainers:Missing", "has no attribute 'Missing'"),
        ("my_trainers:not_a_class", "not a class"),
        ("my_trainers:Half", "lacks the Trainer method"),
    ],
)
def test_bad_trainer_cls_names_the_key_and_the_fix(plugin, path, message):
    with pytest.raises(ConfigError, match="trainer.trainer_cls") as info:
        load_trainer_class(path)
    assert message in str(info.value)
    with pytest.raises(ConfigError):
        build_trainer(TrainerConfig(trainer_cls=path), "/some/model")
