"""Model rewards wired into the rollout without a real engine: config at load, scoring in the EnvManager, metrics, report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from roll_async import metrics
from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    RewardConfig,
    load_config,
    validate_config,
)
from roll_async.envs import make_env
from roll_async.errors import ConfigError
from roll_async.pipelines.preflight import check_rewards
from roll_async.report.build import write_trace
from roll_async.report.data import load_report_data
from roll_async.rewards import EpisodeRewardScorer, EpisodeText, ModelScore
from roll_async.run_output.run_dir import RunDirectory
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import scripted_env_factory

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


class FakeRewardClient:
    """A RewardClient answering ``score`` (None: a failed call) after ``delay_s``; records what it was asked."""

    def __init__(self, score: float | None, delay_s: float = 0.0) -> None:
        self.value = score
        self.delay_s = delay_s
        self.episodes: list[EpisodeText] = []

    async def score(self, episode: EpisodeText) -> ModelScore:
        self.episodes.append(episode)
        await asyncio.sleep(self.delay_s)
        return ModelScore(
            score=self.value,
            seconds=self.delay_s,
            parse_failed=self.value is None,
        )


def scripted_config(reward: RewardConfig | None) -> PipelineConfig:
    config = PipelineConfig(
        mode="sync",
        rollout_batch_size=4,
        sequence_length=512,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Count": CustomEnvConfig(
                env_type="scripted",
                env_config={"episode_length": 2, "reward": 1.0},
                max_steps=3,
                max_tokens_per_step=8,
                reward=reward,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=2, group_size=2, tags=["Count"]
        ),
    )
    validate_config(config)
    return config


async def collect(config: PipelineConfig, tokenizer, client: FakeRewardClient):
    reward = config.custom_envs["Count"].reward
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=FakeEngine(tokens_per_request=3),
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
        reward_scorers={"Count": EpisodeRewardScorer(reward, client)},
    )
    try:
        batch = await asyncio.wait_for(scheduler.get_batch(step=0), 10)
        return batch, scheduler.last_metrics
    finally:
        await scheduler.shutdown()


# -- config ----------------------------------------------------------------------------------------------


def test_math_configs_load_with_and_without_a_reward():
    assert (
        load_config(REPO / "configs" / "math.yaml").custom_envs["Math"].reward is None
    )
    reward = (
        load_config(REPO / "configs" / "math_judge.yaml").custom_envs["Math"].reward
    )
    assert isinstance(reward, RewardConfig)
    assert (reward.kind, reward.model_path, reward.mode) == ("judge", "tiny", "add")
    assert "{response}" in reward.template() and "{reference}" in reward.template()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("custom_envs.Math.reward.model_path=/no/such/judge", "reward.model_path"),
        ("custom_envs.Math.reward.kind=critic", "reward.kind"),
        ("custom_envs.Math.reward.prompt_template=Rate it", "reward.prompt_template"),
        ("custom_envs.Math.reward.max_concurency=2", "max_concurrency"),
    ],
)
def test_a_bad_reward_fails_at_load_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs" / "math_judge.yaml", [override])


def test_a_reward_model_without_a_classification_head_fails_at_load(tmp_path: Path):
    causal = tmp_path / "causal"
    causal.mkdir()
    (causal / "config.json").write_text(
        json.dumps({"architectures": ["Qwen2ForCausalLM"]})
    )
    with pytest.raises(ConfigError, match="ForSequenceClassification"):
        load_config(
            REPO / "configs" / "math.yaml",
            [
                "custom_envs.Math.reward.kind=reward_model",
                f"custom_envs.Math.reward.model_path={causal}",
            ],
        )


def test_math_env_gives_the_reference_answer_on_reset():
    env = make_env("math", {"split": "train"})
    _, info = env.reset(seed=3)
    assert info["reference"] == env.task.answer
    assert env.task.answer not in info["instruction"]


# -- scoring in the EnvManager ---------------------------------------------------------------------------


async def test_episodes_are_scored_before_the_hand_over(tokenizer):
    config = scripted_config(
        RewardConfig(kind="judge", model_path="tiny", weight=0.5, mode="add")
    )
    client = FakeRewardClient(score=0.8, delay_s=0.01)
    batch, batch_metrics = await collect(config, tokenizer, client)
    assert len(batch) == 4 and len(client.episodes) >= 4
    for trajectory in batch:
        env_reward = trajectory.metrics[metrics.ENV_REWARD]
        assert env_reward == pytest.approx(2.0)  # two steps of reward 1
        assert trajectory.episode_reward == pytest.approx(env_reward + 0.5 * 0.8)
        assert (
            trajectory.started_at
            <= trajectory.reward_started_at
            < trajectory.reward_finished_at
            <= trajectory.finished_at
        )
    # The question is the first user text the env rendered; the response the last action.
    assert client.episodes[0].question.startswith("Count up.")
    assert batch_metrics[metrics.TIME_REWARD_MEAN] >= 0.01
    assert batch_metrics[metrics.REWARD_FAILURES] == 0.0
    assert batch_metrics[metrics.EPISODE_REWARD_MEAN] == pytest.approx(2.4)


async def test_a_failed_score_is_counted_and_gives_zero_model_reward(tokenizer):
    config = scripted_config(
        RewardConfig(kind="judge", model_path="tiny", weight=0.5, mode="replace")
    )
    batch, batch_metrics = await collect(
        config, tokenizer, FakeRewardClient(score=None)
    )
    assert [t.episode_reward for t in batch] == [0.0] * 4
    assert batch_metrics[metrics.REWARD_FAILURES] == 4.0
    assert batch_metrics[metrics.REWARD_PARSE_FAILURES] == 4.0


def test_a_run_without_rewards_has_no_reward_metrics():
    assert metrics.reward_batch_metrics([]) == {}


def test_the_report_draws_the_reward_span(tmp_path: Path, tokenizer):
    config = scripted_config(RewardConfig(kind="judge", model_path="tiny"))
    batch, _ = asyncio.run(collect(config, tokenizer, FakeRewardClient(score=1.0)))
    run = RunDirectory.create(str(tmp_path / "run"), "train")
    run.write_config(config)
    run.append_trajectories(
        batch, tokenizer, served_step=0, served_at=max(t.finished_at for t in batch)
    )
    data = load_report_data(run.root)
    spans = [(e["rs"], e["rf"]) for e in data.episodes]
    assert spans and all(rs is not None and rf >= rs for rs, rf in spans)
    events = json.loads(write_trace(run.root).read_text())["traceEvents"]
    assert sum(e.get("cat") == "reward" for e in events) == len(batch)


def test_check_loads_the_judges_tokenizer_before_any_actor(tmp_path: Path):
    judge = tmp_path / "judge"
    judge.mkdir()
    (judge / "config.json").write_text(
        json.dumps({"architectures": ["Qwen2ForCausalLM"]})
    )
    config = load_config(
        REPO / "configs" / "math_judge.yaml",
        [f"custom_envs.Math.reward.model_path={judge}"],  # passes the load checks
    )
    with pytest.raises(ConfigError, match="reward.model_path=.*tokenizer"):
        check_rewards(config)
