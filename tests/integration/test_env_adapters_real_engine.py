"""Each env-library adapter runs a rollout of a real env from its library against the real CPU engine."""

from __future__ import annotations

import collections

import pytest

from roll_async.config.schema import (
    CustomEnvConfig,
    EngineConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

pytest.importorskip("gymnasium")
pytest.importorskip("textarena")
pytest.importorskip("reasoning_gym")

ADAPTER_ENVS = {
    "GymFrozenLake": CustomEnvConfig(
        env_type="gymnasium:FrozenLake-v1",
        env_config={"is_slippery": False},
        max_steps=3,
        max_tokens_per_step=16,
    ),
    "GuessTheNumber": CustomEnvConfig(
        env_type="textarena:GuessTheNumber-v0",
        max_steps=3,
        max_tokens_per_step=16,
        system_prompt="Reply with your move in square brackets, for example [7].",
        stop=["]"],
    ),
    "Arithmetic": CustomEnvConfig(
        env_type="reasoning_gym:basic_arithmetic",
        env_config={"max_attempts": 2},
        max_steps=2,
        max_tokens_per_step=16,
    ),
}


async def test_each_adapter_plays_a_real_library_env_through_the_rollout(
    engine, tiny_model_path, tokenizer
):
    from roll_async.config.rollout_spec import rollout_spec
    from roll_async.scheduler.rollout_scheduler import RolloutScheduler

    config = PipelineConfig(
        custom_envs=ADAPTER_ENVS,
        train_env_manager=EnvManagerConfig(
            num_env_groups=3,
            group_size=2,
            tags=list(ADAPTER_ENVS),
            max_env_num_per_worker=8,
        ),
        engine=EngineConfig(max_model_len=1024),
        generation=GenerationConfig(temperature=1.0),
        sequence_length=768,
        rollout_batch_size=6,
        mode="sync",
    )
    validate_config(config)
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=str(tiny_model_path),
    )
    try:
        batch, metrics = await scheduler.get_batch_with_metrics(0)
    finally:
        await scheduler.shutdown()

    by_tag = collections.defaultdict(list)
    for trajectory in batch:
        by_tag[trajectory.tag].append(trajectory)
    assert set(by_tag) == set(ADAPTER_ENVS)
    for tag, trajectories in by_tag.items():
        for t in trajectories:
            assert t.stop_reason in ("terminated", "max_steps", "max_length"), (
                tag,
                t.stop_reason,
                t.error,
            )
            assert t.num_turns >= 1
            assert len(t.token_ids) == len(t.response_mask) == len(t.logprobs)
            assert sum(t.response_mask) == sum(
                turn.generated_tokens for turn in t.turns
            )
    text = tokenizer.decode(by_tag["GymFrozenLake"][0].token_ids)
    assert (
        "frozen lake" in text and "Left, Down, Right, Up" in text
    )  # the adapter's instruction and vocabulary
    frozen_turn = by_tag["GymFrozenLake"][0].turns[0]
    assert (
        "action_is_valid" in frozen_turn.metrics
        and "invalid_actions" in frozen_turn.metrics
    )
    assert "Guess The Number" in tokenizer.decode(by_tag["GuessTheNumber"][0].token_ids)
    assert all(
        "invalid_moves" in turn.metrics
        for t in by_tag["GuessTheNumber"]
        for turn in t.turns
    )
    arithmetic = by_tag["Arithmetic"][0]
    assert "Calculate" in tokenizer.decode(
        arithmetic.token_ids
    ) or "=" in tokenizer.decode(arithmetic.token_ids)
    assert all("score" in turn.metrics for turn in arithmetic.turns)
    assert metrics["env/GuessTheNumber/invalid_moves"] >= 0.0
