"""Serving batches from the group queue: the batch quota, when a batch is ready, and what each batch reports.

A batch takes a fixed share of groups per tag, is ready when the serve order
says each tag's share is, and reports the events, unserved episodes and filter
drops since the previous batch. Those are the trainer side's concerns, apart
from how envs get seats; keeping them here leaves the queue to orchestrate.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from roll_async.scheduler.pending_groups import EpisodeGroup, PendingGroups
from roll_async.scheduler.queue_rules import QueueRules
from roll_async.scheduler.serve_order import ServeOrder
from roll_async.scheduler.served_batch import SchedulerCounters
from roll_async.trajectory import Trajectory

logger = logging.getLogger(__name__)

#: Most unserved episodes kept between two batches (validation rounds never drain them).
MAX_UNSERVED_KEPT = 10_000


@dataclass(frozen=True)
class BatchQuota:
    """How a batch of ``groups_per_batch`` groups splits between tags, and the filter's drop budget for it."""

    groups_per_batch: int
    shares: dict[str, int]
    max_filter_drops: int

    @classmethod
    def for_rules(cls, rules: QueueRules, env_tags: Mapping[int, str]) -> BatchQuota:
        """The quota of ``rules`` (computed once: ``shares`` is read per seat); warns of tags that get no groups."""
        groups_per_batch = rules.groups_per_batch
        shares = rules.shares
        starved = [t for t, s in shares.items() if s == 0 and t in env_tags.values()]
        if starved and rules.auto_create:
            logger.warning(
                "tags %s get 0 of the %d groups per batch; their envs stay idle (raise the batch size or "
                "change num_groups_partition)",
                starved,
                groups_per_batch,
            )
        return cls(groups_per_batch, shares, rules.filter_drops_limit)

    def ready_heads(
        self,
        tags: Sequence[str],
        order: ServeOrder[EpisodeGroup],
        pending: PendingGroups,
    ) -> list[EpisodeGroup] | None:
        """The groups of ``tags`` to serve if a batch is ready (see the serve order), else None."""
        shares = self.shares
        for tag in tags:
            if not order.is_ready(tag, pending.by_tag[tag], shares.get(tag, 0)):
                return None
        heads: list[EpisodeGroup] = []
        for tag in tags:
            heads.extend(order.heads(tag, pending.by_tag[tag], shares.get(tag, 0)))
        return heads


class BatchAccounts:
    """What each served batch reports about the time since the previous one.

    ``counters`` are the queue's cumulative counters (shared, not copied); a batch reports their change since
    the previous batch, the episodes not served meanwhile (``unserved``, bounded so an undrained queue cannot
    grow without end), and spends at most ``max_filter_drops`` filter drops.
    """

    def __init__(self, counters: SchedulerCounters, max_filter_drops: int) -> None:
        self._counters = counters
        self._at_last_batch = SchedulerCounters()
        self._max_filter_drops = max_filter_drops
        self._filter_drops = 0
        self.batches_served = 0
        #: Episodes not served (see ServedBatch.unserved), as (fate, trajectory).
        self.unserved: deque[tuple[str, Trajectory]] = deque(maxlen=MAX_UNSERVED_KEPT)

    def spend_filter_drop(self) -> bool:
        """One more filter drop while waiting for this batch, if the budget allows (else the group is kept)."""
        if self._filter_drops < self._max_filter_drops:
            self._filter_drops += 1
            return True
        return False

    def close_batch(self) -> dict[str, int]:
        """The counters' change since the previous batch; starts the next batch's counts and filter budget."""
        counters = self._counters.minus(self._at_last_batch)
        self._at_last_batch = SchedulerCounters(**asdict(self._counters))
        self._filter_drops = 0
        return counters

    def take_unserved(self) -> list[tuple[str, Trajectory]]:
        unserved = list(self.unserved)
        self.unserved.clear()
        return unserved
