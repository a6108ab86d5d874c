"""GroupQueueManager: which episode each env plays next, and when a batch of whole groups is ready.

Envs must never wait for each other and the trainer must only ever get whole
groups, fresh enough for its step; these rules decide both, so they live in one
plain asyncio class (no Ray) that unit tests drive directly and that the
RolloutScheduler hosts in a Ray actor and the LocalRolloutScheduler in-process.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from roll_async.config.rollout_spec import RolloutSpec
from roll_async.errors import RolloutFatalError
from roll_async.scheduler.filters import resolve_group_filter
from roll_async.scheduler.layout import derive_seed, rollout_layout
from roll_async.scheduler.queue_rules import QueueRules
from roll_async.scheduler.serve_order import ServeOrder, make_serve_order
from roll_async.scheduler.served_batch import SchedulerCounters, ServedBatch
from roll_async.scheduler.wakeups import SeatWaiters, TrainerWakeup, WakeupCounters
from roll_async.trajectory import EpisodeSpec, Trajectory

logger = logging.getLogger(__name__)

CancelCallback = Callable[[int, int, int], Any]

#: Most unserved episodes kept between two batches (validation rounds never drain them).
_MAX_UNSERVED_KEPT = 10_000


@dataclass(eq=False)
class _Group:
    group_id: int
    tag: str
    tag_index: int
    seed: int
    created_step: int
    num_seats: int
    needed: int
    env_config_override: dict[str, Any] | None = None
    #: Batches served before this group was created (a group served later than the next batch was carried over).
    created_batch: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)
    in_flight: dict[int, int] = field(default_factory=dict)  # episode_id -> env_id
    next_episode_id: int = 0
    env_errors: int = 0
    complete: bool = False
    #: In the tag's list of groups that may have a free seat (_PendingGroups.open).
    listed_open: bool = False

    def free_seats(self) -> int:
        if self.complete:
            return 0
        return self.num_seats - len(self.trajectories) - len(self.in_flight)


class _PendingGroups:
    """Per tag, the groups created and not yet served or dropped, and how groups are numbered.

    ``by_tag[tag]`` is ordered by group_id (so by created_step too). ``open[tag]`` lists, oldest first, the
    pending groups that may have a free seat; full ones are dropped from it lazily, so finding a seat does
    not rescan every pending group (a large run keeps thousands pending).
    """

    def __init__(self, tags: Sequence[str]) -> None:
        self.by_tag: dict[str, list[_Group]] = {tag: [] for tag in tags}
        self.open: dict[str, deque[_Group]] = {tag: deque() for tag in tags}
        self.by_id: dict[int, _Group] = {}
        #: The position in the seed sequence (seed_state): the next group_id, groups made per tag.
        self.next_group_id = 0
        self.created_per_tag = {tag: 0 for tag in tags}

    def __iter__(self) -> Iterator[_Group]:
        for groups in self.by_tag.values():
            yield from groups

    def is_pending(self, group: _Group) -> bool:
        return self.by_id.get(group.group_id) is group

    def add(self, group: _Group) -> None:
        self.next_group_id = group.group_id + 1
        self.created_per_tag[group.tag] += 1
        self.by_tag[group.tag].append(group)
        self.by_id[group.group_id] = group
        self.list_open(group)

    def remove(self, group: _Group) -> int | None:
        """Take ``group`` out in O(log n) (bisect by group_id); its former index in ``by_tag``, if it was there."""
        pending = self.by_tag[group.tag]
        index = bisect.bisect_left(pending, group.group_id, key=lambda g: g.group_id)
        found = index < len(pending) and pending[index] is group
        if found:
            del pending[index]
        self.by_id.pop(group.group_id, None)
        return index if found else None

    def oldest_with_free_seat(self, tag: str) -> _Group | None:
        open_groups = self.open[tag]
        while open_groups:
            group = open_groups[0]
            if group.free_seats() > 0 and self.is_pending(group):
                return group
            open_groups.popleft()  # full, complete or gone; re-listed if a seat re-opens
            group.listed_open = False
        return None

    def list_open(self, group: _Group) -> None:
        """Put a pending group back in its tag's open list after a seat re-opened (error, abort, cancel)."""
        if group.listed_open or group.free_seats() <= 0 or not self.is_pending(group):
            return
        group.listed_open = True
        open_groups = self.open[group.tag]
        if not open_groups or open_groups[-1].group_id < group.group_id:
            open_groups.append(group)
        else:
            ordered = list(open_groups)
            bisect.insort(ordered, group, key=lambda g: g.group_id)
            self.open[group.tag] = deque(ordered)


