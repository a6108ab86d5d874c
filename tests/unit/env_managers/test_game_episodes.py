"""Games with seats end to end in one process: built-in games, FakeEngine, the real group queue and collator."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
import torch

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.envs.multiplayer.kuhn_poker import parse_card
from roll_async.errors import LifecycleError
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.scheduler.validation import (
    ValidationScheduler,
    build_validation_episodes,
)
from roll_async.testing import game_players
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.game_players import legal_move_reply
from roll_async.trainer.advantages import compute_advantages
from roll_async.trainer.collate import collate_trajectories
from roll_async.trajectory import Trajectory


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


def game_config(
    env_type: str,
    seats: list[str],
    *,
    group_size: int = 2,
    num_env_groups: int = 2,
    mode: str = "sync",
    max_staleness: int | None = None,
    sequence_length: int = 1024,
    max_steps: int = 9,
) -> PipelineConfig:
    trained = sum(s == "policy" for s in seats)
    config = PipelineConfig(
        mode=mode,
        max_staleness=max_staleness,
        rollout_batch_size=group_size * trained,
        sequence_length=sequence_length,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Game": CustomEnvConfig(
                env_type=env_type,
                seats=seats,
                max_steps=max_steps,
                max_tokens_per_step=24,
                system_prompt="Play the game.",
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=num_env_groups,
            group_size=group_size,
            tags=["Game"],
            env_step_timeout_s=5.0,
        ),
    )
    validate_config(config)
    return config


def scheduler_for(
    config: PipelineConfig, engine: FakeEngine, tokenizer, opponents=None
):
    return LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=engine,
        tokenizer=tokenizer,
        opponents=opponents,
    )


async def one_batch(
    config, engine, tokenizer, steps: int = 1
) -> list[list[Trajectory]]:
    scheduler = scheduler_for(config, engine, tokenizer)
    batches = []
    try:
        for step in range(steps):
            batches.append(await asyncio.wait_for(scheduler.get_batch(step=step), 20))
    finally:
        await scheduler.shutdown()
    return batches


def requests_of(engine: FakeEngine, trajectory: Trajectory):
    """The engine requests one seat's trajectory made, in order."""
    return [r for r in engine.requests if f"{trajectory.traj_id}-env" in r.request_id]


def assert_token_exact(engine: FakeEngine, trajectory: Trajectory, reply) -> None:
    """Every request of the seat sent a prefix of its ids; its mask-1 tokens are exactly its own replies."""
    requests = requests_of(engine, trajectory)
    assert requests, trajectory.traj_id
    generated: list[int] = []
    for request in requests:
        prompt = request.prompt_token_ids
        assert trajectory.token_ids[: len(prompt)] == prompt
        out = reply(request)[: request.max_tokens]
        assert trajectory.token_ids[len(prompt) : len(prompt) + len(out)] == out
        assert trajectory.response_mask[len(prompt) : len(prompt) + len(out)] == [
            1
        ] * len(out)
        generated += out
    trained = [t for t, m in zip(trajectory.token_ids, trajectory.response_mask) if m]
    assert (
        trained == generated
    )  # nothing else (the opponent's moves, the env's text) is trained on
    assert len(trajectory.token_versions) == len(trajectory.token_ids)
    assert all(
        (v >= 0) == bool(m)
        for v, m in zip(trajectory.token_versions, trajectory.response_mask)
    )


async def test_self_play_gives_one_token_exact_trajectory_per_seat_in_whole_groups(
    tokenizer,
):
    config = game_config("tic_tac_toe", ["policy", "policy"], group_size=2)
    reply = legal_move_reply(tokenizer)
    engine = FakeEngine(reply)
    (batch,) = await one_batch(config, engine, tokenizer)
    assert len(batch) == config.rollout_batch_size == 4  # 2 games x 2 policy seats
    assert len({t.group_id for t in batch}) == 1
    assert len({t.seed for t in batch}) == 1
    assert sorted(t.role for t in batch) == ["seat0", "seat0", "seat1", "seat1"]
    games = defaultdict(list)
    for trajectory in batch:
        games[trajectory.episode_id].append(trajectory)
        assert trajectory.stop_reason == "terminated"
        assert not trajectory.game_seats  # flattened by the queue
        assert_token_exact(engine, trajectory, reply)
    for seats in games.values():
        assert sorted(t.role for t in seats) == ["seat0", "seat1"]
        assert sum(t.episode_reward for t in seats) == 0.0  # zero-sum
    # first legal cell each move: X takes 0, 2, 4, 6 and wins on the diagonal 2-4-6
    seat0 = next(t for t in batch if t.role == "seat0")
    assert seat0.episode_reward == 1.0 and seat0.metrics["game_win"] == 1.0
    text = tokenizer.decode(seat0.token_ids)
    assert "You are Player 0 (X)" in text and "You are Player 1 (O)" not in text
    assert (
        "Player 1 (O) took cell 1." in text
    )  # the opponent's move reaches it as an observation


