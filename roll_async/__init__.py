"""roll-async: an asynchronous per-environment rollout engine for multi-turn LLM agent RL.

The names in ``__all__`` are the public API (docs/api-reference.md): the env contract and
registry, what an agent function receives, the config loader, the trajectory type and the
errors. Everything else is reached through its module (``roll_async.envs``, ...).

``import roll_async`` stays cheap: the errors load with it (they need nothing), every other
name loads its module on first use (PEP 562 ``__getattr__``), because the env registry pulls
numpy and PIL and the config loader omegaconf, and worker processes import this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from roll_async.errors import (
    ChatTemplateError,
    CheckpointError,
    ConfigError,
    DatasetError,
    EngineStartupError,
    EnvCallError,
    EnvServiceError,
    EnvServiceUnavailable,
    InvalidInputError,
    InvalidTypeError,
    LifecycleError,
    MissingFileError,
    NoLiveReplicaError,
    NonFiniteLossError,
    OutputExistsError,
    ParseError,
    RollAsyncError,
    RolloutFatalError,
    SftDivergedError,
    TaskGenerationError,
    TrainerRankTimeoutError,
    UnsupportedHostError,
    UserCodeError,
    VisionInputError,
    WeightSyncError,
)

if TYPE_CHECKING:
    from roll_async.agent_gateway.task import AgentTask
    from roll_async.config.schema import PipelineConfig, load_config
    from roll_async.envs.base import BaseEnv, EnvConfig, InvalidAction, Observation
    from roll_async.envs.registry import make_env, register_env
    from roll_async.trajectory import EnvSpan, Trajectory, TurnRecord

__version__ = "0.1.0"

#: Public name -> the module that defines it, imported on first access.
_LAZY: dict[str, str] = {
    "register_env": "roll_async.envs.registry",
    "make_env": "roll_async.envs.registry",
    "BaseEnv": "roll_async.envs.base",
    "EnvConfig": "roll_async.envs.base",
    "Observation": "roll_async.envs.base",
    "InvalidAction": "roll_async.envs.base",
    "AgentTask": "roll_async.agent_gateway.task",
    "load_config": "roll_async.config.schema",
    "PipelineConfig": "roll_async.config.schema",
    "Trajectory": "roll_async.trajectory",
    "TurnRecord": "roll_async.trajectory",
    "EnvSpan": "roll_async.trajectory",
}

__all__ = [
    # envs: the contract and the registry
    "register_env",
    "make_env",
    "BaseEnv",
    "EnvConfig",
    "Observation",
    "InvalidAction",
    # agents
    "AgentTask",
    # config
    "load_config",
    "PipelineConfig",
    # data
    "Trajectory",
    "TurnRecord",
    "EnvSpan",
    # errors
    "RollAsyncError",
    "ConfigError",
    "UserCodeError",
    "InvalidInputError",
    "InvalidTypeError",
    "ParseError",
    "LifecycleError",
    "MissingFileError",
    "OutputExistsError",
    "DatasetError",
    "EngineStartupError",
    "NoLiveReplicaError",
    "WeightSyncError",
    "RolloutFatalError",
    "EnvCallError",
    "EnvServiceError",
    "EnvServiceUnavailable",
    "TaskGenerationError",
    "ChatTemplateError",
    "VisionInputError",
    "NonFiniteLossError",
    "TrainerRankTimeoutError",
    "CheckpointError",
    "SftDivergedError",
    "UnsupportedHostError",
]


def __getattr__(name: str) -> Any:
    """A lazy public name: import its module now and cache the value in this namespace."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's attributes plus the lazy names, so completion lists the whole public API."""
    return sorted(set(globals()) | set(__all__))
