"""Validation: a fixed set of episodes, each played once per evaluation, greedily.

The episodes are fixed for the whole run, so evaluations are comparable and
(with a deterministic engine) identical given the same weights:

* with ``val_env_manager.dataset`` (an env-config parquet written by
  ``roll-async make-env-dataset``): one episode per row, with the row's seed and
  env config. A row goes to the val tag named by its ``data_source`` if that is
  a tag, else to the first val tag whose ``env_type`` is the row's env name.
* otherwise: ``num_groups_partition[tag]`` (or an even split of
  ``num_env_groups``) episodes per tag, seeds ``derive_seed(seed, "val/<tag>", i)``.

The val scheduler uses ``group_size: 1`` semantics (every episode is its own
group), greedy decoding (temperature 0) and no filter; an episode whose env
keeps failing is reported with stop reason ``env_error`` rather than retried
forever. Results come back in episode order; metrics are ``val/...`` and
``val/<tag>/...`` (``roll_async.metrics.validation_metrics``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from roll_async.config.schema import PipelineConfig
from roll_async.metrics import validation_metrics
from roll_async.scheduler.group_queue import ServedBatch, derive_seed, groups_per_tag
from roll_async.trajectory import EpisodeSpec, Trajectory


class FixedRoundRunner(Protocol):
    """A RolloutScheduler or LocalRolloutScheduler built with ``which="val"``."""

    async def run_fixed_round(
        self, episodes: Sequence[EpisodeSpec], step: int
    ) -> ServedBatch: ...

    async def shutdown(self) -> None: ...


def build_validation_episodes(config: PipelineConfig) -> list[EpisodeSpec]:
    """The run's fixed validation episodes (see module docstring)."""
    em = config.val_env_manager
    if em.num_env_groups == 0 or not em.tags:
        return []
    if em.dataset:
        return _episodes_from_dataset(config, em.dataset)
    episodes = []
    for tag, count in zip(
        em.tags, groups_per_tag(em.tags, em.num_env_groups, em.num_groups_partition)
    ):
        for index in range(count):
            episodes.append(
                EpisodeSpec(
                    tag=tag,
                    group_id=len(episodes),
                    episode_id=0,
                    seed=derive_seed(config.seed, f"val/{tag}", index),
                    created_step=0,
                )
            )
    return episodes


def _episodes_from_dataset(config: PipelineConfig, path: str) -> list[EpisodeSpec]:
    from roll_async.envs.dataset import load_env_dataset

    tags = list(config.val_env_manager.tags)
    episodes = []
    for row_index, row in enumerate(load_env_dataset(path)):
        if row.data_source in tags:
            tag = row.data_source
        else:
            matching = [
                t for t in tags if config.custom_envs[t].env_type == row.env_name
            ]
            if not matching:
                raise ValueError(
                    f"val_env_manager.dataset={path!r} row {row_index} is for env {row.env_name!r}, but no val tag "
                    f"({', '.join(tags)}) has env_type {row.env_name!r}; add such a tag to val_env_manager.tags"
                )
            tag = matching[0]
        episodes.append(
            EpisodeSpec(
                tag=tag,
                group_id=len(episodes),
                episode_id=0,
                seed=row.seed,
                created_step=0,
                env_config_override=dict(row.env_config),
            )
        )
    return episodes


class ValidationScheduler:
    """Runs every validation episode once per ``evaluate``."""

    def __init__(
        self, runner: FixedRoundRunner, episodes: Sequence[EpisodeSpec]
    ) -> None:
        self.runner = runner
        self.episodes = list(episodes)

    @classmethod
    def create(
        cls,
        config: PipelineConfig,
        *,
        engine_handles: Sequence[Any],
        tokenizer_path: str,
        env_factory: Any = None,
    ) -> ValidationScheduler:
        """The Ray-based validation scheduler for ``config.val_env_manager``."""
        from roll_async.scheduler.rollout_scheduler import RolloutScheduler

        runner = RolloutScheduler(
            config,
            engine_handles=engine_handles,
            tokenizer_path=tokenizer_path,
            which="val",
            env_factory=env_factory,
        )
        return cls(runner, build_validation_episodes(config))

    async def evaluate(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Play all episodes once; returns them in episode order and their ``val/`` metrics."""
        if not self.episodes:
            return [], {}
        served = await self.runner.run_fixed_round(self.episodes, step)
        metrics = validation_metrics(served.trajectories)
        metrics["val/wait_s"] = served.wait_s
        return served.trajectories, metrics

    async def shutdown(self) -> None:
        await self.runner.shutdown()
