"""Math and model rewards end to end on CPU with the real engine: math trains, a judge on its own engine scores
concurrently (per episode or per turn, and is timed out when it takes too long), and a reward model's score
reaches the trainer's batch.

One judge engine serves the whole file (module fixture); the policy is the session's shared engine.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from roll_async import metrics
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import PipelineConfig, RewardConfig, load_config
from roll_async.engine.engine_actor import shutdown_engines
from roll_async.pipelines.agentic_pipeline import AgenticPipeline
from roll_async.rewards import RewardService, launch_judge_engines
from roll_async.scheduler.rollout_scheduler import RolloutScheduler
from roll_async.trainer.batch_dump import load_batch

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MATH = REPO / "configs" / "math.yaml"
JUDGE_ENGINE = {"dtype": "float32", "cpu_kv_cache_space_gib": 0.25, "max_num_seqs": 16}

#: Small math runs: 2 groups of 4 one-turn episodes with short answers.
SMALL_MATH = [
    "rollout_batch_size=8",
    "train_env_manager.num_env_groups=2",
    "train_env_manager.group_size=4",
    "custom_envs.Math.max_steps=1",
    "custom_envs.Math.env_config.max_attempts=1",
    "custom_envs.Math.max_tokens_per_step=24",
    "engine.max_model_len=1024",
]


def math_config(tmp_path: Path, *overrides: str) -> PipelineConfig:
    return load_config(
        MATH,
        [
            f"output_dir={tmp_path}",
            *SMALL_MATH,
            "trainer.lr=1e-4",
            "trainer.micro_batch_size=8",
            "logging.progress_bar=false",
            "logging.console=false",
            "sft_warmup.enabled=false",
            "eval_steps=0",
            *overrides,
        ],
    )


def judge_config(**overrides) -> RewardConfig:
    settings = dict(
        kind="judge",
        model_path="tiny",
        mode="add",
        weight=0.5,
        max_concurrency=4,
        timeout_s=60.0,
        max_retries=0,
        max_tokens=24,
        max_model_len=1024,
        engine=JUDGE_ENGINE,
    )
    settings.update(overrides)
    config = RewardConfig(**settings)
    config.validate("Math")
    return config


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
async def judge_handles(ray_session, tiny_model_path):
    """The file's one judge engine (its own vLLM engine on the tiny model; never weight-synced)."""
    handles = await launch_judge_engines(judge_config(), name_prefix="test_judge")
    yield tuple(handles)
    await shutdown_engines(list(handles))


@pytest.fixture
async def fresh_weights(engine, tiny_model_path):
    """Give the shared engine the tiny model's own weights back after a training run changed them."""
    yield
    from safetensors.torch import load_file

    original = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    version = await engine.get_weight_version.remote()
    await engine.pause.remote("wait")
    await engine.update_weights.remote(original, version + 1)
    await engine.resume.remote()


async def rollout_with_judge(
    config: PipelineConfig, engine, tiny_model_path, service: RewardService
):
    """One batch from the real engine with ``service`` scoring the Math episodes; the workers' reward counters."""
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=str(tiny_model_path),
        reward_services={"Math": service},
    )
    try:
        batch, batch_metrics = await scheduler.get_batch_with_metrics(0)
        described = await scheduler.describe()
    finally:
        await scheduler.shutdown()
    counters = [w["rewards"]["Math"] for w in described["workers"]]
    return batch, batch_metrics, counters


async def test_math_rolls_out_and_trains(tmp_path, engine, fresh_weights):
    config = math_config(tmp_path, "max_steps=3")
    assert config.custom_envs["Math"].reward is None
    await AgenticPipeline(config, engines=[engine]).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert all("train/loss" in row for row in rows)
    assert all(metrics.TIME_REWARD_MEAN not in row for row in rows)  # no model reward
    trajectories = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(trajectories) == 3 * config.rollout_batch_size
    assert {t["tag"] for t in trajectories} == {"Math"}
    assert all(t["reward_started_at"] == 0.0 for t in trajectories)


async def test_judge_scores_a_batch_concurrently_and_counts_parse_failures(
    tmp_path, engine, tiny_model_path, judge_handles
):
    reward = judge_config()
    config = math_config(tmp_path)
    service = RewardService(tag="Math", config=reward, handles=judge_handles)
    batch, batch_metrics, counters = await rollout_with_judge(
        config, engine, tiny_model_path, service
    )
    assert len(batch) == config.rollout_batch_size
    scored = [t for t in batch if metrics.MODEL_REWARD_S in t.metrics]
    assert scored, "no trajectory was scored"
    # Calls overlapped (one worker, one scorer), never beyond the bound.
    max_in_flight = max(c["max_in_flight"] for c in counters)
    assert 1 < max_in_flight <= reward.max_concurrency
    # The random tiny judge writes no 'Score: n': counted, and zero model reward for those episodes.
    parse_failed = [t for t in scored if t.metrics[metrics.MODEL_REWARD_PARSE_FAILED]]
    assert batch_metrics[metrics.REWARD_PARSE_FAILURES] == len(parse_failed) > 0
    for t in parse_failed:
        assert t.episode_reward == t.metrics[metrics.ENV_REWARD]
    for t in scored:
        score = t.metrics.get(metrics.MODEL_REWARD_SCORE)
        expected = t.metrics[metrics.ENV_REWARD] + reward.weight * (score or 0.0)
        assert t.episode_reward == pytest.approx(expected)
        assert t.started_at < t.reward_started_at < t.reward_finished_at
        assert t.reward_finished_at <= t.finished_at
    assert batch_metrics[metrics.TIME_REWARD_MEAN] > 0
    assert (
        batch_metrics[metrics.TIME_REWARD_P99]
        >= batch_metrics[metrics.TIME_REWARD_MEAN]
    )


