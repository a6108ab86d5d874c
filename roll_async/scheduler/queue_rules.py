"""The settings a group queue enforces, checked once when they are made.

The queue's behaviour depends on a dozen settings (group shape, batch quota,
mode and staleness, filter, error limits, serve order) that come from a
rollout side's spec in a run and directly from tests and simulations; one
frozen record with its own checks keeps the queue itself free of argument
plumbing and lets a bad combination fail before any env asks for work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from roll_async.config.field_checks import bounded, check_fields
from roll_async.config.rollout_spec import RolloutSpec
from roll_async.config.schema import Mode, RedundancyKeep, ServeOrder
from roll_async.errors import ConfigError
from roll_async.scheduler.filters import GroupFilter, resolve_group_filter
from roll_async.scheduler.layout import (
    env_groups_by_tag,
    groups_per_tag,
    split_by_weights,
)
from roll_async.scheduler.serve_order import check_serve_order


@dataclass(frozen=True)
class QueueRules:
    """What a GroupQueueManager enforces (see its docstring for the rules themselves)."""

    tags: Sequence[str]
    group_size: int = bounded(ge=1)
    #: The batch quota: groups in each batch ``get_batch`` returns (the spec's groups_per_batch).
    groups_per_batch: int = bounded(ge=1)
    #: Groups per tag, same length as ``tags``; empty means one each (the batch splits evenly).
    num_groups_partition: Sequence[int] = ()
    group_size_redundancy: int = bounded(0, ge=0)
    #: Which trajectories a group with redundant seats keeps: seat_order (unbiased) or first_finished.
    redundancy_keep: RedundancyKeep = "seat_order"
    mode: Mode = "sync"
    #: Steps a pending group may lag the policy step; resolved once by the rollout spec (0 in sync mode).
    staleness_bound: int = bounded(0, ge=0)
    seed: int = 0
    group_filter: str | GroupFilter = "none"
    #: False: the queue creates no groups and plays given episodes only (``run_fixed_round``: validation).
    auto_create: bool = True
    #: Env errors a group may collect before it is dropped; None means 3 x seats.
    max_errors_per_group: int | None = None
    max_consecutive_env_errors: int = 100
    #: Filter drops while waiting for one batch before groups are kept unfiltered; None means 10 x groups.
    max_filter_drops_per_batch: int | None = None
    serve_order: ServeOrder = "fifo"
    #: first_complete: a tag may keep as many groups pending as it has env groups (over-provisioning is used).
    env_groups_per_tag: Mapping[str, int] = field(default_factory=dict)
    #: Steps between weight pushes (weight_sync.interval): the engines serve version ``s - s % interval``
    #: at policy step ``s``, so staleness is counted from that version (see ``served_version``).
    weight_sync_interval: int = bounded(1, ge=1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", tuple(self.tags))
        object.__setattr__(
            self, "num_groups_partition", tuple(self.num_groups_partition)
        )
        object.__setattr__(self, "env_groups_per_tag", dict(self.env_groups_per_tag))
        check_serve_order(self.serve_order)
        check_fields(
            QueueRules, self
        )  # every limit and word at once (redundancy_keep, counts >= 1)
        if self.mode == "sync" and self.staleness_bound != 0:
            raise ConfigError(
                f"staleness_bound={self.staleness_bound} with mode='sync': sync mode serves every group at "
                "the step it was made for; pass the rollout spec's bound (0 in sync mode)"
            )
        if len(self.partition) != len(self.tags):
            raise ConfigError(
                f"num_groups_partition={list(self.num_groups_partition)} needs one entry per tag "
                f"{list(self.tags)}"
            )
        resolve_group_filter(self.group_filter)  # an unknown name fails here
        if self.group_filter == "zero_variance" and self.group_size < 2:
            raise ConfigError(
                "group_filter='zero_variance' needs group_size >= 2 (a single reward has no variance)"
            )

    @classmethod
    def for_spec(cls, spec: RolloutSpec) -> QueueRules:
        """The rules of one rollout side."""
        em = spec.env_manager
        return cls(
            tags=em.tags,
            num_groups_partition=groups_per_tag(
                em.tags, em.num_env_groups, em.num_groups_partition
            ),
            group_size=em.group_size,
            group_size_redundancy=spec.seat_redundancy,
            redundancy_keep=em.redundancy_keep,
            groups_per_batch=spec.groups_per_batch,
            mode=spec.mode,
            staleness_bound=spec.staleness_bound,
            seed=spec.seed,
            group_filter=spec.group_filter,
            auto_create=not spec.fixed_rounds,
            serve_order=spec.serve_order,
            env_groups_per_tag=env_groups_by_tag(spec),
            weight_sync_interval=spec.weight_sync_interval,
        )

    @property
    def num_seats(self) -> int:
        """Seats per group: group_size plus the redundant ones."""
        return self.group_size + self.group_size_redundancy

    def served_version(self, step: int) -> int:
        """The weight version (relative to the run's base) the engines serve at policy step ``step``.

        The pipeline pushes version ``s + 1`` after step ``s`` when ``(s + 1) % weight_sync_interval == 0``, so
        at step ``step`` they serve the last multiple of the interval. A resumed run's engines may be further on
        (they get the start step's weights), which only makes this an underestimate: the bound still holds.
        """
        return step - step % self.weight_sync_interval

    def version_lag(self, step: int, created_step: int) -> int:
        """Versions between the trainer at ``step`` and the weights a group made at ``created_step`` used (at most)."""
        return step - self.served_version(created_step)

    @property
    def lookahead(self) -> int:
        """Batches of groups a tag may have pending: the staleness bound, at least 1 (sync mode's bound is 0)."""
        return max(1, self.staleness_bound)

    @property
    def partition(self) -> list[int]:
        """Weights splitting a batch's groups between tags."""
        return list(self.num_groups_partition) or [1] * len(self.tags)

    @property
    def errors_per_group_limit(self) -> int:
        return (
            self.max_errors_per_group
            if self.max_errors_per_group is not None
            else 3 * self.num_seats
        )

    @property
    def filter_drops_limit(self) -> int:
        return (
            self.max_filter_drops_per_batch
            if self.max_filter_drops_per_batch is not None
            else 10 * self.groups_per_batch
        )

    @property
    def shares(self) -> dict[str, int]:
        """Groups per tag in each batch of ``groups_per_batch`` groups (largest remainder)."""
        return dict(
            zip(self.tags, split_by_weights(self.groups_per_batch, self.partition))
        )
