"""Environments: the gym-style multi-turn text env API, the registry, and the built-in envs.

``make_env("sokoban", {"dim_room": [6, 6]})`` builds an env; ``env.reset(seed)``
returns ``(observation, info)`` with ``info["instruction"]``; ``env.step(text)``
takes the model's raw response and returns ``(observation, reward, terminated,
truncated, info)`` with ``info["metrics"]``. See :mod:`roll_async.envs.base`.
"""

from roll_async.envs.base import (
    BaseEnv,
    EnvConfig,
    InvalidAction,
    Observation,
    env_is_async,
)
from roll_async.envs.countdown import CountdownConfig, CountdownEnv
from roll_async.envs.frozen_lake import FrozenLakeConfig, FrozenLakeEnv
from roll_async.envs.parsing import ActionParser, ParsedAction
from roll_async.envs.registry import (
    make_env,
    register_env,
    registered_envs,
    resolve_env_class,
)
from roll_async.envs.retrieval_qa import RetrievalQAConfig, RetrievalQAEnv
from roll_async.envs.sliding_puzzle import SlidingPuzzleConfig, SlidingPuzzleEnv
from roll_async.envs.sokoban import SokobanConfig, SokobanEnv

__all__ = [
    "ActionParser",
    "BaseEnv",
    "CountdownConfig",
    "CountdownEnv",
    "EnvConfig",
    "FrozenLakeConfig",
    "FrozenLakeEnv",
    "InvalidAction",
    "Observation",
    "ParsedAction",
    "RetrievalQAConfig",
    "RetrievalQAEnv",
    "SlidingPuzzleConfig",
    "SlidingPuzzleEnv",
    "SokobanConfig",
    "SokobanEnv",
    "env_is_async",
    "make_env",
    "register_env",
    "registered_envs",
    "resolve_env_class",
]
