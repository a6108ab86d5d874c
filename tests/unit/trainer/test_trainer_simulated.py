"""trainer.simulate_step_s: no model, the step takes that long without CPU, checkpoints round-trip."""

from __future__ import annotations

import time

import pytest

from roll_async.config.schema import TrainerConfig, load_config, validate_config
from roll_async.errors import ConfigError
from roll_async.trainer import build_trainer
from roll_async.trainer.simulated import SimulatedTrainer


def test_simulate_step_s_builds_the_simulated_trainer_without_loading_a_model():
    trainer = build_trainer(
        TrainerConfig(simulate_step_s=0.2, simulate_sync_s=0.1), "/no/such/model"
    )
    assert (
        isinstance(trainer, SimulatedTrainer) and trainer.state_dict_for_engine() == {}
    )


def test_a_simulated_step_takes_its_time_without_cpu():
    trainer = SimulatedTrainer(TrainerConfig(simulate_step_s=0.3), "m")
    wall, cpu = time.perf_counter(), time.thread_time()
    metrics = trainer.train_step(object(), step=0)
    assert time.perf_counter() - wall >= 0.3
    assert time.thread_time() - cpu < 0.05  # it sleeps: the CPU stays with the rollout
    assert metrics["train/simulated_step_s"] == 0.3 and trainer.optimizer_steps == 1


def test_checkpoint_round_trip(tmp_path):
    trainer = SimulatedTrainer(TrainerConfig(simulate_step_s=0.01), "m")
    trainer.train_step(object(), 0)
    trainer.save_checkpoint(
        tmp_path / "step_0", {"step": 0, "scheduler_seed_state": {"next_group_id": 3}}
    )
    again = SimulatedTrainer(TrainerConfig(simulate_step_s=0.01), "m")
    assert again.load_checkpoint(tmp_path / "step_0")["scheduler_seed_state"] == {
        "next_group_id": 3
    }
    assert again.optimizer_steps == 1


def test_bad_values_are_rejected():
    from pathlib import Path

    default = Path(__file__).resolve().parents[3] / "configs" / "default.yaml"
    with pytest.raises(ConfigError, match="simulate_step_s"):
        validate_config(load_config(default, ["trainer.simulate_step_s=-1"]))
    with pytest.raises(ConfigError, match="sft_warmup"):
        validate_config(
            load_config(
                default, ["trainer.simulate_step_s=1", "sft_warmup.enabled=true"]
            )
        )
