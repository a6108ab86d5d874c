"""The config's public names in one import: the section dataclasses and their choices, loading, validation.

Code across the project imports from here (``from roll_async.config.schema import PipelineConfig,
load_config``), so the three modules behind it can change shape without touching their users: the
dataclasses (sections.py), the YAML loader (loading.py) and the rules (validation.py).
"""

from __future__ import annotations

from typing import get_args

from roll_async.config.field_checks import check_fields
from roll_async.config.loading import config_to_yaml, load_config
from roll_async.config.sections import (
    AdvantageEstimator,
    CheckpointConfig,
    CustomEnvConfig,
    EngineConfig,
    EngineDtype,
    EnvManagerConfig,
    GenerationConfig,
    GroupFilterName,
    InFlightPolicy,
    Isolation,
    LoggingConfig,
    LoraConfig,
    LoraSync,
    LossAgg,
    Mode,
    ModelConfig,
    PipelineConfig,
    RedundancyKeep,
    ReplayConfig,
    RequestTransport,
    RewardConfig,
    RolloutSchedPolicy,
    ServeOrder,
    SFTWarmupConfig,
    TrainerConfig,
    TrainerDtype,
    TrainerParamDtype,
    TrainerPlacement,
    WeightSyncConfig,
    WorkerPlacement,
)
from roll_async.config.validation import validate_config
from roll_async.errors import ConfigError

#: engine.request_transport values, as a tuple (argparse choices).
REQUEST_TRANSPORTS: tuple[str, ...] = get_args(RequestTransport)
#: custom_envs.<Tag>.isolation values, as a tuple.
ISOLATION_MODES: tuple[str, ...] = get_args(Isolation)

__all__ = [
    "ISOLATION_MODES",
    "REQUEST_TRANSPORTS",
    "AdvantageEstimator",
    "CheckpointConfig",
    "ConfigError",
    "CustomEnvConfig",
    "EngineConfig",
    "EngineDtype",
    "EnvManagerConfig",
    "GenerationConfig",
    "GroupFilterName",
    "InFlightPolicy",
    "Isolation",
    "LoggingConfig",
    "LoraConfig",
    "LoraSync",
    "LossAgg",
    "Mode",
    "ModelConfig",
    "PipelineConfig",
    "ReplayConfig",
    "RequestTransport",
    "RewardConfig",
    "RolloutSchedPolicy",
    "SFTWarmupConfig",
    "ServeOrder",
    "RedundancyKeep",
    "TrainerConfig",
    "TrainerDtype",
    "TrainerParamDtype",
    "TrainerPlacement",
    "WeightSyncConfig",
    "WorkerPlacement",
    "check_fields",
    "config_to_yaml",
    "load_config",
    "validate_config",
]
