"""rollout_metrics: every rollout metric name, computed from one batch."""

from __future__ import annotations

import asyncio

import pytest

from roll_async import metrics as M
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import scripted_env_factory
from roll_async.trajectory import Trajectory, TurnRecord


def trajectory(
    tag: str,
    stop: str,
    created: int,
    oldest: int,
    reward: float,
    turns: int,
    generated: int,
) -> Trajectory:
    records = [
        TurnRecord(
            turn=i,
            action_text="a",
            observation="o",
            reward=0.0,
            generated_tokens=generated,
            weight_version=oldest,
            generate_s=0.1 * (i + 1),
            env_step_s=0.01,
            metrics={"success": float(i == turns - 1)},
        )
        for i in range(turns)
    ]
    return Trajectory(
        tag=tag,
        group_id=0,
        episode_id=0,
        env_id=0,
        seed=0,
        traj_id="x",
        created_step=created,
        token_ids=[1] * (5 + generated * turns),
        response_mask=[0] * 5 + [1] * (generated * turns),
        logprobs=[0.0] * (5 + generated * turns),
        turns=records,
        episode_reward=reward,
        stop_reason=stop,
        oldest_weight_version=oldest,
        newest_weight_version=oldest,
        metrics={"success": 1.0 if stop == "terminated" else 0.0},
    )


def test_rollout_metrics_have_the_design_names_and_values():
    batch = [
        trajectory(
            "a", "terminated", created=3, oldest=3, reward=1.0, turns=2, generated=4
        ),
        trajectory(
            "a", "max_length", created=2, oldest=2, reward=0.0, turns=1, generated=8
        ),
        trajectory(
            "b", "max_steps", created=3, oldest=1, reward=0.5, turns=3, generated=2
        ),
        trajectory(
            "b", "terminated", created=3, oldest=3, reward=0.5, turns=1, generated=2
        ),
    ]
    out = M.rollout_metrics(
        batch,
        step=3,
        wait_s=0.5,
        window_s=2.0,
        counters={"dropped_stale_groups": 1, "filtered_groups": 2, "env_errors": 3},
        gauges={"stalled_envs": 1},
        engine_stats=[
            {"running": 2, "waiting": 1, "kv_cache_usage": 0.5},
            {"running": 1, "waiting": 0, "kv_cache_usage": 0.25},
        ],
    )
    design_names = [
        "rollout/trajectories_per_s",
        "rollout/tokens_per_s",
        "rollout/get_batch_wait_s",
        "rollout/turns/mean",
        "rollout/turns/max",
        "rollout/response_length/mean",
        "rollout/response_length/max",
        "rollout/natural_termination_rate",
        "rollout/truncation_rate",
        "rollout/max_steps_rate",
        "rollout/staleness/mean",
        "rollout/staleness/max",
        "rollout/dropped_stale_groups",
        "rollout/filtered_groups",
        "rollout/env_errors",
        "engine/running",
        "engine/waiting",
        "engine/kv_cache_usage",
        "time/generate/mean",
        "time/generate/p99",
        "time/env_step/mean",
        "time/env_step/p99",
    ]
    assert not [name for name in design_names if name not in out]
    assert out["rollout/trajectories_per_s"] == 2.0
    assert out["rollout/tokens_per_s"] == (8 + 8 + 6 + 2) / 2.0
    assert out["rollout/turns/max"] == 3 and out["rollout/turns/mean"] == pytest.approx(
        7 / 4
    )
    assert out["rollout/natural_termination_rate"] == 0.5
    assert (
        out["rollout/truncation_rate"] == 0.25 and out["rollout/max_steps_rate"] == 0.25
    )
    assert out["rollout/staleness/max"] == 1 and out["rollout/staleness/mean"] == 0.25
    assert out["rollout/weight_version_lag/max"] == 2
    assert (
        out["rollout/dropped_stale_groups"],
        out["rollout/filtered_groups"],
        out["rollout/env_errors"],
    ) == (1, 2, 3)
    assert out["rollout/stalled_envs"] == 1
    assert (
        out["engine/running"],
        out["engine/waiting"],
        out["engine/kv_cache_usage"],
    ) == (3, 1, 0.375)
    assert out["time/generate/p99"] == pytest.approx(0.3)
    assert out["env/a/success"] == 0.5 and out["env/b/episode_reward"] == 0.5