async def test_kuhn_poker_seats_never_see_the_other_seats_card(tokenizer):
    config = game_config(
        "kuhn_poker", ["policy", "policy"], group_size=2, num_env_groups=3
    )
    reply = legal_move_reply(
        tokenizer, pick=1
    )  # bet, then call: every hand reaches a showdown
    engine = FakeEngine(reply)
    batches = await one_batch(config, engine, tokenizer, steps=2)
    for batch in batches:
        for episode in {t.episode_id for t in batch}:
            seats = {t.role: t for t in batch if t.episode_id == episode}
            own = {
                role: parse_card(tokenizer.decode(t.token_ids))
                for role, t in seats.items()
            }
            assert own["seat0"] and own["seat1"] and own["seat0"] != own["seat1"]
            for role, trajectory in seats.items():
                other = own["seat1" if role == "seat0" else "seat0"]
                text = tokenizer.decode(trajectory.token_ids)
                assert f"Your card: {other}" not in text
                for request in requests_of(engine, trajectory):
                    assert f"Your card: {other}" not in tokenizer.decode(
                        request.prompt_token_ids
                    )
                assert_token_exact(engine, trajectory, reply)
            assert seats["seat0"].episode_reward == -seats["seat1"].episode_reward != 0


async def test_a_scripted_seat_gives_no_trajectory_and_group_size_counts_games(
    tokenizer,
):
    config = game_config(
        "tic_tac_toe", ["heuristic", "policy"], group_size=3, num_env_groups=1
    )
    scheduler = scheduler_for(
        config, FakeEngine(legal_move_reply(tokenizer)), tokenizer
    )
    try:
        batch, metrics = await asyncio.wait_for(scheduler.get_batch_with_metrics(0), 20)
    finally:
        await scheduler.shutdown()
    assert len(batch) == 3 and {t.role for t in batch} == {"seat1"}
    assert {t.opponents for t in batch} == {"heuristic"}
    assert metrics["game/Game/seat1/vs_heuristic/loss_rate"] == 1.0
    assert metrics["game/Game/seat1/vs_heuristic/win_rate"] == 0.0
    assert metrics["game/Game/seat1/vs_heuristic/invalid_move_rate"] == 0.0
    assert len({t.episode_id for t in batch}) == 3
    for trajectory in batch:
        assert (
            trajectory.metrics["game_loss"] == 1.0
        )  # the heuristic beats "first legal cell"
        assert trajectory.episode_reward == -1.0
        text = tokenizer.decode(trajectory.token_ids)
        assert (
            "Player 0 (X) took cell 4." in text
        )  # the heuristic's opening, seen, never trained on


async def test_async_mode_serves_games_of_several_steps(tokenizer):
    config = game_config(
        "kuhn_poker", ["policy", "random"], group_size=2, mode="async", max_staleness=2
    )
    engine = FakeEngine(legal_move_reply(tokenizer))
    batches = await one_batch(config, engine, tokenizer, steps=3)
    for batch in batches:
        assert len(batch) == 2 and {t.role for t in batch} == {"seat0"}
        assert len({t.group_id for t in batch}) == 1
        assert all(t.stop_reason == "terminated" for t in batch)


async def test_a_failing_scripted_seat_is_an_env_error_counted_and_replayed(tokenizer):
    config = game_config(
        "tic_tac_toe",
        ["policy", "scripted:roll_async.testing.game_players:fails_once"],
        group_size=2,
        num_env_groups=1,
    )
    game_players.FAIL_AFTER["calls"] = 2
    scheduler = scheduler_for(
        config, FakeEngine(legal_move_reply(tokenizer)), tokenizer
    )
    try:
        batch, metrics = await asyncio.wait_for(scheduler.get_batch_with_metrics(0), 20)
    finally:
        await scheduler.shutdown()
        game_players.FAIL_AFTER["calls"] = 0
    assert len(batch) == 2 and all(t.stop_reason == "terminated" for t in batch)
    assert metrics["rollout/env_errors"] == 1.0
    failed = [t for fate, t in scheduler.last_unserved if fate == "env_error"]
    assert len(failed) == 1 and "scripted player" in (failed[0].error or "")


