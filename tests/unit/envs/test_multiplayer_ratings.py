"""Elo-style ratings of the policy against its snapshots: a policy that beats its past rises above it."""

from __future__ import annotations

import pytest

from roll_async.config.schema import TrainerConfig
from roll_async.envs.multiplayer.ratings import (
    PoolRatings,
    SnapshotRatings,
    expected_score,
)
from roll_async.trainer.simulated import SimulatedTrainer
from roll_async.trajectory import Trajectory


def game(version: int, lag: int, result: str, tag: str = "Game") -> Trajectory:
    t = Trajectory(
        tag=tag, group_id=0, episode_id=0, env_id=0, seed=0, traj_id="t", created_step=0
    )
    t.role, t.opponents, t.newest_weight_version = "seat1", "pool", version
    t.metrics = {
        "game_win": float(result == "win"),
        "game_draw": float(result == "draw"),
        "game_loss": float(result == "loss"),
        "game_snapshot_lag_seat0": float(lag),
    }
    return t


def test_equal_ratings_expect_half_and_a_win_moves_both_by_the_same_amount():
    assert expected_score(1000, 1000) == 0.5
    ratings = SnapshotRatings(k_factor=16)
    ratings.play(3, 1, 1.0)
    assert ratings.ratings == {3: 1008.0, 1: 992.0}
    assert (
        ratings.rating(5) == 1008.0
    )  # a new version starts where the newest before it stands
    assert ratings.rating(0) == 1000.0


def test_a_policy_that_keeps_beating_its_snapshots_climbs_and_one_that_draws_stays():
    winning, drawing = PoolRatings(), PoolRatings()
    for step in range(1, 9):
        won = winning.update([game(step, lag, "win") for lag in (1, 2)])
        drew = drawing.update([game(step, lag, "draw") for lag in (1, 2)])
    assert won["game/Game/policy_elo"] > won["game/Game/pool_elo"] + 20
    assert drew["game/Game/policy_elo"] == pytest.approx(1000.0)
    assert won["game/Game/elo_games"] == 2.0


def test_games_without_one_snapshot_opponent_or_unfinished_are_not_rated():
    ratings = PoolRatings()
    scripted = game(2, 1, "win")
    del scripted.metrics["game_snapshot_lag_seat0"]  # against a scripted player
    unfinished = game(2, 1, "win")
    unfinished.metrics = {"game_unfinished": 1.0, "game_snapshot_lag_seat0": 1.0}
    single_agent = game(2, 1, "win")
    single_agent.role = ""
    assert ratings.update([scripted, unfinished, single_agent]) == {}


def test_a_game_against_the_current_policy_itself_rates_nothing():
    ratings = PoolRatings()
    assert ratings.update([game(4, 0, "win"), game(4, 0, "loss")]) == {}
    assert ratings.state() == {}


def test_a_resumed_run_goes_on_rating_from_its_checkpoint(tmp_path):
    """The ratings ride in the checkpoint's extra state (as the pipeline saves them): a run interrupted
    after step 4 and resumed rates steps 5-8 exactly as the run that never stopped."""
    steps = {s: [game(s, 1, "win"), game(s, 2, "loss")] for s in range(1, 9)}
    steps[3] += [game(3, 2, "draw", tag="Other")]
    whole, interrupted = PoolRatings(), PoolRatings()
    for s in range(1, 5):
        whole.update(steps[s])
        interrupted.update(steps[s])
    saving = SimulatedTrainer(TrainerConfig(simulate_step_s=0.0), "m")
    saving.save_checkpoint(
        tmp_path / "step_4", {"step": 4, "pool_ratings": interrupted.state()}
    )
    extra = SimulatedTrainer(TrainerConfig(simulate_step_s=0.0), "m").load_checkpoint(
        tmp_path / "step_4"
    )
    resumed = PoolRatings.from_state(extra["pool_ratings"])
    assert resumed == interrupted and set(resumed.by_tag) == {"Game", "Other"}
    for s in range(5, 9):
        assert resumed.update(steps[s]) == whole.update(steps[s])
    # a checkpoint from before ratings were saved resumes with fresh ones
    assert PoolRatings.from_state(None) == PoolRatings()
