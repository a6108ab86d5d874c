"""Rewards from models per turn (``custom_envs.<Tag>.reward.per_turn``) with fake judge clients, no real engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
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
    validate_config,
)
from roll_async.env_managers.worker import build_env_managers
from roll_async.errors import ConfigError
from roll_async.report.build import write_trace
from roll_async.report.data import load_report_data
from roll_async.rewards import (
    EpisodeRewardScorer,
    EpisodeText,
    ModelScore,
    TurnScore,
    reward_batch_metrics,
    turn_text,
)
from roll_async.rewards.model_call import BoundedModelCaller
from roll_async.run_output.run_dir import RunDirectory
from roll_async.scheduler.local import LocalRolloutScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import scripted_env_factory
from roll_async.trajectory import EpisodeSpec, Trajectory, TurnRecord


@pytest.fixture(scope="module")
def tokenizer():
    return build_chatml_test_tokenizer()


class BoundedFakeJudge:
    """A RewardClient behind the real BoundedModelCaller: each attempt sleeps ``delay_s`` then answers.

    ``hang(text)``: that call sleeps an hour (a timeout); ``fail(text)``: the reply has no score.
    """

    def __init__(
        self,
        config: RewardConfig,
        score: float = 0.8,
        *,
        delay_s: float = 0.0,
        hang: Callable[[EpisodeText], bool] = lambda _: False,
        fail: Callable[[EpisodeText], bool] = lambda _: False,
    ) -> None:
        self.caller = BoundedModelCaller(config)
        self.value = score
        self.delay_s = delay_s
        self.hang = hang
        self.fail = fail
        self.texts: list[EpisodeText] = []
        self.cancelled = 0

    @property
    def counters(self):
        return self.caller.counters

    async def score(self, episode: EpisodeText) -> ModelScore:
        self.texts.append(episode)

        async def attempt(index: int) -> tuple[float | None, str]:
            try:
                await asyncio.sleep(3600 if self.hang(episode) else self.delay_s)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return (None if self.fail(episode) else self.value), ""

        return await self.caller.call(attempt)


def per_turn(**overrides) -> RewardConfig:
    fields = {
        "kind": "judge",
        "model_path": "tiny",
        "weight": 0.5,
        "per_turn": True,
        "max_retries": 0,
        **overrides,
    }
    return RewardConfig(**fields)


def scripted_config(
    reward: RewardConfig,
    *,
    episode_length: int = 2,
    groups: int = 2,
    size: int = 2,
    step_latency_s: float = 0.0,
) -> PipelineConfig:
    config = PipelineConfig(
        mode="sync",
        rollout_batch_size=groups * size,
        sequence_length=512,
        generation=GenerationConfig(retry_backoff_s=0.001),
        custom_envs={
            "Count": CustomEnvConfig(
                env_type="scripted",
                env_config={
                    "episode_length": episode_length,
                    "reward": 1.0,
                    "step_latency_s": step_latency_s,
                },
                max_steps=episode_length + 1,
                max_tokens_per_step=8,
                reward=reward,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=groups, group_size=size, tags=["Count"]
        ),
    )
    validate_config(config)
    return config


async def collect(config: PipelineConfig, tokenizer, client: BoundedFakeJudge):
    reward = config.custom_envs["Count"].reward
    scheduler = LocalRolloutScheduler(
        rollout_spec(config, "train"),
        engines=FakeEngine(tokens_per_request=3),
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
        reward_scorers={"Count": EpisodeRewardScorer(reward, client)},
    )
    try:
        batch = await asyncio.wait_for(scheduler.get_batch(step=0), 20)
        return batch, scheduler.last_metrics
    finally:
        await scheduler.shutdown()


class OneEpisode:
    """A scheduler that hands out one episode and keeps what comes back."""

    def __init__(self) -> None:
        self.spec: EpisodeSpec | None = EpisodeSpec(
            tag="Count", group_id=0, episode_id=0, seed=1, created_step=0
        )
        self.trajectories: list[Trajectory] = []

    async def next_episode(self, env_id: int) -> EpisodeSpec | None:
        spec, self.spec = self.spec, None
        return spec

    async def put_trajectory(self, trajectory: Trajectory) -> None:
        self.trajectories.append(trajectory)


def one_env(config: PipelineConfig, tokenizer, client: BoundedFakeJudge, scheduler):
    reward = config.custom_envs["Count"].reward
    (manager,) = build_env_managers(
        rollout_spec(config, "train"),
        [(0, "Count")],
        scheduler=scheduler,
        engine_for=lambda _: FakeEngine(tokens_per_request=3),
        tokenizer=tokenizer,
        env_factory=scripted_env_factory,
        reward_scorers={"Count": EpisodeRewardScorer(reward, client)},
    )
    return manager


# -- config ----------------------------------------------------------------------------------------------


def test_per_turn_loads_for_env_tags():
    config = scripted_config(per_turn())
    assert config.custom_envs["Count"].reward.per_turn is True


def test_per_turn_on_an_agent_tag_fails_at_load():
    config = PipelineConfig(
        rollout_batch_size=1,
        custom_envs={
            "Agent": CustomEnvConfig(
                env_type="agent",
                agent="roll_async.testing.agents:three_turn_agent",
                reward=per_turn(),
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=1, group_size=1, tags=["Agent"]
        ),
    )
    with pytest.raises(ConfigError, match=r"custom_envs\.Agent\.reward\.per_turn"):
        validate_config(config)


# -- the sum rule ----------------------------------------------------------------------------------------


def stepped_trajectory(turn_rewards: list[float]) -> Trajectory:
    trajectory = Trajectory(
        tag="Count",
        group_id=0,
        episode_id=0,
        env_id=0,
        seed=0,
        traj_id="t",
        created_step=0,
    )
    for index, reward in enumerate(turn_rewards):
        trajectory.turns.append(
            TurnRecord(
                turn=index,
                action_text=f"a{index}",
                observation=f"o{index}",
                reward=reward,
                generated_tokens=1,
                weight_version=0,
                generate_s=0.0,
                env_step_s=0.0,
            )
        )
    trajectory.episode_reward = sum(turn_rewards)
    return trajectory


def turn_score(turn: int, score: float | None, seconds: float = 0.1) -> TurnScore:
    return TurnScore(
        turn=turn,
        score=ModelScore(score=score, seconds=seconds, parse_failed=score is None),
        started_at=100.0 + turn,
        finished_at=100.5 + turn,
    )


@pytest.mark.parametrize(
    ("mode", "turn_rewards", "episode"),
    [
        # add: env episode reward + weight * sum of scores (a failed call scores 0)
        ("add", [1.0 + 2 * 0.5, 0.0 + 0.0, 2.0 + 2 * 0.25], 1.0 + 0.0 + 2.0 + 2 * 0.75),
        # replace: weight * sum of scores; the turn never scored keeps its env reward
        ("replace", [2 * 0.5, 0.0, 2.0], 2 * 0.5 + 0.0 + 2.0),
    ],
)
def test_turn_rewards_combine_and_the_episode_is_their_sum(mode, turn_rewards, episode):
    scorer = EpisodeRewardScorer(RewardConfig(mode=mode, weight=2.0), client=None)
    trajectory = stepped_trajectory([1.0, 0.0, 2.0])
    scores = [turn_score(1, None), turn_score(0, 0.5)]  # turn 2 not scored
    if mode == "add":
        scores.append(turn_score(2, 0.25))
    outcome = scorer.apply_turns(trajectory, scores)
    assert [t.reward for t in trajectory.turns] == pytest.approx(turn_rewards)
    assert trajectory.episode_reward == pytest.approx(episode) == outcome.reward
    assert trajectory.episode_reward == pytest.approx(
        sum(t.reward for t in trajectory.turns)
    )
    m = trajectory.metrics
    assert m[metrics.ENV_REWARD] == 3.0
    assert m[metrics.MODEL_REWARD_TURNS] == len(scores)
    assert m[metrics.MODEL_REWARD_FAILED] == 1.0
    assert m[metrics.MODEL_REWARD_PARSE_FAILED] == 1.0
    assert m[metrics.MODEL_REWARD_S] == pytest.approx(0.1 * len(scores))
    first = trajectory.turns[0]
    assert first.metrics[metrics.ENV_REWARD] == 1.0
    assert first.metrics[metrics.MODEL_REWARD_SCORE] == 0.5
    assert (first.reward_started_at, first.reward_finished_at) == (100.0, 100.5)
    # One latency per call in the batch metrics, not one per trajectory.
    batch = reward_batch_metrics([trajectory])
    assert batch[metrics.TIME_REWARD_MEAN] == pytest.approx(0.1)
    assert batch[metrics.REWARD_FAILURES] == 1.0


def test_turn_text_asks_about_the_question_that_turn_answered():
    trajectory = stepped_trajectory([0.0, 0.0, 0.0])
    text = turn_text(
        trajectory, 1, question="o0 again", first_question="Start", reference="42"
    )
    assert (text.question, text.response, text.reference) == ("o0 again", "a1", "42")
    assert (
        text.conversation == "User: Start\n\nAssistant: a0\n\nUser: o0\n\nAssistant: a1"
    )


# -- in the EnvManager -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "turn_reward", "episode_reward"),
    [("add", 1.0 + 0.5 * 0.8, 2.0 + 2 * 0.5 * 0.8), ("replace", 0.5 * 0.8, 0.8)],
)
async def test_each_turn_is_scored_after_its_env_step(
    tokenizer, mode, turn_reward, episode_reward
):
    config = scripted_config(per_turn(mode=mode))
    client = BoundedFakeJudge(config.custom_envs["Count"].reward, delay_s=0.01)
    batch, batch_metrics = await collect(config, tokenizer, client)
    assert len(batch) == 4
    for trajectory in batch:
        assert trajectory.num_turns == 2
        assert [t.reward for t in trajectory.turns] == pytest.approx([turn_reward] * 2)
        assert trajectory.episode_reward == pytest.approx(episode_reward)
        assert trajectory.metrics[metrics.ENV_REWARD] == pytest.approx(2.0)
        assert trajectory.metrics[metrics.MODEL_REWARD_TURNS] == 2.0
        assert trajectory.reward_started_at == 0.0  # the spans are per turn
        for turn in trajectory.turns:
            assert turn.metrics[metrics.ENV_REWARD] == 1.0
            assert (
                turn.env_step_finished_at
                <= turn.reward_started_at
                < turn.reward_finished_at
                <= trajectory.finished_at
            )
    # Turn 0 answered the instruction; turn 1 the observation after it.
    questions = {text.question.split("\n")[0] for text in client.texts}
    assert "Count up." in questions and any(q.startswith("s") for q in questions)
    assert batch_metrics[metrics.TIME_REWARD_MEAN] >= 0.01
    assert batch_metrics[metrics.REWARD_FAILURES] == 0.0
    assert batch_metrics[metrics.EPISODE_REWARD_MEAN] == pytest.approx(episode_reward)


@pytest.mark.parametrize("how", ["timeout", "parse"])
async def test_a_failed_turn_call_is_counted_and_scores_zero(tokenizer, how):
    reward = per_turn(mode="add", timeout_s=0.2)

    def later_turn(text: EpisodeText) -> bool:
        return not text.question.startswith("Count up.")

    client = BoundedFakeJudge(
        reward,
        hang=later_turn if how == "timeout" else lambda _: False,
        fail=later_turn if how == "parse" else lambda _: False,
    )
    batch, batch_metrics = await collect(scripted_config(reward), tokenizer, client)
    for trajectory in batch:
        assert [t.reward for t in trajectory.turns] == pytest.approx([1.4, 1.0])
        assert trajectory.episode_reward == pytest.approx(2.4)
        assert trajectory.turns[1].metrics[metrics.MODEL_REWARD_FAILED] == 1.0
    assert batch_metrics[metrics.REWARD_FAILURES] == 4.0
    key = metrics.REWARD_TIMEOUTS if how == "timeout" else metrics.REWARD_PARSE_FAILURES
    assert batch_metrics[key] == 4.0


@pytest.mark.parametrize("bound", [1, 8])
async def test_turns_are_scored_concurrently_within_the_bound(tokenizer, bound):
    reward = per_turn(max_concurrency=bound)
    config = scripted_config(reward, episode_length=3, groups=1, size=1)
    client = BoundedFakeJudge(reward, delay_s=0.3)
    scheduler = OneEpisode()
    manager = one_env(config, tokenizer, client, scheduler)
    await asyncio.wait_for(manager.run_rollout_loop(), 20)
    (trajectory,) = scheduler.trajectories
    assert len(client.texts) == 3
    assert trajectory.episode_reward == pytest.approx(3 * (1.0 + 0.5 * 0.8))
    assert client.counters.max_in_flight == min(bound, 3)
    turns = trajectory.turns
    # Turn 0's call ran while the episode went on: it was still out when turn 1 was generated.
    assert turns[0].reward_finished_at > turns[1].generate_started_at
    if (
        bound == 8
    ):  # all three in flight at once: the hand-over waited about one call, not three
        assert trajectory.finished_at - turns[0].reward_started_at < 3 * 0.3


@pytest.mark.parametrize("when", ["mid_episode", "before_the_hand_over"])
async def test_cancelling_the_episode_cancels_its_turn_calls(tokenizer, when):
    reward = per_turn()
    mid = when == "mid_episode"
    config = scripted_config(
        reward, episode_length=3, groups=1, size=1, step_latency_s=0.3 if mid else 0.0
    )
    client = BoundedFakeJudge(reward, hang=lambda _: True)
    scheduler = OneEpisode()
    manager = one_env(config, tokenizer, client, scheduler)
    loop = asyncio.create_task(manager.run_rollout_loop())
    for _ in range(2000):
        if client.texts and (mid or len(client.texts) == 3):
            break
        await asyncio.sleep(0.005)
    # mid episode: turn 0's call hangs while the env steps on; else all three wait for the hand-over
    assert (manager.progress.phase == "reward") == (not mid)
    started = len(client.texts)
    assert started >= 1 and client.counters.in_flight == started
    assert manager.cancel_episode(0, 0)
    await asyncio.wait_for(loop, 10)
    # The cancelled calls unwind in the background (a judge aborts its request there).
    for _ in range(1000):
        if client.counters.in_flight == 0:
            break
        await asyncio.sleep(0.001)
    assert client.cancelled == started and client.counters.in_flight == 0
    assert scheduler.trajectories == [] and manager.stats.cancelled_episodes == 1


# -- the report ------------------------------------------------------------------------------------------


def test_the_report_draws_one_reward_span_per_scored_turn(tmp_path: Path, tokenizer):
    config = scripted_config(per_turn())
    client = BoundedFakeJudge(config.custom_envs["Count"].reward, delay_s=0.01)
    batch, _ = asyncio.run(collect(config, tokenizer, client))
    run = RunDirectory.create(str(tmp_path / "run"), "train")
    run.write_config(config)
    run.append_trajectories(
        batch, tokenizer, served_step=0, served_at=max(t.finished_at for t in batch)
    )
    data = load_report_data(run.root)
    for episode in data.episodes:
        assert episode["rs"] is None
        assert all(t["rs"] is not None and t["rf"] >= t["rs"] for t in episode["turns"])
    events = json.loads(write_trace(run.root).read_text())["traceEvents"]
    reward_spans = [e for e in events if e.get("cat") == "reward"]
    assert len(reward_spans) == sum(t.num_turns for t in batch)
    assert all(e["tid"] >= 200_000 for e in reward_spans)  # their own track per env