class _BusyWindow:
    """The rollout window a batch stands for, and the env seconds spent waiting for a seat in it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.start = clock()
        #: env_id -> when it began waiting for a seat.
        self._idle_since: dict[int, float] = {}
        #: Idle env seconds of waits that ended in this window.
        self._idle_s = 0.0

    def env_waits(self, env_id: int) -> None:
        if env_id not in self._idle_since:
            self._idle_since[env_id] = self._clock()

    def is_waiting(self, env_id: int) -> bool:
        """The env is inside next_episode, waiting for a seat."""
        return env_id in self._idle_since

    def env_stops_waiting(self, env_id: int) -> None:
        since = self._idle_since.pop(env_id, None)
        if since is not None:
            self._idle_s += max(0.0, self._clock() - max(since, self.start))

    def restart(self) -> None:
        self.start = self._clock()
        self._idle_s = 0.0

    def close(self, now: float, num_envs: int) -> tuple[float, float]:
        """End the window at ``now``: (its seconds, the share of env seconds not spent waiting for a seat)."""
        window = now - self.start
        idle_s = self._idle_s + sum(
            now - max(since, self.start) for since in self._idle_since.values()
        )
        env_seconds = num_envs * window
        self.start = now
        self._idle_s = 0.0
        busy = max(0.0, 1.0 - idle_s / env_seconds) if env_seconds > 0 else 0.0
        return window, busy


@dataclass(frozen=True)
class _BatchQuota:
    """How a batch of ``groups_per_batch`` groups splits between tags, and the filter's drop budget for it."""

    groups_per_batch: int
    shares: dict[str, int]
    max_filter_drops: int