def seat_trajectory(group: int, episode: int, role: str, reward: float) -> Trajectory:
    return Trajectory(
        tag="Game",
        group_id=group,
        episode_id=episode,
        env_id=0,
        seed=0,
        traj_id=f"g{group}-e{episode}-{role}",
        created_step=0,
        token_ids=[1, 2],
        response_mask=[0, 1],
        logprobs=[0.0, -1.0],
        episode_reward=reward,
        role=role,
    )


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_advantages_are_normalised_per_role_so_a_first_mover_edge_is_not_rewarded(
    estimator,
):
    # seat0 moves first and wins 3 games of 4: without roles seat0 would look better in every game
    rewards0 = [1.0, 1.0, 1.0, -1.0]
    batch = [
        seat_trajectory(7, e, role, r if role == "seat0" else -r)
        for e, r in enumerate(rewards0)
        for role in ("seat0", "seat1")
    ]
    collated = collate_trajectories(batch, pad_token_id=0)
    assert collated.group_index.tolist() == [0, 1] * 4
    advantages = compute_advantages(collated.rewards, collated.group_index, estimator)
    by_role = {
        role: sorted(a for a, t in zip(advantages.tolist(), batch) if t.role == role)
        for role in ("seat0", "seat1")
    }
    assert by_role["seat0"] == pytest.approx(sorted(-a for a in by_role["seat1"]))
    assert sum(by_role["seat0"]) == pytest.approx(0.0, abs=1e-6)
    assert sum(by_role["seat1"]) == pytest.approx(0.0, abs=1e-6)
    # the same distribution for both roles: the edge cancels out of both means
    assert sorted(abs(a) for a in by_role["seat0"]) == pytest.approx(
        sorted(abs(a) for a in by_role["seat1"])
    )
    single = compute_advantages(
        collated.rewards, torch.zeros_like(collated.group_index), estimator
    )
    # role-blind, one baseline for both seats: the first mover's edge becomes its advantage
    seat0_rows = [i for i, t in enumerate(batch) if t.role == "seat0"]
    assert float(single[seat0_rows].mean()) > 0.4


def test_single_agent_trajectories_keep_one_group_per_group_id():
    batch = [seat_trajectory(3, e, "", float(e)) for e in range(3)]
    assert collate_trajectories(batch, pad_token_id=0).group_index.tolist() == [0, 0, 0]


async def test_a_seat_whose_turns_are_spent_forfeits_and_ends_max_steps(tokenizer):
    config = game_config(
        "tic_tac_toe", ["policy", "policy"], group_size=1, num_env_groups=1, max_steps=1
    )
    reply = legal_move_reply(tokenizer)
    engine = FakeEngine(reply)
    (batch,) = await one_batch(config, engine, tokenizer)
    seats = {t.role: t for t in batch}
    # X moves once, O once; X has no turn left: it replies nothing, twice, and forfeits
    assert [len(t.turns) for t in (seats["seat0"], seats["seat1"])] == [1, 1]
    assert seats["seat0"].stop_reason == "max_steps"
    assert seats["seat0"].metrics["game_invalid_moves"] == 2.0
    assert (seats["seat0"].episode_reward, seats["seat1"].episode_reward) == (-1.0, 1.0)
    assert seats["seat1"].stop_reason == "terminated"
    for trajectory in batch:
        assert_token_exact(engine, trajectory, reply)


async def test_validation_plays_each_game_once_and_reports_every_policy_seat(tokenizer):
    config = game_config("kuhn_poker", ["policy", "policy"], group_size=1)
    config.val_env_manager = EnvManagerConfig(
        num_env_groups=3, group_size=1, tags=["Game"]
    )
    validate_config(config)
    spec = rollout_spec(config, "val")
    episodes = build_validation_episodes(spec)
    runner = LocalRolloutScheduler(
        spec, engines=FakeEngine(legal_move_reply(tokenizer)), tokenizer=tokenizer
    )
    validation = ValidationScheduler(runner, episodes)
    try:
        trajectories, metrics = await asyncio.wait_for(validation.evaluate(step=0), 20)
    finally:
        await validation.shutdown()
    assert [(t.seed, t.role) for t in trajectories] == [
        (e.seed, role) for e in episodes for role in ("seat0", "seat1")
    ]
    assert metrics["val/Game/game_win"] == pytest.approx(0.5)  # one winner per game


