"""The OpenEnv and GEM configs train 2 steps each on the real engine, and the library's reward reaches metrics.jsonl.

``configs/openenv_guess.yaml`` serves an OpenEnv class on each rollout worker's loopback server;
``configs/gem_guess_the_number.yaml`` plays GEM's GuessTheNumber. Both run on the session's engine
(the tiny model) with small batches. The OpenEnv run's builder guesses 1 with ``high: 1``, so every
reward is the server's 1.0; a random-init model rarely writes GEM's ``\\boxed{N}``, so GEM's rewards
are its own format-error -0.1 (or its game rewards), never 0 from a silent adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll_async.config.schema import load_config
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from tests.integration.short_runs import IN_PROCESS

pytestmark = pytest.mark.integration

pytest.importorskip("openenv")
pytest.importorskip("gem")

REPO = Path(__file__).resolve().parents[2]
COMMON = [
    "max_steps=2",
    *IN_PROCESS,
    "train_env_manager.max_env_num_per_worker=4",
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def train(name: str, engine, tmp_path: Path, *overrides: str):
    config = load_config(
        REPO / "configs" / f"{name}.yaml",
        [f"output_dir={tmp_path / name}", *COMMON, *overrides],
    )
    run = await AgenticPipeline(config, engines=[engine]).run()
    metrics = [m for m in read_jsonl(run / "metrics.jsonl") if m["step"] >= 0]
    assert [m["step"] for m in metrics] == [0, 1]
    assert all(m["train/loss"] is not None for m in metrics), metrics
    trajectories = read_jsonl(run / "trajectories.jsonl")
    assert len(trajectories) == 8
    assert not [t for t in trajectories if t["stop_reason"] == "env_error"], [
        t.get("error") for t in trajectories
    ]
    return metrics, trajectories


@pytest.mark.timeout(300)
async def test_the_openenv_and_gem_configs_train_two_steps(
    engine, tmp_path, monkeypatch
):
    monkeypatch.chdir(
        REPO
    )  # the OpenEnv class is examples.openenv_guess, the builder tests.integration.*
    tag = "OpenEnvGuess"
    metrics, trajectories = await train(
        "openenv_guess",
        engine,
        tmp_path,
        f"custom_envs.{tag}.env_config.env_kwargs.high=1",
        f"custom_envs.{tag}.env_config.action_builder=tests.integration.openenv_builders:guess_one",
        f"custom_envs.{tag}.env_config.action_pattern=null",
    )
    for step in metrics:
        assert step[f"env/{tag}/episode_reward"] == 1.0
        assert step[f"env/{tag}/success"] == 1.0
    for trajectory in trajectories:
        assert "Guess my number from 1 to 4." in trajectory["text"]
        assert (
            "I picked a number from 1 to 1." in trajectory["text"]
        )  # the server's first observation

    tag = "GemGuessTheNumber"
    metrics, trajectories = await train("gem_guess_the_number", engine, tmp_path)
    for trajectory in trajectories:
        # GEM's instruction opens the first user turn
        assert "You are playing Guess The Number." in trajectory["text"]
    for step in metrics:
        rewards = [
            t["episode_reward"]
            for t in trajectories
            if t["created_step"] == step["step"]
        ]
        assert len(rewards) == 4
        assert step[f"env/{tag}/episode_reward"] == pytest.approx(sum(rewards) / 4)
        assert (
            step[f"env/{tag}/episode_reward"] != 0.0
        )  # GEM's own rewards (-0.1 for a format error)
        assert f"env/{tag}/success" in step