async def test_a_per_turn_judge_scores_each_stepped_turn(
    tmp_path, engine, tiny_model_path, judge_handles
):
    reward = judge_config(per_turn=True)
    # Two attempts: a wrong first answer gets a second turn, scored on its own.
    config = math_config(
        tmp_path,
        "custom_envs.Math.max_steps=2",
        "custom_envs.Math.env_config.max_attempts=2",
    )
    service = RewardService(tag="Math", config=reward, handles=judge_handles)
    batch, batch_metrics, counters = await rollout_with_judge(
        config, engine, tiny_model_path, service
    )
    assert len(batch) == config.rollout_batch_size
    scored = [t for t in batch if metrics.MODEL_REWARD_TURNS in t.metrics]
    assert scored, "no trajectory was scored per turn"
    calls = 0
    for t in scored:
        turns = [turn for turn in t.turns if metrics.MODEL_REWARD_S in turn.metrics]
        assert len(turns) == t.metrics[metrics.MODEL_REWARD_TURNS] >= 1
        calls += len(turns)
        scores = [turn.metrics.get(metrics.MODEL_REWARD_SCORE, 0.0) for turn in turns]
        assert t.episode_reward == pytest.approx(sum(turn.reward for turn in t.turns))
        assert t.episode_reward == pytest.approx(
            t.metrics[metrics.ENV_REWARD] + reward.weight * sum(scores)
        )
        for turn in turns:
            assert turn.env_step_finished_at <= turn.reward_started_at
            assert turn.reward_started_at < turn.reward_finished_at <= t.finished_at
    assert sum(c["calls"] for c in counters) >= calls
    assert batch_metrics[metrics.REWARD_FAILURES] == sum(
        t.metrics[metrics.MODEL_REWARD_FAILED] for t in scored
    )
    assert batch_metrics[metrics.TIME_REWARD_MEAN] > 0


async def test_a_judge_that_never_answers_is_timed_out_and_the_episodes_arrive(
    tmp_path, engine, tiny_model_path, judge_handles
):
    # No answer comes back within 1 ms, not even one that ends at its first token (the judge is a Ray
    # actor hosting vLLM: one request's round trip is longer): every call times out and is aborted.
    # (20 ms was not enough: a reply of EOS alone came back in time on a quiet machine.)
    reward = judge_config(timeout_s=0.001, max_tokens=700)
    config = math_config(tmp_path)
    service = RewardService(tag="Math", config=reward, handles=judge_handles)
    batch, batch_metrics, counters = await rollout_with_judge(
        config, engine, tiny_model_path, service
    )
    assert len(batch) == config.rollout_batch_size
    scored = [t for t in batch if metrics.MODEL_REWARD_S in t.metrics]
    assert scored and all(t.metrics[metrics.MODEL_REWARD_TIMEOUTS] == 1 for t in scored)
    assert batch_metrics[metrics.REWARD_TIMEOUTS] == len(scored)
    assert batch_metrics[metrics.REWARD_FAILURES] == len(scored)
    assert all(t.episode_reward == t.metrics[metrics.ENV_REWARD] for t in scored)
    assert sum(c["timeouts"] for c in counters) >= len(scored)


async def test_reward_model_score_reaches_the_trainers_batch(
    tmp_path, engine, fresh_weights
):
    weight = 0.5
    config = math_config(
        tmp_path,
        "max_steps=1",
        "logging.save_batches=true",
        "custom_envs.Math.reward.kind=reward_model",
        "custom_envs.Math.reward.model_path=tiny",
        f"custom_envs.Math.reward.weight={weight}",
        "custom_envs.Math.reward.max_model_len=512",
    )
    pipeline = AgenticPipeline(
        config, engines=[engine]
    )  # launches and stops the RM actor itself
    await pipeline.run()
    assert pipeline.reward_services == {}
    trajectories = read_jsonl(tmp_path / "trajectories.jsonl")
    assert len(trajectories) == config.rollout_batch_size
    for t in trajectories:
        m = t["metrics"]
        assert m[metrics.MODEL_REWARD_FAILED] == 0.0
        assert t["episode_reward"] == pytest.approx(
            m[metrics.ENV_REWARD] + weight * m[metrics.MODEL_REWARD_SCORE]
        )
    (saved,) = sorted((tmp_path / "batches").iterdir())
    _, batch = load_batch(saved)
    assert sorted(batch.rewards.tolist()) == pytest.approx(
        sorted(t["episode_reward"] for t in trajectories)
    )
    # A random RM scores every text differently: the model reward is really in the batch.
    assert len({round(r, 6) for r in batch.rewards.tolist()}) > 1
    row = read_jsonl(tmp_path / "metrics.jsonl")[0]
    assert row[metrics.REWARD_FAILURES] == 0.0 and row[metrics.TIME_REWARD_MEAN] > 0
