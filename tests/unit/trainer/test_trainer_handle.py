"""TrainerHandle: every call the pipeline makes on its trainer, implemented by each of the four kinds.

The kinds subclass the protocol explicitly, so a method one of them forgot would
silently inherit the protocol's empty body; these tests catch that, and check the
driver placement wraps a four-method Trainer into a whole handle.
"""

from __future__ import annotations

import pytest

from roll_async.config.sections import TrainerConfig
from roll_async.errors import ConfigError
from roll_async.trainer.base import Trainer, TrainerHandle
from roll_async.trainer.ranks.rank_group import TrainerRankGroup
from roll_async.trainer.simulated import SimulatedTrainer
from roll_async.trainer.trainer_actor import (
    InProcessTrainer,
    TrainerActorClient,
    build_placed_trainer,
)

KINDS = [InProcessTrainer, SimulatedTrainer, TrainerActorClient, TrainerRankGroup]
HANDLE_METHODS = [
    "train_step",
    "state_dict_for_engine",
    "save_checkpoint",
    "load_checkpoint",
    "engine_weight_refs",
    "run_sft",
    "shutdown",
]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_each_trainer_kind_implements_every_handle_method(kind):
    assert TrainerHandle in kind.__mro__  # explicit (issubclass refuses data members)
    for name in HANDLE_METHODS:
        assert getattr(kind, name) is not getattr(TrainerHandle, name), (
            f"{kind.__name__}.{name} is the protocol's empty body"
        )
    assert isinstance(kind.__dict__.get("simulated"), bool), kind.__name__


class FourMethods:
    """A user's trainer: only the four Trainer methods (trainer.trainer_cls)."""

    def __init__(self, config: TrainerConfig, model_path: str) -> None:
        self.calls: list[tuple] = []

    def train_step(self, batch, step):
        self.calls.append(("train_step", step))
        return {"train/loss": 1.0}

    def state_dict_for_engine(self):
        return {}

    def save_checkpoint(self, directory, extra_state):
        self.calls.append(("save_checkpoint", str(directory)))

    def load_checkpoint(self, directory):
        return {"step": 3}


def _no_ray() -> None:
    raise AssertionError("a driver-placed trainer must not start Ray")


def test_the_driver_placement_wraps_a_four_method_trainer_in_a_whole_handle():
    config = TrainerConfig(trainer_cls=f"{__name__}:FourMethods")
    handle = build_placed_trainer(config, "/some/model", ensure_ray=_no_ray)
    assert isinstance(handle, InProcessTrainer) and isinstance(handle, TrainerHandle)
    inner = handle.trainer
    assert isinstance(inner, FourMethods) and isinstance(inner, Trainer)
    assert handle.simulated is False
    assert handle.train_step(None, 2) == {"train/loss": 1.0}
    handle.save_checkpoint("/tmp/x", {})
    assert handle.load_checkpoint("/tmp/x") == {"step": 3}
    assert inner.calls == [("train_step", 2), ("save_checkpoint", "/tmp/x")]
    handle.shutdown()  # nothing outside the process: a no-op


def test_the_simulated_trainer_is_its_own_handle_and_moves_no_weights():
    config = TrainerConfig(simulate_step_s=0.01)
    handle = build_placed_trainer(config, "/no/such/model", ensure_ray=_no_ray)
    assert isinstance(handle, SimulatedTrainer) and handle.simulated is True
    assert handle.engine_weight_refs() == []
    with pytest.raises(ConfigError, match="sft_warmup.enabled=true.*simulate_step_s"):
        handle.run_sft([], steps=1, lr=1e-3, batch_size=1)
    handle.shutdown()
