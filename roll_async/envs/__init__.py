"""Environments: the gym-style multi-turn text env contract, the registry that builds envs by name, the built-in envs, wrappers, and adapters for env libraries users already have."""

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