def test_percentile_and_summarize():
    assert M.percentile([], 99) == 0.0
    assert M.percentile([1, 2, 3, 4], 50) == 2
    assert M.percentile(list(range(1, 101)), 99) == 99
    summary = M.summarize("x", [1.0, 3.0])
    assert (
        summary["x/mean"] == 2.0 and summary["x/max"] == 3.0 and summary["x/std"] == 1.0
    )


def test_validation_metrics_per_tag():
    batch = [
        trajectory("a", "terminated", 0, 0, 1.0, 1, 1),
        trajectory("b", "env_error", 0, 0, 0.0, 1, 1),
    ]
    out = M.validation_metrics(batch)
    assert out["val/a/episode_reward"] == 1.0 and out["val/b/episode_reward"] == 0.0
    assert out["val/env_errors"] == 1 and out["val/success"] == 0.5


def test_validation_metrics_give_game_rates_per_role_and_opponent():
    games = [
        trajectory("ValAsX", "terminated", 0, 0, 1.0, 1, 1),
        trajectory("ValAsX", "terminated", 0, 0, -1.0, 1, 1),
    ]
    for game, won in zip(games, (1.0, 0.0)):
        game.role, game.opponents = "seat0", "random"
        game.metrics = {"game_win": won, "game_loss": 1.0 - won, "game_draw": 0.0}
    out = M.validation_metrics(games)
    assert out["val/game/ValAsX/seat0/vs_random/win_rate"] == 0.5
    assert out["val/game/ValAsX/seat0/vs_random/loss_rate"] == 0.5
    assert out["val/ValAsX/game_win"] == 0.5


def test_weight_version_lag_counts_from_the_engines_base_version():
    """Engines that started at version 7 serve 7 + step at step ``step``: a fresh trajectory lags by 0."""
    batch = [
        trajectory(
            "a", "terminated", created=2, oldest=9, reward=1.0, turns=1, generated=2
        ),
        trajectory(
            "a", "terminated", created=1, oldest=8, reward=1.0, turns=1, generated=2
        ),
    ]
    out = M.rollout_metrics(batch, step=2, version_base=7)
    assert out["rollout/weight_version_lag/max"] == 1
    assert out["rollout/weight_version_lag/mean"] == 0.5


async def test_a_scheduler_on_engines_resumed_at_version_n_reports_no_lag_when_on_policy():
    """The scheduler knows the engines' base version; sync trajectories of step 0 on version N lag by 0."""
    config = PipelineConfig(
        seed=3,
        rollout_batch_size=2,
        sequence_length=512,
        custom_envs={
            "count": CustomEnvConfig(
                env_type="scripted",
                env_config={"episode_length": 1},
                max_tokens_per_step=8,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=2, tags=["count"]
        ),
    )
    validate_config(config)
    runner = LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=FakeEngine(weight_version=5),
        tokenizer=build_chatml_test_tokenizer(),
        env_factory=scripted_env_factory,
        version_base=5,
    )
    try:
        batch, metrics = await asyncio.wait_for(runner.get_batch_with_metrics(0), 10)
    finally:
        await runner.shutdown()
    assert [t.oldest_weight_version for t in batch] == [5, 5]
    assert metrics["rollout/weight_version_lag/max"] == 0


def test_weight_version_lag_uses_the_version_the_engines_report():
    """A rollout-only run never advances the engines: its trajectories lag by 0 at every step."""
    batch = [
        trajectory(
            "a", "terminated", created=4, oldest=3, reward=1.0, turns=1, generated=2
        )
    ]
    out = M.rollout_metrics(
        batch, step=4, engine_stats=[{"weight_version": 3}, {"running": 1}]
    )
    assert out["rollout/weight_version_lag/max"] == 0
