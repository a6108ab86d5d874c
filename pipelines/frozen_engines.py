"""The engines of ``frozen:`` seats: one per distinct frozen model, started and stopped with the run, never weight-synced.

A frozen opponent is another model served like the policy, so it gets an engine of its
own: launched here from the seats of the tags a run plays, handed to the rollout
schedulers by model path, and kept out of the weight-sync fleet (the pipeline syncs
only ``self.engines``), so its weights are the ones it was loaded with.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from roll_async.config.schema import PipelineConfig
from roll_async.config.seat_rules import frozen_models
from roll_async.engine.engine_actor import launch_engines, shutdown_engines
from roll_async.model.paths import resolve_model_path

logger = logging.getLogger(__name__)


async def launch_frozen_engines(
    config: PipelineConfig, tags: Iterable[str]
) -> dict[str, list[Any]]:
    """One engine replica per frozen model the tags' seats name, with the run's engine settings; {} if none.

    If one fails to start, those already started are shut down before the error propagates.
    """
    engines: dict[str, list[Any]] = {}
    settings = dataclasses.replace(config.engine, num_replicas=1)
    try:
        for index, model in enumerate(frozen_models(config.custom_envs, tags)):
            engines[model] = await launch_engines(
                resolve_model_path(model),
                settings,
                name_prefix=f"frozen_engine_{index}",
            )
            logger.info("frozen opponent %s on its own engine", model)
    except BaseException:
        await shutdown_frozen_engines(engines)
        raise
    return engines


async def shutdown_frozen_engines(engines: Mapping[str, list[Any]]) -> None:
    """Stop every frozen model's engines; safe on an empty mapping."""
    for handles in engines.values():
        await shutdown_engines(handles)
