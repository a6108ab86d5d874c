"""Turns a finished episode's env reward into its final reward with a model's score (judge or reward model).

The EnvManager calls this once an episode ends, so the model reward lands in
the trajectory before the scheduler groups it; how the score combines with the
env reward (``add`` or ``replace``), and the per-trajectory metrics the batch
metrics need, are decided here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from roll_async import metrics
from roll_async.config.sections import RewardConfig
from roll_async.rewards.episode_text import EpisodeText, episode_text
from roll_async.rewards.model_call import ModelScore, RewardClient
from roll_async.trajectory import Trajectory

#: Episodes that are never trained on: not worth a model call.
UNSCORED_STOP_REASONS = frozenset({"env_error", "engine_error", "aborted"})


@dataclass(frozen=True)
class RewardOutcome:
    """The episode's new reward, the model's score (None when skipped), and metrics for Trajectory.metrics."""

    reward: float
    env_reward: float
    model_score: ModelScore | None
    metrics: dict[str, float] = field(default_factory=dict)


class EpisodeRewardScorer:
    """Scores finished Trajectories with one RewardClient (LLMJudge or RewardModelClient) under one RewardConfig."""

    def __init__(self, config: RewardConfig, client: RewardClient) -> None:
        self.config = config
        self.client = client

    def combine(self, env_reward: float, score: float | None) -> float:
        """``add``: env + weight * score; ``replace``: weight * score; a missing score counts as 0."""
        model_reward = self.config.weight * (score if score is not None else 0.0)
        return env_reward + model_reward if self.config.mode == "add" else model_reward

    async def score(
        self,
        trajectory: Trajectory,
        *,
        question: str | None = None,
        reference: str | None = None,
        decode: Callable[[list[int]], str] | None = None,
    ) -> RewardOutcome:
        """Score ``trajectory`` (not modified); see rewards.episode_text for question/reference/decode."""
        env_reward = float(trajectory.episode_reward)
        if trajectory.stop_reason in UNSCORED_STOP_REASONS or not trajectory.turns:
            return RewardOutcome(
                reward=env_reward, env_reward=env_reward, model_score=None
            )
        text = episode_text(
            trajectory, question=question, reference=reference, decode=decode
        )
        return await self.score_text(text, env_reward)

    async def score_text(self, text: EpisodeText, env_reward: float) -> RewardOutcome:
        """Score an already built EpisodeText against ``env_reward``."""
        result = await self.client.score(text)
        out: dict[str, float] = {
            metrics.ENV_REWARD: env_reward,
            metrics.MODEL_REWARD_S: result.seconds,
            metrics.MODEL_REWARD_FAILED: float(result.failed),
            metrics.MODEL_REWARD_TIMEOUTS: float(result.timeouts),
            metrics.MODEL_REWARD_PARSE_FAILED: float(result.parse_failed),
            metrics.MODEL_REWARD_RETRIES: float(result.attempts - 1),
        }
        if result.score is not None:
            out[metrics.MODEL_REWARD_SCORE] = result.score
        return RewardOutcome(
            reward=self.combine(env_reward, result.score),
            env_reward=env_reward,
            model_score=result,
            metrics=out,
        )

    async def apply(
        self,
        trajectory: Trajectory,
        *,
        question: str | None = None,
        reference: str | None = None,
        decode: Callable[[list[int]], str] | None = None,
    ) -> RewardOutcome:
        """``score``, then write the new episode_reward and the metrics into ``trajectory``."""
        outcome = await self.score(
            trajectory, question=question, reference=reference, decode=decode
        )
        trajectory.episode_reward = outcome.reward
        trajectory.metrics.update(outcome.metrics)
        return outcome
