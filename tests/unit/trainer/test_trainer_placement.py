"""trainer.placement / trainer.num_gpus: rejected combinations name the key and the fix; the device follows Ray's GPUs."""

from __future__ import annotations

import pytest
import torch

from roll_async.config.schema import load_config
from roll_async.errors import ConfigError
from roll_async.trainer.grpo_trainer import resolve_device


def test_defaults_keep_the_trainer_in_the_driver_without_gpus():
    config = load_config("configs/sokoban.yaml")
    assert config.trainer.placement == "driver" and config.trainer.num_gpus == 0


def test_a_ray_actor_trainer_with_gpus_is_accepted():
    config = load_config(
        "configs/sokoban.yaml", ["trainer.placement=ray_actor", "trainer.num_gpus=0.5"]
    )
    assert config.trainer.placement == "ray_actor" and config.trainer.num_gpus == 0.5


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["trainer.placement=gpu_node"],
            r"trainer\.placement='gpu_node' is unknown; use driver or ray_actor",
        ),
        (
            ["trainer.num_gpus=1"],
            r"trainer\.num_gpus=1\.0 needs trainer\.placement=ray_actor .*set trainer\.placement=ray_actor",
        ),
        (
            ["trainer.placement=ray_actor", "trainer.num_gpus=-1"],
            r"trainer\.num_gpus=-1\.0: must be >= 0",
        ),
        (
            ["trainer.placement=ray_actor", "trainer.simulate_step_s=0.5"],
            r"simulated trainer .* runs in the driver; set trainer\.placement=driver",
        ),
        (
            ["trainer.placement=ray_actor", "trainer.device=cuda:0"],
            r"trainer\.device='cuda:0' .*trainer\.num_gpus=0: Ray gives the actor no GPU; set trainer\.num_gpus",
        ),
    ],
)
def test_bad_placement_is_one_line_naming_key_and_fix(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config("configs/sokoban.yaml", overrides)
    assert "\n" not in str(info.value)


def test_auto_device_in_an_actor_uses_cuda_only_on_gpus_ray_assigned():
    cuda = torch.cuda.is_available()
    # no GPU given: never take a visible one
    assert resolve_device("auto", ray_gpu_ids=[]) == torch.device("cpu")
    assert resolve_device("auto", ray_gpu_ids=[0]) == torch.device(
        "cuda" if cuda else "cpu"
    )
    # an explicit trainer.device wins
    assert resolve_device("cpu", ray_gpu_ids=[0]) == torch.device("cpu")