class GroupQueueManager:
    """Hands out episodes (seats of groups) and serves whole groups as batches.

    Groups and seats. A *group* is one episode specification (tag, env config, seed) played by
    ``group_size`` env instances; it has ``group_size + group_size_redundancy`` *seats*. Env instances form
    one pool per tag (``roll_async.scheduler.layout``). An env that asks for work (``next_episode``) takes a
    free seat in the OLDEST open group of its tag; only if none has a free seat is a new group created (quota
    permitting). So envs never wait for each other: a fast env moves on to the next group while a slow
    sibling is still mid-episode, and the oldest groups get envs first. ``group_id`` is unique per group for
    the whole run; ``episode_id`` numbers the seats handed out within a group (0, 1, ..., including
    re-issued seats after errors). Group number ``i`` of tag ``t`` plays ``derive_seed(run_seed, t, i)``; all
    trajectories of a group share tag, env config and seed.

    Completion and redundancy. Seats are numbered in launch order (``episode_id``); a seat whose episode
    failed (``env_error``) or was given back (``aborted``) drops out, and its re-issued seat is launched
    last. ``redundancy_keep: seat_order`` (the default): a group is complete when the first ``group_size``
    seats still standing, in launch order, have all finished; those are kept, in seat order, and a
    redundant seat counts only where an earlier seat failed, so which episodes are kept does not depend on
    how long they took. A redundant episode that finished but is not kept is reported unserved
    (``redundant``). ``first_finished``: complete when ``group_size`` successful trajectories have arrived,
    kept in arrival order; less waiting on the slowest seat, but each group is biased toward short
    episodes (and toward whatever outcome correlates with length). Either way, the group's seats still in
    flight are then cancelled through ``on_cancel`` (the EnvManager aborts its engine request and discards
    the partial episode) and any trajectory that still arrives for it is discarded (``late_trajectories``).

    Group filter. On completion the configured filter (``filters.GROUP_FILTERS``) decides; a dropped group
    is counted (``filtered_groups``) and frees its quota slot, so a replacement group is created:
    ``get_batch`` always returns kept, whole groups. Safety valve: after ``max_filter_drops_per_batch`` drops
    while waiting for one batch, groups are kept unfiltered (``filter_bypassed_groups``) so a filter that
    rejects everything cannot stall training forever.

    Env errors. A trajectory with stop reason ``env_error`` is counted (``env_errors``), its seat re-opens,
    and another env (or the same, rebuilt one) plays it again. A group that collects more than
    ``max_errors_per_group`` errors is dropped and replaced (``dropped_error_groups``; in fixed/validation
    rounds the error trajectory is reported as the result instead). ``max_consecutive_env_errors`` errors in
    a row with no successful trajectory in between is a broken env setup: ``get_batch`` raises.

    Quota. Per batch, each tag contributes ``shares[tag]`` groups (``groups_per_batch`` split by
    ``num_groups_partition``, largest remainder). A tag may have at most ``shares[tag] * lookahead`` groups
    pending (created, not yet served), where ``lookahead = 1`` in sync mode and ``max_staleness`` in async
    mode; the serve order may raise it (``roll_async.scheduler.serve_order``). Serving a batch or dropping a
    group frees quota. Generation therefore never runs more than ``lookahead`` batches ahead of the trainer.

    Serving. Which pending groups a batch takes is the serve order's (``serve_order``: ``fifo`` or
    ``first_complete``, see ``roll_async.scheduler.serve_order``).

    Wake-ups. Env loops waiting for a seat queue per tag; an event that can open seats wakes ONE waiter, and
    a waiter that takes a seat wakes the next only if another seat is available (a relay), so each event
    costs O(1) wake-ups however many envs wait. The trainer side is woken only by events that can make a
    batch ready (a group completes or is dropped, failure, shutdown). ``wakeups`` counts them.

    Steps and staleness. Each group records ``created_step``. ``get_batch(step)`` first moves the
    policy step to ``step`` and drops (``dropped_stale_groups``) every pending group whose weights lag the
    trainer's by more than ``staleness_bound`` versions (0 in sync mode, ``max_staleness`` in async mode):
    ``step - served_version(created_step)``, which is ``step - created_step`` when weights are pushed every
    step and counts the versions the engines actually served with ``weight_sync.interval > 1``. In async mode the
    policy step stays at ``step`` after the batch is returned, so a group made during training is served at
    ``step + 1`` with staleness 1.

    Sync mode. When ``get_batch`` returns, the scheduler suspends at once (until ``resume()`` or the next
    ``get_batch``) and cancels every episode still in flight: they were generated for a step that is now
    over. Pending groups left over are dropped as stale; the policy step becomes ``step + 1``.

    Async mode. ``get_batch`` does not suspend. An aborted engine request (a weight update) is not a
    cancellation: the EnvManager continues that turn. ``suspend(cancel_in_flight=...)`` works in both modes.

    Watchdog, worker restarts, fatal errors. ``report_stalled`` envs are a gauge in every batch until the env
    next talks to the scheduler. ``on_worker_restart`` counts ``worker_restarts`` and re-opens the dead
    worker's in-flight seats (``episodes_lost_to_restart``; no env-error budget is spent). ``report_fatal`` makes ``get_batch`` raise
    ``RolloutFatalError`` with the root cause and ``next_episode`` return None.
    """

    def __init__(
        self,
        rules: QueueRules,
        env_tags: Mapping[int, str],
        *,
        start_step: int = 0,
        on_cancel: CancelCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        unknown = sorted({t for t in env_tags.values() if t not in rules.tags})
        if unknown:
            raise ValueError(
                f"envs have tags {unknown} that are not in tags={list(rules.tags)}"
            )
        self.rules = rules
        self.tags = list(rules.tags)
        self._env_tags = dict(env_tags)
        self._order: ServeOrder[_Group] = make_serve_order(rules.serve_order, self.tags)
        self._filter = resolve_group_filter(rules.group_filter)
        self._on_cancel = on_cancel
        self._clock = clock
        self._quota = self._make_quota()
        self._policy_step = start_step
        self._pending = _PendingGroups(self.tags)
        self.wakeups = WakeupCounters()
        self._seat_waiters = SeatWaiters(self.tags, self.wakeups)
        #: The trainer side (get_batch, run_fixed_round) waits here; only batch-relevant events notify it.
        self._changed = TrainerWakeup()
        self._window = _BusyWindow(clock)
        self._batches_served = 0
        self._suspended = False
        self._closed = False
        self._fatal: RolloutFatalError | None = None
        self._consecutive_env_errors = 0
        self._last_env_error = ""
        self._filter_drops_this_batch = 0
        self._stalled: dict[int, str] = {}
        self.counters = SchedulerCounters()
        self._counters_at_last_batch = SchedulerCounters()
        #: Episodes not served (see ServedBatch.unserved); bounded so an undrained scheduler cannot grow without end.
        self._unserved: deque[tuple[str, Trajectory]] = deque(maxlen=_MAX_UNSERVED_KEPT)

    @classmethod
    def from_spec(
        cls,
        spec: RolloutSpec,
        *,
        on_cancel: CancelCallback | None = None,
        start_step: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> GroupQueueManager:
        """The queue of one rollout side, over the env instances its section lays out."""
        layout = rollout_layout(spec)
        queue = cls(
            QueueRules.for_spec(spec),
            dict(layout),
            start_step=start_step,
            on_cancel=on_cancel,
            clock=clock,
        )
        busy_at_most = (
            sum(queue._max_pending(tag) for tag in queue.tags) * queue.num_seats
        )
        if queue.rules.auto_create and len(layout) > busy_at_most:
            logger.warning(
                "%d env instances, but at most %d can be busy (%d groups per batch x lookahead %d x %d seats); "
                "the rest stay idle: lower num_env_groups, raise rollout_batch_size or use "
                "%s.serve_order=first_complete",
                len(layout),
                busy_at_most,
                queue.groups_per_batch,
                queue.lookahead,
                queue.num_seats,
                spec.section,
            )
        return queue

    # -- configuration -----------------------------------------------------------------

    def _make_quota(self) -> _BatchQuota:
        groups_per_batch = self.rules.groups_per_batch
        shares = self.rules.shares
        starved = [
            t for t, s in shares.items() if s == 0 and t in self._env_tags.values()
        ]
        if starved and self.rules.auto_create:
            logger.warning(
                "tags %s get 0 of the %d groups per batch; their envs stay idle (raise the batch size or "
                "change num_groups_partition)",
                starved,
                groups_per_batch,
            )
        return _BatchQuota(groups_per_batch, shares, self.rules.filter_drops_limit)

    @property
    def groups_per_batch(self) -> int:
        return self._quota.groups_per_batch

    @property
    def shares(self) -> dict[str, int]:
        """Groups per tag in a batch."""
        return self._quota.shares

    @property
    def num_seats(self) -> int:
        return self.rules.num_seats

    @property
    def lookahead(self) -> int:
        return self.rules.lookahead

    @property
    def staleness_bound(self) -> int:
        """Steps a pending group may lag the policy step (the spec's, via the rules; 0 in sync mode)."""
        return self.rules.staleness_bound

    @property
    def policy_step(self) -> int:
        return self._policy_step

    @property
    def suspended(self) -> bool:
        return self._suspended

    @property
    def failure(self) -> RolloutFatalError | None:
        """The root cause the rollout failed with (report_fatal), if it did."""
        return self._fatal

    # -- env side ----------------------------------------------------------------------

    async def next_episode(self, env_id: int) -> EpisodeSpec | None:
        """The next episode for ``env_id``; waits while suspended or out of quota; None means stop."""
        try:
            tag = self._env_tags[env_id]
        except KeyError:
            raise KeyError(f"env_id {env_id} is not known to this scheduler") from None
        self._stalled.pop(env_id, None)
        woken = False
        try:
            while True:
                if self._closed or self._fatal is not None:
                    return None
                if not self._suspended:
                    group = self._pending.oldest_with_free_seat(tag)
                    if group is None and self._may_create(tag):
                        group = self._create_group(tag)
                    if group is not None:
                        spec = self._assign_seat(group, env_id)
                        if self._seat_waiters.any(tag) and self._has_free_seat(tag):
                            # relay: the next waiter takes the next seat
                            self._seat_waiters.wake_one(tag)
                        return spec
                self._window.env_waits(env_id)
                # Woken but the seat was taken: keep its place in the queue.
                await self._seat_waiters.wait(tag, keep_place=woken)
                woken = True
        finally:
            self._window.env_stops_waiting(env_id)

    def _has_free_seat(self, tag: str) -> bool:
        return self._pending.oldest_with_free_seat(tag) is not None or self._may_create(
            tag
        )

    def _seat_event(self, tag: str | None = None) -> None:
        """Seats may have opened for ``tag`` (every tag if None): wake one waiter each; the relay does the rest."""
        self.wakeups.seat_events += 1
        if self._suspended:
            return
        for t in self.tags if tag is None else (tag,):
            if self._seat_waiters.any(t) and self._has_free_seat(t):
                self._seat_waiters.wake_one(t)

    def _may_create(self, tag: str) -> bool:
        return self.rules.auto_create and len(
            self._pending.by_tag[tag]
        ) < self._max_pending(tag)

    def _max_pending(self, tag: str) -> int:
        return self._order.max_pending(
            self.shares.get(tag, 0) * self.lookahead,
            self.rules.env_groups_per_tag.get(tag, 0),
        )

    def _create_group(
        self,
        tag: str,
        *,
        seed: int | None = None,
        env_config_override: dict[str, Any] | None = None,
        num_seats: int | None = None,
    ) -> _Group:
        index = self._pending.created_per_tag[tag]
        seats = num_seats or self.num_seats
        group = _Group(
            group_id=self._pending.next_group_id,
            tag=tag,
            tag_index=index,
            seed=derive_seed(self.rules.seed, tag, index) if seed is None else seed,
            created_step=self._policy_step,
            created_batch=self._batches_served,
            num_seats=seats,
            needed=min(self.rules.group_size, seats),
            env_config_override=env_config_override,
        )
        self._pending.add(group)
        self.counters.created_groups += 1
        return group

    def _assign_seat(self, group: _Group, env_id: int) -> EpisodeSpec:
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

    async def put_trajectory(self, trajectory: Trajectory) -> None:
        """An env finished (or failed) an episode."""
        self._stalled.pop(trajectory.env_id, None)
        group = self._pending.by_id.get(trajectory.group_id)
        if group is None or trajectory.episode_id not in group.in_flight:
            self.counters.late_trajectories += 1
            self._unserved.append(("late", trajectory))
            return
        del group.in_flight[trajectory.episode_id]
        if trajectory.stop_reason == "env_error":
            self._on_env_error(group, trajectory)
            self._pending.list_open(group)
        elif trajectory.stop_reason == "aborted":
            self._pending.list_open(group)  # the env gave the seat back; it re-opens
        else:
            self._consecutive_env_errors = 0
            group.trajectories.append(trajectory)
        # A finished seat, or (seat_order) a failed one that lets a redundant seat in, may make the group whole.
        if not group.complete and self._pending.is_pending(group):
            self._complete_if_whole(group)
        # Only a seat given back (error, abort) can unblock a waiting env; drops and failures notify on their own.
        if trajectory.stop_reason in ("env_error", "aborted"):
            self._seat_event(group.tag)

    def _on_env_error(self, group: _Group, trajectory: Trajectory) -> None:
        self.counters.env_errors += 1
        self._unserved.append(("env_error", trajectory))
        group.env_errors += 1
        self._consecutive_env_errors += 1
        self._last_env_error = f"env {trajectory.env_id} (tag {trajectory.tag}, group {group.group_id}, seed {group.seed}): {trajectory.error}"
        logger.warning(
            "env error, the group's seat is re-opened: %s", self._last_env_error
        )
        if self._consecutive_env_errors >= self.rules.max_consecutive_env_errors:
            self.report_fatal(
                f"{self._consecutive_env_errors} env errors in a row without one successful episode; "
                f"the env setup looks broken. Last error: {self._last_env_error}"
            )
            return
        if group.env_errors > self.rules.errors_per_group_limit:
            if self.rules.auto_create:
                self.counters.dropped_error_groups += 1
                self._drop(group, fate="dropped_errors")
            else:  # a fixed round must terminate: the error is this episode's result
                group.trajectories.append(trajectory)
                if len(group.trajectories) >= group.needed:
                    self._complete(group, apply_filter=False)

    def _complete_if_whole(self, group: _Group) -> None:
        """Complete ``group`` if the trajectories it keeps have all arrived (see "Completion and redundancy")."""
        if (
            self.rules.redundancy_keep == "first_finished"
            or group.num_seats <= group.needed
        ):
            if len(group.trajectories) >= group.needed:
                self._complete(group)
            return
        finished = {t.episode_id: t for t in group.trajectories}
        standing = sorted(finished.keys() | group.in_flight.keys())[: group.needed]
        if len(standing) < group.needed or not all(e in finished for e in standing):
            return
        kept = set(standing)
        self._unserved.extend(
            ("redundant", t) for t in group.trajectories if t.episode_id not in kept
        )
        group.trajectories = [finished[e] for e in standing]
        self._complete(group)

    def _complete(self, group: _Group, apply_filter: bool = True) -> None:
        group.complete = True
        self.counters.completed_groups += 1
        self._cancel_seats(group)
        if (
            apply_filter
            and self.rules.group_filter != "none"
            and self.rules.auto_create
            and not self._filter(group.trajectories[: group.needed])
        ):
            if self._filter_drops_this_batch < self._quota.max_filter_drops:
                self._filter_drops_this_batch += 1
                self.counters.filtered_groups += 1
                self._drop(group, fate="filtered")
                return
            self.counters.filter_bypassed_groups += 1
        self._order.group_completed(group)
        self._notify_trainer()

    def _cancel_seats(self, group: _Group) -> None:
        for episode_id, env_id in list(group.in_flight.items()):
            self.counters.cancelled_episodes += 1
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

    def _notify_trainer(self) -> None:
        """Wake a waiting get_batch / run_fixed_round (at most one waits)."""
        self.wakeups.batch += self._changed.notify()

    def _remove_pending(self, group: _Group) -> None:
        self._order.group_removed(group, self._pending.remove(group))

    def _drop(self, group: _Group, fate: str = "dropped") -> None:
        self._unserved.extend((fate, t) for t in group.trajectories)
        self._cancel_seats(group)
        self._remove_pending(group)
        self._notify_trainer()
        # its quota slot is free: a new group may be created
        self._seat_event(group.tag)

    # -- trainer side ------------------------------------------------------------------

    async def get_batch(self, step: int) -> ServedBatch:
        """Wait until a batch of ``groups_per_batch`` whole groups (oldest first, per tag share) is ready.

        Its size is the rules' quota (the spec's groups_per_batch x group_size trajectories), fixed when
        the queue was made: the caller gives only the step.
        """
        if not self.rules.auto_create:
            raise RuntimeError(
                "this scheduler plays fixed rounds; call run_fixed_round() instead of get_batch()"
            )
        started = self._clock()
        self._enter_step(step)
        while True:
            self._raise_if_unusable()
            heads = self._ready_heads()
            if heads is not None:
                break
            await self._changed.wait()
        return self._serve(heads, step, started)

    def _enter_step(self, step: int) -> None:
        self._policy_step = max(self._policy_step, step)
        staleness_bound = self.staleness_bound
        for tag in self.tags:
            # ordered by created_step: the stale groups are a prefix
            pending = self._pending.by_tag[tag]
            while (
                pending
                and self.rules.version_lag(step, pending[0].created_step)
                > staleness_bound
            ):
                self.counters.dropped_stale_groups += 1
                self._drop(pending[0], fate="dropped_stale")
        if self._suspended:
            self.resume()

    def _ready_heads(self) -> list[_Group] | None:
        """The groups to serve if a batch is ready (see the serve order), else None."""
        shares = self.shares
        for tag in self.tags:
            if not self._order.is_ready(
                tag, self._pending.by_tag[tag], shares.get(tag, 0)
            ):
                return None
        heads: list[_Group] = []
        for tag in self.tags:
            heads.extend(
                self._order.heads(tag, self._pending.by_tag[tag], shares.get(tag, 0))
            )
        return heads

    def _serve(self, groups: list[_Group], step: int, started: float) -> ServedBatch:
        groups = sorted(groups, key=lambda g: g.group_id)
        trajectories: list[Trajectory] = []
        carried_over = 0
        for group in groups:
            self._remove_pending(group)
            trajectories.extend(group.trajectories[: group.needed])
            carried_over += group.created_batch < self._batches_served
        self._batches_served += 1
        now = self._clock()
        window, busy_fraction = self._window.close(now, len(self._env_tags))
        if self.rules.mode == "sync" and self.rules.auto_create:
            self._policy_step = step + 1
            self.suspend(cancel_in_flight=True)
            for group in list(self._pending):
                self.counters.dropped_stale_groups += 1
                self._drop(group, fate="dropped_stale")
        # Events caused by serving (cancelled redundant seats, leftovers) belong to this batch.
        counters = self.counters.minus(self._counters_at_last_batch)
        self._counters_at_last_batch = SchedulerCounters(**asdict(self.counters))
        self._filter_drops_this_batch = 0
        self._seat_event()  # served groups free their quota slots
        gauges = self.gauges()
        gauges["env_busy_fraction"] = busy_fraction
        gauges["groups_started_earlier_fraction"] = (
            carried_over / len(groups) if groups else 0.0
        )
        return ServedBatch(
            trajectories=trajectories,
            step=step,
            wait_s=now - started,
            window_s=window,
            counters=counters,
            gauges=gauges,
            unserved=self._take_unserved(),
        )

    def _take_unserved(self) -> list[tuple[str, Trajectory]]:
        unserved = list(self._unserved)
        self._unserved.clear()
        return unserved

    async def run_fixed_round(
        self, episodes: Sequence[EpisodeSpec], step: int
    ) -> ServedBatch:
        """Play each given episode once (one seat each), wait for all, return them in the given order.

        For validation: seeds and env configs come from ``episodes``; envs are
        suspended again afterwards. ``EpisodeSpec.group_id``/``episode_id`` are
        ignored (the scheduler numbers groups itself).
        """
        if self.rules.auto_create:
            raise RuntimeError(
                "run_fixed_round needs a scheduler built with auto_create=False"
            )
        started = self._clock()
        self._policy_step = max(self._policy_step, step)
        groups = []
        for spec in episodes:
            if spec.tag not in self._pending.by_tag:
                raise ValueError(
                    f"episode tag {spec.tag!r} is not one of this scheduler's tags {self.tags}"
                )
            groups.append(
                self._create_group(
                    spec.tag,
                    seed=spec.seed,
                    env_config_override=spec.env_config_override,
                    num_seats=1,
                )
            )
        self.resume()
        try:
            while not all(g.complete for g in groups):
                self._raise_if_unusable()
                await self._changed.wait()
        finally:
            self.suspend(cancel_in_flight=True)
        served = self._serve(groups, step, started)
        order = {g.group_id: i for i, g in enumerate(groups)}
        served.trajectories.sort(key=lambda t: order[t.group_id])
        return served

    def _raise_if_unusable(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise RuntimeError("the rollout scheduler was shut down")

    # -- control -----------------------------------------------------------------------

    def suspend(self, cancel_in_flight: bool = True) -> None:
        """No new episodes until resume(); optionally cancel every episode in flight."""
        self._suspended = True
        if cancel_in_flight:
            for group in self._pending:
                self._cancel_seats(group)

    def resume(self) -> None:
        if self._suspended:
            self._suspended = False
            self._window.restart()
        self._seat_event()

    def report_fatal(self, message: str) -> None:
        """Fail the rollout: get_batch raises ``message``; env loops get no more episodes."""
        if self._fatal is None:
            self._fatal = RolloutFatalError(message)
            logger.error("rollout failed: %s", message)
        self._notify_trainer()
        self._seat_waiters.wake_all()

    async def on_worker_restart(self, env_ids: Sequence[int], reason: str) -> int:
        """A worker hosting ``env_ids`` died and is being replaced: one restart; its in-flight episodes are lost.

        Each episode those envs were playing is recorded as ``lost_to_restart`` (counted in
        ``episodes_lost_to_restart``) and its seat re-opens for the replacement's envs. A worker's death is
        not an env error: it spends neither the consecutive env-error budget nor the group's error budget,
        so one dead worker hosting many busy envs is one restart, not a broken env setup. Returns how many
        episodes were lost.
        """
        self.counters.worker_restarts += 1
        dead = set(env_ids)
        lost = 0
        for group in list(self._pending.by_id.values()):
            for episode_id, env_id in list(group.in_flight.items()):
                if env_id not in dead:
                    continue
                lost += 1
                del group.in_flight[episode_id]
                self._unserved.append(
                    (
                        "lost_to_restart",
                        Trajectory(
                            tag=group.tag,
                            group_id=group.group_id,
                            episode_id=episode_id,
                            env_id=env_id,
                            seed=group.seed,
                            traj_id=f"{group.tag}-g{group.group_id}-e{episode_id}",
                            created_step=group.created_step,
                            stop_reason="aborted",
                            error=f"its EnvManagerWorker died: {reason}",
                        ),
                    )
                )
                self._pending.list_open(group)
        self.counters.episodes_lost_to_restart += lost
        for env_id in dead:
            self._stalled.pop(env_id, None)
        if lost:
            self._seat_event()
        return lost

    def report_stalled(self, env_id: int, description: str) -> None:
        """A worker's watchdog saw ``env_id`` in one phase too long; a gauge until the env talks to the queue.

        An env this queue holds waiting for a seat (quota, sync suspension) waits by design and is not
        recorded; a wait for an episode whose request the queue does not hold (lost in transport) is.
        """
        if self._window.is_waiting(env_id):
            logger.debug(
                "watchdog: env %s waits for a seat here: %s", env_id, description
            )
            return
        self._stalled[env_id] = description
        logger.warning("watchdog: env %s makes no progress: %s", env_id, description)

    def clear_stalled(self, env_id: int) -> None:
        self._stalled.pop(env_id, None)

    def stalled_envs(self) -> dict[int, str]:
        return dict(self._stalled)

    def seed_state(self) -> dict[str, Any]:
        """The position in the seed sequence; a resumed run loads it so it continues, not repeats, the seeds.

        Groups pending at save time are not saved: the resumed run creates fresh groups
        after them, so their seeds are skipped rather than trained on twice.
        """
        return {
            "next_group_id": self._pending.next_group_id,
            "tag_group_count": dict(self._pending.created_per_tag),
        }

    def load_seed_state(self, state: Mapping[str, Any]) -> None:
        if self._pending.by_id:
            raise RuntimeError(
                "load_seed_state must run before the first group is created"
            )
        self._pending.next_group_id = int(state["next_group_id"])
        created = self._pending.created_per_tag
        for tag, count in dict(state["tag_group_count"]).items():
            if tag in created:
                created[tag] = int(count)

    def shutdown(self) -> None:
        self._closed = True
        self._notify_trainer()
        self._seat_waiters.wake_all()

    def gauges(self) -> dict[str, float]:
        pending = list(self._pending)
        return {
            "stalled_envs": float(len(self._stalled)),
            "pending_groups": float(len(pending)),
            "in_flight_episodes": float(sum(len(g.in_flight) for g in pending)),
        }

    def describe(self) -> dict[str, Any]:
        """State for debugging and tests."""
        return {
            "policy_step": self._policy_step,
            "suspended": self._suspended,
            "closed": self._closed,
            "fatal": str(self._fatal) if self._fatal else None,
            "shares": dict(self.shares),
            "pending": {
                tag: [
                    {
                        "group_id": g.group_id,
                        "seed": g.seed,
                        "created_step": g.created_step,
                        "done": len(g.trajectories),
                        "in_flight": dict(g.in_flight),
                        "complete": g.complete,
                    }
                    for g in groups
                ]
                for tag, groups in self._pending.by_tag.items()
            },
            "counters": asdict(self.counters),
            "stalled": dict(self._stalled),
        }
