"""How a run serves policy snapshots (``snapshot:<k>`` and ``pool`` seats): adapters of the policy's engines, or engines of their own.

A run that syncs LoRA adapters keeps the last versions loaded on the policy's own engines
(:func:`engine_lora_serving`), so a snapshot is a request ``adapter_lag`` back. A full-weight
run has one set of weights per engine, so each distinct lag ``k >= 1`` the train and val tags'
seats play gets a single-replica engine of its own, launched from the policy's model path with
the run's engine settings and kept out of the policy's weight-sync fleet; :class:`SnapshotWeights`
keeps the weight buckets of the last pushes (object-store refs) and after each push to the policy
loads the lag-``k`` engine with the push ``k`` syncs back. Lag 0 (a pool with ``include_current``)
is the current policy: the policy's own engines. The rollout-only pipeline syncs nothing, so
every version is the same and its snapshot seats play on the policy's engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from roll_async.config.schema import PipelineConfig
from roll_async.config.seat_rules import max_snapshot_lag, snapshot_engine_lags
from roll_async.engine.engine_actor import launch_engines, shutdown_engines
from roll_async.engine.lora_adapters import LoraServing, serving_max_loras
from roll_async.engine.replica_fleet import EngineReplicaFleet
from roll_async.errors import NoLiveReplicaError
from roll_async.pipelines.preflight import used_tags
from roll_async.trainer.lora import adapter_config_json, lora_enabled

logger = logging.getLogger(__name__)


def engine_lora_serving(config: PipelineConfig, model_path: str) -> LoraServing | None:
    """What the engines need to serve the run's adapters (trainer.lora.sync=adapter), else None.

    Each replica keeps ``max(2, staleness_bound + 1)`` versions loaded, so a request
    in flight ends on the adapter it started with, and ``k + 1`` when a game seat plays
    ``snapshot:<k>`` (the policy k versions back). None: a full-weight run, whose
    snapshots get engines of their own (:func:`launch_snapshot_engines`).
    """
    lora = config.trainer.lora
    if not lora_enabled(lora) or lora.sync != "adapter":
        return None
    return LoraServing(
        rank=lora.rank,
        max_loras=max(
            serving_max_loras(config.staleness_bound),
            max_snapshot_lag(config.custom_envs, used_tags(config)) + 1,
        ),
        adapter_config=adapter_config_json(lora, model_path),
    )


async def launch_snapshot_engines(
    config: PipelineConfig, model_path: str, tags: Iterable[str]
) -> dict[int, list[Any]]:
    """One engine replica per lag ``k >= 1`` the tags' snapshot and pool seats play, on the policy's model; {} if none.

    Only for a run whose engines serve no adapters (:func:`engine_lora_serving` is None). If one fails to
    start, those already started are shut down before the error propagates.
    """
    engines: dict[int, list[Any]] = {}
    settings = dataclasses.replace(config.engine, num_replicas=1)
    try:
        for lag in snapshot_engine_lags(config.custom_envs, tags):
            engines[lag] = await launch_engines(
                model_path, settings, name_prefix=f"snapshot_engine_{lag}"
            )
            logger.info("policy snapshot %d syncs back on its own engine", lag)
    except BaseException:
        await shutdown_snapshot_engines(engines)
        raise
    return engines


async def shutdown_snapshot_engines(engines: Mapping[int, list[Any]]) -> None:
    """Stop every snapshot engine; safe on an empty mapping."""
    for handles in engines.values():
        await shutdown_engines(handles)


class SnapshotWeights:
    """The snapshot engines' weights: the buckets of the last pushes, and which version each engine holds.

    Every engine starts on the run's start weights: the model path's (it was launched from it, as the
    policy's engines were) or the trainer's, loaded by :meth:`load_start`. After each push to the policy,
    :meth:`push` loads the lag-``k`` engine with the push ``k`` syncs back, under that push's version
    (``v - k`` when every step syncs; ``weight_sync.interval`` spaces the versions); while fewer than
    ``k`` syncs have happened it keeps the start weights, the oldest version there is. Only the buckets
    a later push can still need are kept (the last ``max k``, as object-store refs). An engine that dies
    is logged and no longer loaded: its seats' games then fail as ``env_error``; the run goes on.
    """

    def __init__(self, engines: Mapping[int, Sequence[Any]]) -> None:
        self.fleets = {lag: EngineReplicaFleet(engines[lag]) for lag in sorted(engines)}
        #: (version, weight buckets) of the last pushes, oldest first; the start weights first if loaded.
        self.kept: list[tuple[int, list[Any]]] = []
        #: lag -> the version its engine holds (None: the weights it was launched with).
        self.held: dict[int, int | None] = dict.fromkeys(self.fleets)

    async def load_start(self, buckets: list[Any], version: int) -> None:
        """The run starts on the trainer's weights (a warm start, a resume, a caller's engine): every engine gets them."""
        self.kept = [(version, buckets)]
        await self._load(dict.fromkeys(self.fleets, self.kept[0]))

    async def push(self, buckets: list[Any], version: int) -> None:
        """The policy got ``version``: each lag-``k`` engine gets the push ``k`` syncs back, once there is one."""
        self.kept.append((version, buckets))
        await self._load(
            {
                lag: self.kept[-1 - lag]
                for lag in self.fleets
                if lag < len(self.kept) and self.held[lag] != self.kept[-1 - lag][0]
            }
        )
        # the next push needs the last max-k pushes
        self.kept = self.kept[-max(self.fleets, default=1) :]

    async def _load(self, pushes: Mapping[int, tuple[int, list[Any]]]) -> None:
        """Load each engine (lag -> (version, buckets)) at once; nothing in flight is cut (in_flight ``wait``)."""
        lags = list(pushes)
        results = await asyncio.gather(
            *(
                self.fleets[lag].push_weights(pushes[lag][1], pushes[lag][0], "wait")
                for lag in lags
            ),
            return_exceptions=True,
        )
        for lag, result in zip(lags, results):
            if isinstance(result, NoLiveReplicaError):
                logger.error(
                    "the engine of policy snapshot %d is dead; its seats' games fail (%s)",
                    lag,
                    result,
                )
                del self.fleets[lag], self.held[lag]
            elif isinstance(result, BaseException):
                raise result
            else:
                self.held[lag] = pushes[lag][0]
