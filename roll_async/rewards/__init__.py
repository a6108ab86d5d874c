"""Rewards from models: an LLM judge on its own engine, a batched reward-model actor, and the episode (or per-turn) scorer."""

from roll_async.config.sections import RewardConfig
from roll_async.metrics import reward_batch_metrics
from roll_async.rewards.episode_text import EpisodeText, episode_text, turn_text
from roll_async.rewards.judge import (
    LLMJudge,
    judge_engine_config,
    launch_judge_engines,
    parse_judge_score,
)
from roll_async.rewards.model_call import ModelScore, RewardClient, RewardCounters
from roll_async.rewards.reward_model import (
    RewardModelActor,
    RewardModelClient,
    launch_reward_model,
)
from roll_async.rewards.reward_services import (
    RewardService,
    launch_reward_services,
    shutdown_reward_services,
)
from roll_async.rewards.scorer import EpisodeRewardScorer, RewardOutcome, TurnScore
from roll_async.rewards.tiny_reward_model import build_tiny_reward_model
from roll_async.rewards.turn_rewards import TurnRewards

__all__ = [
    "EpisodeRewardScorer",
    "EpisodeText",
    "LLMJudge",
    "ModelScore",
    "RewardClient",
    "RewardConfig",
    "RewardCounters",
    "RewardModelActor",
    "RewardModelClient",
    "RewardOutcome",
    "RewardService",
    "TurnRewards",
    "TurnScore",
    "build_tiny_reward_model",
    "episode_text",
    "judge_engine_config",
    "launch_judge_engines",
    "launch_reward_model",
    "launch_reward_services",
    "parse_judge_score",
    "reward_batch_metrics",
    "shutdown_reward_services",
    "turn_text",
]
