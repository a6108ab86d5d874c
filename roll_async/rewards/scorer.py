"""Turns a finished episode's env reward into its final reward with a model's score (judge or reward model).

The EnvManager calls this once an episode ends, so the model reward lands in
the trajectory before the scheduler groups it; how the score combines with the
env reward (``add`` or ``replace``), for the episode or (``per_turn``) for each
scored turn, and the per-trajectory metrics the batch metrics need, are decided
here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    #: Scored per turn: each scored turn's call, in turn order (``model_score`` is then None).
    turn_scores: tuple[ModelScore, ...] = ()


@dataclass(frozen=True)
class TurnScore:
    """One turn's scoring call (reward.per_turn) and when it ran (unix seconds)."""

    turn: int
    score: ModelScore
    started_at: float
    finished_at: float


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
        return RewardOutcome(
            reward=self.combine(env_reward, result.score),
            env_reward=env_reward,
            model_score=result,
            metrics=_call_metrics(env_reward, result),
        )

    def apply_turns(
        self, trajectory: Trajectory, scores: Sequence[TurnScore]
    ) -> RewardOutcome:
        """Combine each scored turn's reward with its score and re-sum the episode reward (reward.per_turn).

        A scored turn's reward becomes ``combine(its env reward, score)`` and its metrics get the call's keys;
        turns not scored keep their env reward. The episode reward moves by the same amounts, so for an env
        episode (whose reward is the sum of its turn rewards) it stays that sum: ``add``: env episode reward +
        weight * sum of scores; ``replace``: weight * sum of scores (plus any unscored turn's env reward). A
        failed call scores 0. The trajectory's metrics get the sums over the calls (see metrics.MODEL_REWARD_TURNS).
        """
        env_reward = float(trajectory.episode_reward)
        if trajectory.stop_reason in UNSCORED_STOP_REASONS or not scores:
            return RewardOutcome(
                reward=env_reward, env_reward=env_reward, model_score=None
            )
        records = {record.turn: record for record in trajectory.turns}
        ordered = sorted(scores, key=lambda s: s.turn)
        totals: dict[str, float] = {}
        for scored in ordered:
            record = records[scored.turn]
            turn_env_reward = record.reward
            record.reward = self.combine(turn_env_reward, scored.score.score)
            record.reward_started_at = scored.started_at
            record.reward_finished_at = scored.finished_at
            call = _call_metrics(turn_env_reward, scored.score)
            record.metrics.update(call)
            trajectory.episode_reward += record.reward - turn_env_reward
            for key, value in call.items():
                totals[key] = totals.get(key, 0.0) + value
        got = [s.score.score for s in ordered if s.score.score is not None]
        totals[metrics.ENV_REWARD] = env_reward
        totals[metrics.MODEL_REWARD_TURNS] = float(len(ordered))
        if got:
            totals[metrics.MODEL_REWARD_SCORE] = sum(got) / len(got)
        trajectory.metrics.update(totals)
        return RewardOutcome(
            reward=trajectory.episode_reward,
            env_reward=env_reward,
            model_score=None,
            metrics=totals,
            turn_scores=tuple(s.score for s in ordered),
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


def _call_metrics(env_reward: float, result: ModelScore) -> dict[str, float]:
    """The metrics keys of one scoring call (roll_async.metrics.MODEL_REWARD_*)."""
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
    return out