async def test_a_game_that_does_not_end_stops_at_its_move_limit_with_no_rewards(
    tokenizer,
):
    config = game_config(
        "roll_async.testing.game_players:EndlessGame",
        ["policy", "random"],
        group_size=1,
        num_env_groups=1,
        max_steps=2,
    )
    engine = FakeEngine(legal_move_reply(tokenizer))
    (batch,) = await one_batch(config, engine, tokenizer)
    (trajectory,) = batch
    assert trajectory.stop_reason == "max_steps"
    assert len(trajectory.turns) == 2  # its max_steps; then it replies nothing
    assert trajectory.episode_reward == 0.0
    assert trajectory.metrics["game_unfinished"] == 1.0


async def test_a_frozen_seat_plays_on_its_own_engine_and_is_never_trained(tokenizer):
    config = game_config(
        "tic_tac_toe", ["policy", "frozen:old-model"], group_size=2, num_env_groups=1
    )
    reply = legal_move_reply(tokenizer)
    policy, frozen = FakeEngine(reply), FakeEngine(legal_move_reply(tokenizer, pick=1))
    scheduler = scheduler_for(
        config, policy, tokenizer, opponents={"old-model": ([frozen], tokenizer)}
    )
    try:
        batch, metrics = await asyncio.wait_for(scheduler.get_batch_with_metrics(0), 20)
    finally:
        await scheduler.shutdown()
    assert len(batch) == 2 and {t.role for t in batch} == {"seat0"}
    assert {t.opponents for t in batch} == {"frozen"}
    assert frozen.requests and all("frozen1-" in r.request_id for r in frozen.requests)
    assert not any("frozen" in r.request_id for r in policy.requests)
    for trajectory in batch:
        assert_token_exact(engine=policy, trajectory=trajectory, reply=reply)
        # the frozen model's moves (the second legal cell) reach the policy seat only as observations
        assert "Player 1 (O) took cell 2." in tokenizer.decode(trajectory.token_ids)
        assert sum(trajectory.response_mask) == sum(
            len(reply(r)) for r in requests_of(policy, trajectory)
        )
    # the frozen seat kept its own conversation: each of its requests extends its previous one
    prompts = [r.prompt_token_ids for r in frozen.requests if "-e0-" in r.request_id]
    assert all(b[: len(a)] == a for a, b in zip(prompts, prompts[1:]))
    assert "game/Game/seat0/vs_frozen/win_rate" in metrics


async def test_a_frozen_engine_that_fails_is_an_env_error_and_the_game_is_replayed(
    tokenizer,
):
    config = game_config(
        "kuhn_poker", ["frozen:old-model", "policy"], group_size=1, num_env_groups=1
    )
    # one env; max_retries=2: its first frozen turn fails all three attempts, then the engine recovers
    frozen = FakeEngine(legal_move_reply(tokenizer), fail_requests=3)
    scheduler = scheduler_for(
        config,
        FakeEngine(legal_move_reply(tokenizer)),
        tokenizer,
        opponents={"old-model": ([frozen], tokenizer)},
    )
    try:
        batch, metrics = await asyncio.wait_for(scheduler.get_batch_with_metrics(0), 20)
    finally:
        await scheduler.shutdown()
    assert len(batch) == 1 and all(t.stop_reason == "terminated" for t in batch)
    assert metrics["rollout/env_errors"] == 1.0
    (failed,) = [t for fate, t in scheduler.last_unserved if fate == "env_error"]
    assert "the frozen seat custom_envs.Game.seats[0] failed" in (failed.error or "")


def test_a_frozen_seat_without_an_engine_fails_when_the_env_managers_are_built(
    tokenizer,
):
    config = game_config("tic_tac_toe", ["policy", "frozen:old-model"])
    with pytest.raises(
        LifecycleError,
        match=r"seats\[1\] is a frozen model, but this rollout has no engine",
    ):
        scheduler_for(config, FakeEngine(legal_move_reply(tokenizer)), tokenizer)


