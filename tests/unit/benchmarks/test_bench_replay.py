"""The replay row of the grouping benchmark (benchmarks/replay_rollout.py) against the FAKE engine.

Replay must send the engine exactly the per-env run's requests (prompts, growth,
lengths), play every recorded episode once, and never exceed its concurrency.
"""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.replay_rollout import ReplayRollout, ReplayTurn, replay_script
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import scripted_env_factory
from roll_async.trajectory import Trajectory


def recorded(token_ids: list[int], mask: list[int], episode_id: int = 0) -> Trajectory:
    return Trajectory(
        tag="t",
        group_id=0,
        episode_id=episode_id,
        env_id=0,
        seed=1,
        traj_id=f"t-{episode_id}",
        created_step=0,
        token_ids=token_ids,
        response_mask=mask,
    )


def test_script_splits_at_generated_runs_and_drops_a_trailing_observation():
    t = recorded([1, 2, 3, 10, 11, 4, 5, 12, 6], [0, 0, 0, 1, 1, 0, 0, 1, 0])
    assert replay_script(t) == [ReplayTurn((1, 2, 3), 2), ReplayTurn((4, 5), 1)]
    assert replay_script(recorded([1, 2], [0, 0])) == []


async def test_replay_of_a_per_env_run_sends_the_same_requests_and_rebuilds_the_same_ids():
    # A deterministic engine (the reply depends on the prompt only): replaying per-env's episodes must send
    # the prompts per-env sent, turn by turn, and so rebuild each conversation id for id.
    tokenizer = build_chatml_test_tokenizer()

    def reply(request):
        return [
            7 + len(request.prompt_token_ids) % 5,
            8,
            tokenizer.eos_token_id,
        ]  # noqa: E731

    tags = {
        "a": CustomEnvConfig(
            env_type="scripted",
            env_config={"episode_length": 3},
            max_steps=5,
            max_tokens_per_step=16,
        )
    }
    config = PipelineConfig(
        mode="sync",
        rollout_batch_size=4,
        sequence_length=512,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs=tags,
        train_env_manager=EnvManagerConfig(num_env_groups=2, group_size=2, tags=["a"]),
    )
    validate_config(config)
    per_env_engine = FakeEngine(reply)
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=per_env_engine,
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    try:
        per_env = await asyncio.wait_for(scheduler.get_batch(step=0), 10)
    finally:
        await scheduler.shutdown()

    replay_engine = FakeEngine(reply)
    played = await asyncio.wait_for(
        ReplayRollout(replay_engine, concurrency=2).replay(per_env), 10
    )

    assert sorted(t.traj_id for t in played) == sorted(
        f"replay-{t.traj_id}" for t in per_env
    )
    by_id = {t.traj_id: t for t in per_env}
    for t in played:
        original = by_id[t.traj_id.removeprefix("replay-")]
        assert (
            t.token_ids == original.token_ids
            and t.response_mask == original.response_mask
        )
        assert (
            t.num_turns == original.num_turns == 3
            and t.response_length == original.response_length
        )
        assert (
            t.prompt_length == original.prompt_length
            and t.stop_reason == original.stop_reason
        )
    per_env_requests = sorted(
        (r.prompt_token_ids, r.max_tokens) for r in per_env_engine.requests
    )
    replayed = sorted(
        (r.prompt_token_ids, r.max_tokens) for r in replay_engine.requests
    )
    # The same prompts; max_tokens is each turn's recorded length (per-env asked for max_tokens_per_step).
    assert [p for p, _ in replayed] == [p for p, _ in per_env_requests]
    assert all(r.ignore_eos and r.logprobs for r in replay_engine.requests)
    assert {r.max_tokens for r in replay_engine.requests} == {3}


async def test_replay_keeps_at_most_concurrency_requests_in_flight():
    in_flight = peak = 0

    def latency(_request) -> float:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        return 0.01

    engine = FakeEngine(tokens_per_request=2, latency_fn=latency)
    original_generate = engine.generate

    async def generate(request):
        nonlocal in_flight
        try:
            return await original_generate(request)
        finally:
            in_flight -= 1

    engine.generate = generate  # type: ignore[method-assign]
    episodes = [
        recorded([1, 2, 9, 9, 3, 9, 9], [0, 0, 1, 1, 0, 1, 1], episode_id=i)
        for i in range(10)
    ]
    played = await asyncio.wait_for(
        ReplayRollout(engine, concurrency=3).replay(episodes), 10
    )
    assert len(played) == 10 and peak == 3 and len(engine.requests) == 20
    with pytest.raises(ValueError, match="concurrency"):
        ReplayRollout(engine, concurrency=0)
