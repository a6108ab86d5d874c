"""Validation: a fixed set of episodes, each played once per evaluation, greedily.

Evaluations are only comparable across steps if they play the same episodes
the same way, so the episodes are fixed once for the run and every evaluation
plays each of them once, in order, through any scheduler that can play fixed
rounds (with a deterministic engine, the same weights give the same results).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from roll_async.config.rollout_spec import RolloutSpec
from roll_async.errors import ConfigError
from roll_async.metrics import validation_metrics
from roll_async.scheduler.layout import derive_seed, groups_per_tag
from roll_async.scheduler.served_batch import ServedBatch
from roll_async.trajectory import EpisodeSpec, Trajectory


class FixedRoundRunner(Protocol):
    """A RolloutScheduler or LocalRolloutScheduler built for the validation side (``rollout_spec(config, "val")``)."""

    async def run_fixed_round(
        self, episodes: Sequence[EpisodeSpec], step: int
    ) -> ServedBatch: ...

    async def shutdown(self) -> None: ...


def build_validation_episodes(spec: RolloutSpec) -> list[EpisodeSpec]:
    """The run's fixed validation episodes, for the validation side ``spec``.

    * with ``val_env_manager.dataset`` (an env-config parquet written by ``roll-async make-env-dataset``):
      one episode per row, with the row's seed and env config. A row goes to the val tag named by its
      ``data_source`` if that is a tag, else to the first val tag whose ``env_type`` is the row's env name.
    * otherwise: ``num_groups_partition[tag]`` (or an even split of ``num_env_groups``) episodes per tag,
      seeds ``derive_seed(seed, "val/<tag>", i)``.
    """
    em = spec.env_manager
    if em.num_env_groups == 0 or not em.tags:
        return []
    if em.dataset:
        return _episodes_from_dataset(spec, em.dataset)
    episodes: list[EpisodeSpec] = []
    for tag, count in zip(
        em.tags, groups_per_tag(em.tags, em.num_env_groups, em.num_groups_partition)
    ):
        for index in range(count):
            episodes.append(
                EpisodeSpec(
                    tag=tag,
                    group_id=len(episodes),
                    episode_id=0,
                    seed=derive_seed(spec.seed, f"val/{tag}", index),
                    created_step=0,
                )
            )
    return episodes


def _episodes_from_dataset(spec: RolloutSpec, path: str) -> list[EpisodeSpec]:
    # Lazy: reading parquet imports pyarrow, which a run without a val dataset never needs.
    from roll_async.envs.dataset import load_env_dataset

    tags = list(spec.env_manager.tags)
    episodes: list[EpisodeSpec] = []
    for row_index, row in enumerate(load_env_dataset(path)):
        if row.data_source in tags:
            tag = row.data_source
        else:
            matching = [t for t in tags if spec.custom_envs[t].env_type == row.env_name]
            if not matching:
                raise ConfigError(
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
    """Runs every validation episode once per ``evaluate``.

    The runner plays them with ``group_size: 1`` semantics (every episode is its own group), greedy decoding
    (temperature 0) and no filter; an episode whose env keeps failing is reported with stop reason
    ``env_error`` rather than retried forever. Results come back in episode order; metrics are ``val/...``
    and ``val/<tag>/...`` (``roll_async.metrics.validation_metrics``).
    """

    def __init__(
        self, runner: FixedRoundRunner, episodes: Sequence[EpisodeSpec]
    ) -> None:
        self.runner = runner
        self.episodes = list(episodes)

    @classmethod
    def for_spec(
        cls, spec: RolloutSpec, runner: FixedRoundRunner
    ) -> ValidationScheduler:
        """Validation of the side ``spec`` (its fixed episodes), played by ``runner`` (built for that spec)."""
        return cls(runner, build_validation_episodes(spec))

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