async def test_a_snapshot_seat_plays_on_the_policy_engine_k_adapters_back_and_is_never_trained(
    tokenizer,
):
    config = game_config("tic_tac_toe", ["random", "policy"], group_size=2)
    config.trainer.lora.rank = 8  # snapshots are LoRA adapters of the policy's engines
    config.custom_envs["Game"].seats = ["snapshot:2", "policy"]
    validate_config(config)
    reply = legal_move_reply(tokenizer)
    engine = FakeEngine(reply)
    (batch,) = await one_batch(config, engine, tokenizer)
    assert {t.role for t in batch} == {"seat1"} and {t.opponents for t in batch} == {
        "snapshot"
    }
    snapshot = [r for r in engine.requests if "snapshot0-" in r.request_id]
    assert snapshot and {r.adapter_lag for r in snapshot} == {2}
    assert {r.adapter_lag for r in engine.requests if r not in snapshot} == {0}
    for trajectory in batch:
        assert_token_exact(
            engine, trajectory, reply
        )  # only the policy seat's own replies are trained


async def test_a_pool_seat_draws_its_snapshot_per_game_from_the_last_k(tokenizer):
    config = game_config(
        "tic_tac_toe", ["random", "policy"], group_size=4, num_env_groups=2
    )
    config.trainer.lora.rank = 8
    config.custom_envs["Game"].seats = ["pool", "policy"]
    config.custom_envs["Game"].pool.last_k = 3
    validate_config(config)
    engine = FakeEngine(legal_move_reply(tokenizer))
    batches = await one_batch(config, engine, tokenizer, steps=2)
    lags = set()
    for trajectory in (t for batch in batches for t in batch):
        assert trajectory.opponents == "pool"
        game = f"-g{trajectory.group_id}-e{trajectory.episode_id}-snapshot0-"
        drawn = {r.adapter_lag for r in engine.requests if game in r.request_id}
        assert drawn == {trajectory.metrics["game_pool_lag_seat0"]}  # one draw per game
        assert drawn == {
            trajectory.metrics["game_snapshot_lag_seat0"]
        }  # what the ratings read
        lags |= drawn
    assert lags <= {1, 2, 3} and len(lags) > 1


async def test_a_pool_with_the_current_policy_also_draws_k_0_and_trains_one_seat(
    tokenizer,
):
    config = game_config(
        "tic_tac_toe", ["random", "policy"], group_size=4, num_env_groups=2
    )
    config.trainer.lora.rank = 8
    config.custom_envs["Game"].seats = ["pool", "policy"]
    config.custom_envs["Game"].pool.last_k = 1
    config.custom_envs["Game"].pool.include_current = True
    validate_config(config)
    engine = FakeEngine(legal_move_reply(tokenizer))
    batches = await one_batch(config, engine, tokenizer, steps=2)
    lags = set()
    for trajectory in (t for batch in batches for t in batch):
        assert trajectory.role == "seat1"  # the current policy in seat 0 is not trained
        game = f"-g{trajectory.group_id}-e{trajectory.episode_id}-snapshot0-"
        drawn = {r.adapter_lag for r in engine.requests if game in r.request_id}
        assert drawn == {trajectory.metrics["game_pool_lag_seat0"]}
        lags |= drawn
    assert lags == {0, 1}
    trained = [t for batch in batches for t in batch]
    games = {(t.group_id, t.episode_id) for t in trained}
    assert len(games) == len(trained) == 2 * config.rollout_batch_size  # one per game


async def test_games_against_snapshots_are_rated_in_the_batch_metrics(tokenizer):
    config = game_config("tic_tac_toe", ["random", "policy"], group_size=2)
    config.trainer.lora.rank = 8
    config.custom_envs["Game"].seats = ["snapshot:1", "policy"]
    validate_config(config)
    scheduler = scheduler_for(
        config, FakeEngine(legal_move_reply(tokenizer)), tokenizer
    )
    try:
        batch, metrics = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(step=0), 20
        )
    finally:
        await scheduler.shutdown()
    finished = [
        t
        for t in batch
        if "game_unfinished" in t.metrics and not t.metrics["game_unfinished"]
    ]
    assert metrics["game/Game/elo_games"] == len(finished) > 0
    assert metrics["game/Game/policy_elo"] + metrics[
        "game/Game/pool_elo"
    ] == pytest.approx(2000.0)
