"""Snapshot and pool seats in a full-weight run: each lag's requests go to that lag's engine, lag 0 to the policy's.

In a LoRA run a snapshot seat is an adapter of the policy's engine (test_game_episodes.py); a
full-weight run hands the schedulers one engine per lag (pipelines/snapshot_engines.py). FakeEngines
stand in for the policy's engine and for each lag's, so every request shows where it went.
"""

from __future__ import annotations

import asyncio

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import PipelineConfig, validate_config
from roll_async.errors import LifecycleError
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.game_players import legal_move_reply
from tests.unit.env_managers.test_game_episodes import assert_token_exact, game_config


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


def full_weight_config(
    seats: list[str], *, last_k: int = 0, include_current: bool = False, **keys
) -> PipelineConfig:
    """A game config with no LoRA: snapshots are served by engines of their own."""
    config = game_config("tic_tac_toe", ["random", "policy"], **keys)
    config.custom_envs["Game"].seats = seats
    config.custom_envs["Game"].pool.last_k = last_k
    config.custom_envs["Game"].pool.include_current = include_current
    assert config.trainer.lora.rank == 0
    validate_config(config)
    return config


def scheduler_with_snapshots(
    config: PipelineConfig,
    policy: FakeEngine,
    snapshots: dict[int, FakeEngine],
    tokenizer,
) -> LocalRolloutScheduler:
    return LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=policy,
        tokenizer=tokenizer,
        snapshot_engines={lag: [engine] for lag, engine in snapshots.items()},
    )


async def batches_of(scheduler: LocalRolloutScheduler, steps: int):
    try:
        return [
            await asyncio.wait_for(scheduler.get_batch_with_metrics(step), 20)
            for step in range(steps)
        ]
    finally:
        await scheduler.shutdown()


async def test_a_snapshot_seat_of_a_full_weight_run_plays_on_the_engine_of_its_lag_only(
    tokenizer,
):
    config = full_weight_config(["snapshot:2", "policy"], group_size=2)
    reply = legal_move_reply(tokenizer)
    policy, lag1, lag2 = FakeEngine(reply), FakeEngine(reply), FakeEngine(reply)
    scheduler = scheduler_with_snapshots(config, policy, {1: lag1, 2: lag2}, tokenizer)
    ((batch, metrics),) = await batches_of(scheduler, 1)
    assert {t.role for t in batch} == {"seat1"} and {t.opponents for t in batch} == {
        "snapshot"
    }
    assert lag2.requests and all("snapshot0-" in r.request_id for r in lag2.requests)
    assert {r.adapter_lag for r in lag2.requests} == {0}  # whole weights, no adapter
    assert not lag1.requests
    assert not any("snapshot" in r.request_id for r in policy.requests)
    for trajectory in batch:
        assert (
            trajectory.metrics["game_snapshot_lag_seat0"] == 2.0
        )  # the ratings read it
        assert_token_exact(policy, trajectory, reply)  # only the policy seat trains
    assert metrics["game/Game/elo_games"] > 0


async def test_a_pool_seat_sends_each_game_to_the_engine_of_its_drawn_lag_and_lag_0_to_the_policy(
    tokenizer,
):
    config = full_weight_config(
        ["pool", "policy"], last_k=2, include_current=True, group_size=4
    )
    reply = legal_move_reply(tokenizer)
    engines = {0: FakeEngine(reply), 1: FakeEngine(reply), 2: FakeEngine(reply)}
    scheduler = scheduler_with_snapshots(
        config, engines[0], {1: engines[1], 2: engines[2]}, tokenizer
    )
    batches = await batches_of(scheduler, 2)
    drawn = set()
    for trajectory in (t for batch, _ in batches for t in batch):
        lag = int(trajectory.metrics["game_pool_lag_seat0"])
        assert trajectory.metrics["game_snapshot_lag_seat0"] == lag
        game = f"-g{trajectory.group_id}-e{trajectory.episode_id}-snapshot0-"
        went_to = {
            k
            for k, engine in engines.items()
            if any(game in r.request_id for r in engine.requests)
        }
        assert went_to == {lag}, trajectory.traj_id
        drawn.add(lag)
    assert drawn == {0, 1, 2}


async def test_a_snapshot_engine_that_fails_is_an_env_error_and_the_game_is_replayed(
    tokenizer,
):
    config = game_config(
        "kuhn_poker", ["snapshot:1", "policy"], group_size=1, num_env_groups=1
    )
    # one env; max_retries=2: its first snapshot turn fails all three attempts, then the engine recovers
    snapshot = FakeEngine(legal_move_reply(tokenizer), fail_requests=3)
    scheduler = scheduler_with_snapshots(
        config, FakeEngine(legal_move_reply(tokenizer)), {1: snapshot}, tokenizer
    )
    ((batch, metrics),) = await batches_of(scheduler, 1)
    assert len(batch) == 1 and all(t.stop_reason == "terminated" for t in batch)
    assert metrics["rollout/env_errors"] == 1.0
    (failed,) = [t for fate, t in scheduler.last_unserved if fate == "env_error"]
    assert "the snapshot seat custom_envs.Game.seats[0] failed" in (failed.error or "")


def test_snapshot_engines_that_leave_out_a_lag_the_seats_play_fail_when_the_env_managers_are_built(
    tokenizer,
):
    config = full_weight_config(["pool", "policy"], last_k=2)
    with pytest.raises(
        LifecycleError,
        match=r"seats play the policy 2 syncs back, but this rollout has no engine for it",
    ):
        scheduler_with_snapshots(config, FakeEngine(), {1: FakeEngine()}, tokenizer)
