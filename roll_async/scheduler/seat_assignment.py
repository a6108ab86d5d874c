"""Seats: which group's seat an env asking for work takes, when a new group is made, and taking seats back.

Envs must never wait for each other: an env takes a free seat in the oldest
open group of its tag, and a new group is created only when none has one and
the tag's quota allows. That rule, the wake-up relay among envs waiting for a
seat, and cancelling a group's seats in flight form one role, apart from how
groups complete and how batches are served; the queue owns one SeatAssigner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from roll_async.scheduler.batch_serving import BatchQuota
from roll_async.scheduler.layout import derive_seed
from roll_async.scheduler.pending_groups import EpisodeGroup, PendingGroups
from roll_async.scheduler.queue_rules import QueueRules
from roll_async.scheduler.serve_order import ServeOrder
from roll_async.scheduler.served_batch import SchedulerCounters
from roll_async.scheduler.wakeups import SeatWaiters, WakeupCounters
from roll_async.trajectory import EpisodeSpec

logger = logging.getLogger(__name__)

#: ``on_cancel(env_id, group_id, episode_id)``: stop the episode that env plays for that seat.
CancelCallback = Callable[[int, int, int], Any]


class SeatAssigner:
    """Hands out seats of pending groups (creating groups within the quota) and takes them back.

    ``waiters`` holds the env loops waiting for a seat, per tag. ``counters`` are the queue's (shared): it
    counts created groups and cancelled episodes there.
    """

    def __init__(
        self,
        rules: QueueRules,
        pending: PendingGroups,
        order: ServeOrder[EpisodeGroup],
        quota: BatchQuota,
        counters: SchedulerCounters,
        wakeups: WakeupCounters,
        on_cancel: CancelCallback | None = None,
    ) -> None:
        self._rules = rules
        self._tags = list(rules.tags)
        self._pending = pending
        self._order = order
        self._quota = quota
        self._counters = counters
        self._wakeups = wakeups
        self._on_cancel = on_cancel
        self.waiters = SeatWaiters(self._tags, wakeups)

    def take(
        self, tag: str, env_id: int, *, created_step: int, created_batch: int
    ) -> EpisodeSpec | None:
        """A seat for ``env_id`` in the oldest open group of ``tag`` (or a new group); None if there is none."""
        group = self._pending.oldest_with_free_seat(tag)
        if group is None and self.may_create(tag):
            group = self.create_group(
                tag, created_step=created_step, created_batch=created_batch
            )
        if group is None:
            return None
        spec = self._assign(group, env_id)
        if self.waiters.any(tag) and self.has_free_seat(tag):
            # relay: the next waiter takes the next seat
            self.waiters.wake_one(tag)
        return spec

    def has_free_seat(self, tag: str) -> bool:
        return self._pending.oldest_with_free_seat(tag) is not None or self.may_create(
            tag
        )

    def seat_event(self, tag: str | None = None, *, suspended: bool) -> None:
        """Seats may have opened for ``tag`` (every tag if None): wake one waiter each; the relay does the rest."""
        self._wakeups.seat_events += 1
        if suspended:
            return
        for t in self._tags if tag is None else (tag,):
            if self.waiters.any(t) and self.has_free_seat(t):
                self.waiters.wake_one(t)

    def may_create(self, tag: str) -> bool:
        return self._rules.auto_create and len(
            self._pending.by_tag[tag]
        ) < self.max_pending(tag)

    def max_pending(self, tag: str) -> int:
        """Groups ``tag`` may keep pending: its batch share times the lookahead, as the serve order adjusts it."""
        return self._order.max_pending(
            self._quota.shares.get(tag, 0) * self._rules.lookahead,
            self._rules.env_groups_per_tag.get(tag, 0),
        )

    def create_group(
        self,
        tag: str,
        *,
        created_step: int,
        created_batch: int,
        seed: int | None = None,
        env_config_override: dict[str, Any] | None = None,
        num_seats: int | None = None,
    ) -> EpisodeGroup:
        """A new pending group of ``tag``: the next in the seed sequence unless ``seed`` is given."""
        index = self._pending.created_per_tag[tag]
        seats = num_seats or self._rules.num_seats
        group = EpisodeGroup(
            group_id=self._pending.next_group_id,
            tag=tag,
            tag_index=index,
            seed=derive_seed(self._rules.seed, tag, index) if seed is None else seed,
            created_step=created_step,
            created_batch=created_batch,
            num_seats=seats,
            needed=min(self._rules.group_size, seats),
            env_config_override=env_config_override,
        )
        self._pending.add(group)
        self._counters.created_groups += 1
        return group

    @staticmethod
    def _assign(group: EpisodeGroup, env_id: int) -> EpisodeSpec:
        episode_id = group.next_episode_id
        group.next_episode_id += 1
        group.in_flight[episode_id] = env_id
        override = group.env_config_override
        return EpisodeSpec(
            tag=group.tag,
            group_id=group.group_id,
            episode_id=episode_id,
            seed=group.seed,
            created_step=group.created_step,
            env_config_override=dict(override) if override is not None else None,
        )

    def cancel(self, group: EpisodeGroup) -> None:
        """Cancel every seat of ``group`` in flight (``on_cancel``); its seats re-open if it is still pending."""
        for episode_id, env_id in list(group.in_flight.items()):
            self._counters.cancelled_episodes += 1
            if self._on_cancel is not None:
                try:
                    self._on_cancel(env_id, group.group_id, episode_id)
                except Exception:  # a dead worker must not break the scheduler; its loop error surfaces elsewhere
                    logger.exception(
                        "cancelling episode %s/%s on env %s failed",
                        group.group_id,
                        episode_id,
                        env_id,
                    )
        group.in_flight.clear()
        self._pending.list_open(group)
