"""The reward models of a run as servers: launched by the pipeline, reached from every EnvManagerWorker, shut down at the end.

A judge or reward model outlives any one worker (a restarted worker reaches the
same server) and must never join the policy's weight syncs, so the pipeline
launches one per tag with a ``reward`` beside the policy engines, hands the
rollout side only picklable handles, and each worker process builds its own
bounded client and scorer from them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import ray

from roll_async.config.sections import CustomEnvConfig, RewardConfig
from roll_async.engine.engine_actor import shutdown_engines
from roll_async.rewards.judge import LLMJudge, launch_judge_engines
from roll_async.rewards.model_call import RewardClient
from roll_async.rewards.reward_model import RewardModelClient, launch_reward_model
from roll_async.rewards.scorer import EpisodeRewardScorer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RewardService:
    """The running server of one tag's reward: its config and the Ray handles that reach it (picklable)."""

    tag: str
    config: RewardConfig
    #: judge: its own engine replica actors (never the policy's); reward_model: the one RewardModelActor.
    handles: tuple[Any, ...]

    def client(self, request_transport: str = "ray") -> RewardClient:
        """A new client in this process: its own concurrency bound, timeouts and counters."""
        if self.config.kind == "judge":
            return LLMJudge.from_handles(
                self.config, self.handles, request_transport=request_transport
            )
        return RewardModelClient.from_handle(self.config, self.handles[0])

    def scorer(self, request_transport: str = "ray") -> EpisodeRewardScorer:
        """The EpisodeRewardScorer the EnvManagers of this tag in one process share."""
        return EpisodeRewardScorer(self.config, self.client(request_transport))


def reward_configs(
    custom_envs: Mapping[str, CustomEnvConfig], tags: Iterable[str]
) -> dict[str, RewardConfig]:
    """``tag -> reward`` of each of ``tags`` that has one."""
    rewards = {tag: custom_envs[tag].reward for tag in sorted(set(tags))}
    return {tag: reward for tag, reward in rewards.items() if reward is not None}


async def launch_reward_service(tag: str, config: RewardConfig) -> RewardService:
    """Start the server of one tag's reward and wait until its model is loaded."""
    suffix = f"{tag}_{uuid.uuid4().hex[:6]}"
    if config.kind == "judge":
        handles = await launch_judge_engines(config, name_prefix=f"judge_{suffix}")
    else:
        handles = [await launch_reward_model(config, name=f"reward_model_{suffix}")]
    return RewardService(tag=tag, config=config, handles=tuple(handles))


async def launch_reward_services(
    custom_envs: Mapping[str, CustomEnvConfig], tags: Iterable[str]
) -> dict[str, RewardService]:
    """One server per tag of ``tags`` with a reward, one after the other (each load takes the cores); if one
    fails to start, those already started are shut down before the error propagates."""
    services: dict[str, RewardService] = {}
    try:
        for tag, config in reward_configs(custom_envs, tags).items():
            services[tag] = await launch_reward_service(tag, config)
            logger.info(
                "reward for tag %s: %s %s on %d actor(s)",
                tag,
                config.kind,
                config.model_path,
                len(services[tag].handles),
            )
    except BaseException:
        await shutdown_reward_services(services)
        raise
    return services


async def shutdown_reward_services(services: Mapping[str, RewardService]) -> None:
    """Stop every server (judge engines shut vLLM down first); never raises. Safe on an empty mapping."""
    for service in services.values():
        try:
            if service.config.kind == "judge":
                await shutdown_engines(list(service.handles))
            else:
                for handle in service.handles:
                    ray.kill(handle, no_restart=True)
        except Exception:
            logger.warning(
                "reward server of tag %s did not shut down cleanly",
                service.tag,
                exc_info=True,
            )
