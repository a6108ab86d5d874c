"""Validation scheduler: fixed episodes, greedy, each played once per evaluation, deterministic."""

from __future__ import annotations

import asyncio

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.scheduler.validation import (
    ValidationScheduler,
    build_validation_episodes,
)
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import scripted_env_factory


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


def val_config(
    num_episodes: int = 4, dataset: str | None = None, tags=("count", "other")
) -> PipelineConfig:
    config = PipelineConfig(
        seed=3,
        rollout_batch_size=1,
        sequence_length=512,
        custom_envs={
            tag: CustomEnvConfig(
                env_type="scripted",
                env_config={"episode_length": 2, "reward": "seed_parity"},
                max_tokens_per_step=16,
            )
            for tag in tags
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=1, tags=[tags[0]]
        ),
        val_env_manager=EnvManagerConfig(
            num_env_groups=num_episodes, group_size=1, tags=list(tags), dataset=dataset
        ),
    )
    validate_config(config)
    return config


def prompt_dependent_engine(tokenizer) -> FakeEngine:
    """Deterministic 'model': the reply depends only on the prompt ids."""
    up = tokenizer("<answer>Up</answer>", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    down = tokenizer("<answer>Down</answer>", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    return FakeEngine(lambda r: up if sum(r.prompt_token_ids) % 2 else down)


async def test_every_val_episode_runs_once_greedily_and_evaluations_repeat_exactly(
    tokenizer,
):
    config = val_config(num_episodes=4)
    episodes = build_validation_episodes(rollout_spec(config, "val"))
    assert [e.tag for e in episodes] == ["count", "count", "other", "other"]
    assert len({e.seed for e in episodes}) == 4
    engine = prompt_dependent_engine(tokenizer)
    runner = LocalRolloutScheduler(
        rollout_spec(config, "val"),
        engines=engine,
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    validation = ValidationScheduler(runner, episodes)
    try:
        first, metrics = await asyncio.wait_for(validation.evaluate(step=0), 5)
        second, _ = await asyncio.wait_for(validation.evaluate(step=5), 5)
    finally:
        await validation.shutdown()
    assert [t.seed for t in first] == [e.seed for e in episodes]
    assert [(t.seed, t.token_ids, t.episode_reward) for t in first] == [
        (t.seed, t.token_ids, t.episode_reward) for t in second
    ]
    assert all(r.temperature == 0.0 for r in engine.requests)
    # two evaluations x episodes x two turns
    assert len(engine.requests) == 2 * len(episodes) * 2
    expected = {
        tag: sum(2.0 * (e.seed % 2) for e in episodes if e.tag == tag) / 2
        for tag in ("count", "other")
    }
    assert metrics["val/count/episode_reward"] == pytest.approx(expected["count"])
    assert metrics["val/other/episode_reward"] == pytest.approx(expected["other"])
    assert metrics["val/num_episodes"] == 4 and metrics["val/success"] == 1.0


async def test_val_episodes_from_an_env_config_parquet(tokenizer, tmp_path):
    from roll_async.envs.dataset import EnvDatasetRow, write_env_dataset

    path = write_env_dataset(
        tmp_path / "val.parquet",
        [
            EnvDatasetRow(
                "scripted",
                {"episode_length": 1},
                seed=10,
                split="val",
                data_source="other",
            ),
            EnvDatasetRow("scripted", {"episode_length": 3}, seed=11, split="val"),
        ],
    )
    config = val_config(dataset=str(path))
    episodes = build_validation_episodes(rollout_spec(config, "val"))
    assert [(e.tag, e.seed, e.env_config_override) for e in episodes] == [
        ("other", 10, {"episode_length": 1}),
        ("count", 11, {"episode_length": 3}),
    ]
    runner = LocalRolloutScheduler(
        rollout_spec(config, "val"),
        engines=prompt_dependent_engine(tokenizer),
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
    )
    validation = ValidationScheduler(runner, episodes)
    try:
        trajectories, _ = await asyncio.wait_for(validation.evaluate(step=0), 5)
    finally:
        await validation.shutdown()
    assert [t.num_turns for t in trajectories] == [1, 3]


def test_a_dataset_row_without_a_matching_tag_is_a_clear_error(tmp_path):
    from roll_async.envs.dataset import EnvDatasetRow, write_env_dataset

    path = write_env_dataset(
        tmp_path / "val.parquet", [EnvDatasetRow("sokoban", {}, seed=1)]
    )
    with pytest.raises(ValueError, match="no val tag"):
        build_validation_episodes(rollout_spec(val_config(dataset=str(path)), "val"))
