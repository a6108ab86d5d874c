"""build_trainer: custom trainer classes by dotted path, clear errors for bad ones, and only a model that
cannot be read reported as one (any other failure while building the trainer surfaces as itself)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from roll_async.config.schema import TrainerConfig, load_config
from roll_async.errors import ConfigError
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from roll_async.trainer import Trainer, build_trainer, load_trainer_class
from roll_async.trainer.factory import ModelLoadError

REPO = Path(__file__).resolve().parents[3]

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


@pytest.fixture
def broken_model(tmp_path, tiny_model_path) -> Path:
    """The tiny model with its weights file overwritten: the config reads, the weights do not."""
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_path, broken)
    next(broken.glob("*.safetensors")).write_bytes(b"not a safetensors file")
    return broken


def test_weights_that_cannot_be_read_are_a_model_load_error(broken_model):
    with pytest.raises(
        ModelLoadError, match="cannot load .*broken-model.* as a causal LM"
    ):
        build_trainer(TrainerConfig(), str(broken_model))


def test_another_failure_while_building_the_trainer_is_not_called_a_model_load_error(
    tiny_model_path, monkeypatch
):
    def broken_optimizer(*args, **kwargs):
        raise RuntimeError("optimizer set-up failed")

    monkeypatch.setattr("torch.optim.AdamW", broken_optimizer)
    with pytest.raises(RuntimeError, match="optimizer set-up failed") as caught:
        build_trainer(TrainerConfig(), str(tiny_model_path))
    assert not isinstance(caught.value, ModelLoadError)


def test_a_model_load_error_crosses_ray_as_itself():
    """Trainer actors and fsdp2 ranks raise it in another process; Ray pickles it with its arguments."""
    error = pickle.loads(pickle.dumps(ModelLoadError("/m", "OSError: no file")))
    assert isinstance(error, ModelLoadError)
    assert str(error) == "cannot load '/m' as a causal LM: OSError: no file"


def _pipeline(*overrides: str) -> AgenticPipeline:
    config = load_config(
        REPO / "configs" / "sokoban.yaml",
        ["sft_warmup.enabled=false", "logging.console=false", *overrides],
    )
    return AgenticPipeline(config)


def test_the_pipeline_names_model_path_in_one_line_when_the_model_cannot_load(
    broken_model,
):
    pipeline = _pipeline(f"model.path={broken_model}")
    with pytest.raises(ConfigError) as caught:
        pipeline._prepare_trainer()
    message = str(caught.value)
    assert message.startswith(
        f"model.path={str(broken_model)!r}: the trainer cannot load {str(broken_model)!r} as a causal LM: "
    )
    assert "\n" not in message


def test_an_error_starting_the_ranks_surfaces_as_itself_not_as_a_model_that_cannot_load(
    tiny_model_path, monkeypatch
):
    """The README's fsdp2 command once failed with 'cannot load ... as a causal LM: RuntimeError: no running
    event loop': the real error, in starting Ray, was rewritten as a model error."""

    def failing_start(config, model_path):
        raise RuntimeError("no running event loop")

    monkeypatch.setattr(
        "roll_async.trainer.trainer_actor.TrainerRankGroup.start", failing_start
    )
    pipeline = _pipeline("trainer.strategy=fsdp2", "trainer.num_ranks=2")
    monkeypatch.setattr(pipeline, "_ensure_ray", lambda: None)
    with pytest.raises(RuntimeError, match="^no running event loop$") as caught:
        pipeline._prepare_trainer()
    assert not isinstance(caught.value, ConfigError)
