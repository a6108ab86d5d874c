"""Run directory and metrics tracking: every line parses, optional backends fail early and clearly."""

from __future__ import annotations

import json
import sys

import pytest

from roll_async.config.schema import LoggingConfig
from roll_async.errors import ConfigError
from roll_async.run_output.run_dir import RunDirectory
from roll_async.run_output.tracking import MetricsTracker
from roll_async.trajectory import Trajectory, TurnRecord


def test_metrics_lines_parse_even_with_nan(tmp_path):
    run = RunDirectory(tmp_path)
    tracker = MetricsTracker(LoggingConfig(), run, {})
    tracker.log(0, {"train/loss": float("nan"), "rollout/tokens_per_s": 12.5})
    tracker.close()
    (line,) = run.metrics_path.read_text().splitlines()
    assert json.loads(line) == {
        "step": 0,
        "train/loss": None,
        "rollout/tokens_per_s": 12.5,
    }


def test_trajectory_lines_carry_identifiers_turns_and_served_step(tmp_path):
    run = RunDirectory(tmp_path)
    trajectory = Trajectory(
        tag="T",
        group_id=3,
        episode_id=1,
        env_id=7,
        seed=11,
        traj_id="T-g3-e1",
        created_step=2,
        token_ids=[1, 2, 3],
        response_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.1],
        turns=[TurnRecord(0, "<answer>Up</answer>", "grid", 1.0, 2, 4, 0.1, 0.01)],
    )
    run.append_trajectories([trajectory], served_step=3)
    record = json.loads(run.trajectories_path.read_text())
    assert (
        record["served_step"],
        record["created_step"],
        record["response_length"],
    ) == (3, 2, 2)
    assert record["turns"][0]["action_text"] == "<answer>Up</answer>"


@pytest.mark.parametrize(
    "backend, module", [("tensorboard", "torch.utils.tensorboard"), ("wandb", "wandb")]
)
def test_missing_optional_backend_names_the_key_and_the_install(
    tmp_path, monkeypatch, backend, module
):
    monkeypatch.setitem(
        sys.modules, module, None
    )  # as if the package were not installed
    with pytest.raises(
        ConfigError, match=rf"logging.{backend}=true needs .*pip install"
    ):
        MetricsTracker(LoggingConfig(**{backend: True}), RunDirectory(tmp_path), {})
