"""GroupQueueManager: which episode each env plays next, and when a batch of whole groups is ready.

A plain asyncio class (no Ray), so its rules are unit-tested directly; the
RolloutScheduler hosts it in a Ray actor. The rules:

Groups and seats. A *group* is one episode specification (tag, env config,
seed) played by ``group_size`` env instances; it has ``group_size +
group_size_redundancy`` *seats*. Env instances form one pool per tag (the pool
size is ``num_groups_partition[tag] * (group_size + redundancy)``). An env that
asks for work (``next_episode``) takes a free seat in the OLDEST open group of
its tag; only if none has a free seat is a new group created (quota
permitting). So envs never wait for each other: a fast env moves on to the next
group while a slow sibling is still mid-episode, and the oldest groups get envs
first. ``group_id`` is unique per group for the whole run; ``episode_id``
numbers the seats handed out within a group (0, 1, ..., including re-issued
seats after errors).

Seeds. Group number ``i`` of tag ``t`` plays seed ``derive_seed(run_seed, t, i)``
(a stable hash), so the seed sequence of a run is reproducible from its seed
regardless of timing. All trajectories of a group share tag, env config and seed.

Completion and redundancy. A group is complete when ``group_size`` successful
trajectories have arrived (in arrival order). Its seats still in flight are
cancelled through ``on_cancel`` (the EnvManager aborts its engine request and
discards the partial episode) and any trajectory that still arrives for it is
discarded (``late_trajectories``).

Group filter. On completion the configured filter (``filters.GROUP_FILTERS``)
decides; a dropped group is counted (``filtered_groups``) and frees its quota
slot, so a replacement group is created: ``get_batch`` always returns kept,
whole groups. Safety valve: after ``max_filter_drops_per_batch`` drops while
waiting for one batch, groups are kept unfiltered (``filter_bypassed_groups``)
so a filter that rejects everything (e.g. zero_variance when every reward is 0)
cannot stall training forever.

Env errors. A trajectory with stop reason ``env_error`` (exception or timeout
in reset/step) is counted (``env_errors``), its seat re-opens, and another env
(or the same, rebuilt one) plays it again: the group is refilled. A group that
collects more than ``max_errors_per_group`` errors is dropped and replaced
(``dropped_error_groups``; in fixed/validation rounds the error trajectory is
reported as the result instead). ``max_consecutive_env_errors`` errors in a row
with no successful trajectory in between is a broken env setup: the scheduler
fails and ``get_batch`` raises with the last error.

Quota. Per batch, each tag contributes ``shares[tag]`` groups
(``groups_per_batch = batch_size / group_size`` split by
``num_groups_partition``, largest remainder). A tag may have at most
``shares[tag] * lookahead`` groups pending (created, not yet served), where
``lookahead = 1`` in sync mode and ``max_staleness`` in async mode. Serving a
batch frees quota, dropping a group (filter, errors, staleness) frees quota and
so refills it. Generation therefore never runs more than ``lookahead`` batches
ahead of the trainer.

Serving (``serve_order``). ``fifo`` (default): ``get_batch(batch_size, step)``
waits until, for every tag, the ``shares[tag]`` OLDEST pending groups are
complete, then returns exactly those (strict FIFO per tag). A slow group is
never skipped in favour of younger complete ones, so it cannot starve, and the
batch is not biased towards short episodes. With the quota above this also
bounds staleness: a group is served at most ``lookahead`` batches after it was
created. Its cost: envs whose tag is at quota idle until the slow head group
completes (``rollout/env_busy_fraction`` shows it).

``first_complete`` (ROLL's behaviour): ``get_batch`` returns the first
``shares[tag]`` groups to COMPLETE (completion order), whatever their age; the
groups still running stay pending and continue as partial rollouts into later
steps while within the staleness bound (then they are dropped as stale and
counted). The quota per tag is raised to the tag's env groups when that is
larger (``max(shares * lookahead, env groups of the tag)``), so over-provisioned
groups (more env groups than a batch needs) keep every env busy instead of
idling. Its cost: a bias towards short (fast) episodes, and work lost on groups
that go stale. ``rollout/groups_started_earlier_fraction`` is the share of
served groups that were already pending when the previous batch was served.

Wake-ups. Env loops waiting for a seat queue per tag; an event that can open
seats (a seat given back, a group dropped or served, resume, a larger quota)
wakes ONE waiter, and a waiter that takes a seat wakes the next only if another
seat is available (a relay), so each event costs O(1) wake-ups however many envs
wait. The trainer side (get_batch, run_fixed_round) is woken only by events that
can make a batch ready (a group completes or is dropped, failure, shutdown), and
readiness is checked in amortized O(1) (a cursor over the complete head groups
for fifo, a count of complete groups for first_complete). ``wakeups`` counts
them.

Steps and staleness. Each group records ``created_step``: the scheduler's
policy step when it was created. ``get_batch(batch_size, step)`` first moves the
policy step to ``step`` and drops (and counts, ``dropped_stale_groups``) every
pending group with ``step - created_step > staleness_bound``. In sync mode the
bound is 0; in async mode it is ``max_staleness``. In async mode the policy step
stays at ``step`` after the batch is returned, because the env loops go on
generating with the weights of ``step`` while the trainer trains on it; so a
group made during training is served at ``step + 1`` with staleness 1.

Sync mode. When ``get_batch`` returns, the scheduler suspends at once: no env
gets a new episode until ``resume()`` (or the next ``get_batch``, which resumes
by itself), and every episode still in flight is cancelled. Those are only the
redundant seats of already complete groups or groups the batch did not need;
they were generated for a step that is now over, so keeping them would make the
next batch off-policy. Pending groups left over are dropped as stale. After the
return the policy step is ``step + 1``: groups created after the resume are for
the next step.

Async mode. ``get_batch`` does not suspend; env loops keep going. An aborted
engine request (the engine pauses with mode abort for a weight update) is not a
cancellation: the EnvManager continues that turn from its partial output.
``suspend(cancel_in_flight=...)`` is available in both modes.

Watchdog. Workers report envs that make no progress (``report_stalled``); the
count is a gauge in every batch's metrics and the report is cleared when the
env next talks to the scheduler or the worker sees it progress.

Worker restarts. When an EnvManagerWorker dies (its process killed or crashed),
the RolloutScheduler starts a replacement and calls ``on_worker_restart``: the
episodes its envs had in flight end ``env_error`` (counted, seats re-opened and
refilled) and ``worker_restarts`` is counted.

Fatal errors. ``report_fatal`` (a worker's env loop died, e.g. an engine
request failed after its retries) makes ``get_batch`` raise
``RolloutFatalError`` with the root cause and makes ``next_episode`` return None
so the remaining loops wind down.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from roll_async.errors import RolloutFatalError
from roll_async.metrics import rollout_metrics
from roll_async.scheduler.filters import GroupFilter, resolve_group_filter
from roll_async.trajectory import EpisodeSpec, Trajectory

logger = logging.getLogger(__name__)

CancelCallback = Callable[[int, int, int], Any]

#: Most unserved episodes kept between two batches (validation rounds never drain them).
_MAX_UNSERVED_KEPT = 10_000


def derive_seed(run_seed: int, namespace: str, index: int) -> int:
    """A stable 31-bit seed for item ``index`` of ``namespace`` (a tag) in a run seeded with ``run_seed``."""
    digest = hashlib.blake2b(
        f"{run_seed}/{namespace}/{index}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def split_by_weights(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into integer parts proportional to ``weights`` (largest remainder; ties: first wins)."""
    if not weights:
        return []
    weight_sum = sum(weights)
    if weight_sum <= 0:
        raise ValueError(f"weights {list(weights)} must sum to a positive number")
    exact = [total * w / weight_sum for w in weights]
    parts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def groups_per_tag(
    tags: Sequence[str], num_env_groups: int, num_groups_partition: Sequence[int]
) -> list[int]:
    """Env groups per tag: the partition, or ``num_env_groups`` split evenly when it is empty."""
    if num_groups_partition:
        return list(num_groups_partition)
    return split_by_weights(num_env_groups, [1] * len(tags))


def env_layout(
    tags: Sequence[str],
    num_env_groups: int,
    num_groups_partition: Sequence[int],
    group_size: int,
    group_size_redundancy: int,
) -> list[tuple[int, str]]:
    """(env_id, tag) for every env instance: ``groups[tag] * (group_size + redundancy)`` per tag, ids contiguous."""
    layout: list[tuple[int, str]] = []
    per_group = group_size + group_size_redundancy
    for tag, count in zip(
        tags, groups_per_tag(tags, num_env_groups, num_groups_partition)
    ):
        for _ in range(count * per_group):
            layout.append((len(layout), tag))
    return layout


@dataclass
class SchedulerCounters:
    """Cumulative event counts; batches report the difference since the previous batch."""

    dropped_stale_groups: int = 0
    filtered_groups: int = 0
    filter_bypassed_groups: int = 0
    env_errors: int = 0
    dropped_error_groups: int = 0
    cancelled_episodes: int = 0
    late_trajectories: int = 0
    completed_groups: int = 0
    created_groups: int = 0
    worker_restarts: int = 0

    def minus(self, earlier: SchedulerCounters) -> dict[str, int]:
        now, before = asdict(self), asdict(earlier)
        return {key: now[key] - before[key] for key in now}


@dataclass
class ServedBatch:
    """What get_batch returns: the trajectories (whole groups, oldest first) and the bookkeeping for metrics."""

    trajectories: list[Trajectory]
    step: int
    #: Seconds get_batch waited.
    wait_s: float
    #: Seconds of rollout this batch stands for: since the previous batch (or resume), whichever is later.
    window_s: float
    #: Events since the previous batch (SchedulerCounters fields).
    counters: dict[str, int] = field(default_factory=dict)
    #: Current state: stalled_envs, pending_groups, in_flight_episodes.
    gauges: dict[str, float] = field(default_factory=dict)
    #: Episodes since the previous batch that were not served, as (fate, trajectory): env_error, late,
    #: dropped_stale, filtered, dropped_errors. The run directory records them (unserved_trajectories.jsonl).
    unserved: list[tuple[str, Trajectory]] = field(default_factory=list)

    def rollout_metrics(
        self, engine_stats: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, float]:
        """The DESIGN rollout metrics of this batch (see roll_async.metrics.rollout_metrics)."""
        return rollout_metrics(
            self.trajectories,
            step=self.step,
            wait_s=self.wait_s,
            window_s=self.window_s,
            counters=self.counters,
            gauges=self.gauges,
            engine_stats=list(engine_stats),
        )


@dataclass
class WakeupCounters:
    """How many waiters the scheduler woke, and on how many events (tests check O(1) per event)."""

    #: Env loops woken while waiting for a seat.
    seat: int = 0
    #: get_batch / run_fixed_round waiters woken.
    batch: int = 0
    #: Seat-opening events (seat given back, group dropped or served, resume, quota change).
    seat_events: int = 0


SERVE_ORDERS = ("fifo", "first_complete")


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
    #: In the tag's list of groups that may have a free seat (GroupQueueManager._open).
    listed_open: bool = False

    def free_seats(self) -> int:
        if self.complete:
            return 0
        return self.num_seats - len(self.trajectories) - len(self.in_flight)


class _Broadcast:
    """Wake every waiter on a state change (check state, then wait; no lost wake-ups in one event loop).

    Only the trainer side waits here (one get_batch or run_fixed_round at a time), so a notify wakes at most one.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.waiters = 0

    def notify(self) -> int:
        woken = self.waiters
        self._event.set()
        self._event = asyncio.Event()
        self.waiters = 0
        return woken

    async def wait(self) -> None:
        self.waiters += 1
        await self._event.wait()


class GroupQueueManager:
    """Hands out episodes (seats of groups) and serves whole groups as batches. See the module docstring."""

    def __init__(
        self,
        *,
        env_tags: Mapping[int, str],
        tags: Sequence[str],
        group_size: int,
        groups_per_batch: int,
        num_groups_partition: Sequence[int] = (),
        group_size_redundancy: int = 0,
        mode: str = "sync",
        staleness_bound: int = 0,
        seed: int = 0,
        group_filter: str | GroupFilter = "none",
        start_step: int = 0,
        auto_create: bool = True,
        max_errors_per_group: int | None = None,
        max_consecutive_env_errors: int = 100,
        max_filter_drops_per_batch: int | None = None,
        on_cancel: CancelCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
        serve_order: str = "fifo",
        env_groups_per_tag: Mapping[str, int] | None = None,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode={mode!r}: use 'sync' or 'async'")
        if serve_order not in SERVE_ORDERS:
            raise ValueError(
                f"serve_order={serve_order!r}: use one of {', '.join(SERVE_ORDERS)}"
            )
        if group_size < 1 or group_size_redundancy < 0:
            raise ValueError(
                f"group_size={group_size} must be >= 1 and group_size_redundancy={group_size_redundancy} >= 0"
            )
        unknown = sorted({t for t in env_tags.values() if t not in tags})
        if unknown:
            raise ValueError(
                f"envs have tags {unknown} that are not in tags={list(tags)}"
            )
        self.tags = list(tags)
        self.mode = mode
        self.group_size = group_size
        self.num_seats = group_size + group_size_redundancy
        self.staleness_bound = 0 if mode == "sync" else max(0, staleness_bound)
        self.lookahead = max(1, self.staleness_bound)
        self.seed = seed
        self.auto_create = auto_create
        self.serve_order = serve_order
        self._env_tags = dict(env_tags)
        #: first_complete: a tag may keep as many groups pending as it has env groups (over-provisioning is used).
        self._env_groups_per_tag = dict(env_groups_per_tag or {})
        self._partition = list(num_groups_partition) or [1] * len(self.tags)
        if len(self._partition) != len(self.tags):
            raise ValueError(
                f"num_groups_partition={list(num_groups_partition)} needs one entry per tag {self.tags}"
            )
        self._filter = resolve_group_filter(group_filter)
        self._filter_is_none = group_filter == "none"
        if group_filter == "zero_variance" and group_size < 2:
            raise ValueError(
                "group_filter='zero_variance' needs group_size >= 2 (a single reward has no variance)"
            )
        self.max_errors_per_group = (
            max_errors_per_group
            if max_errors_per_group is not None
            else 3 * self.num_seats
        )
        self.max_consecutive_env_errors = max_consecutive_env_errors
        self._max_filter_drops_override = max_filter_drops_per_batch
        self._on_cancel = on_cancel
        self._clock = clock

        self.groups_per_batch = 0
        self.shares: dict[str, int] = {}
        self._max_filter_drops = 0
        self._set_groups_per_batch(groups_per_batch)

        self._policy_step = start_step
        #: Per tag, pending groups (created, not served or dropped) ordered by group_id (so by created_step too).
        self._pending: dict[str, list[_Group]] = {tag: [] for tag in self.tags}
        #: fifo: per tag, how many groups at the head of _pending are known complete (a cursor; never rescans).
        self._lead: dict[str, int] = {tag: 0 for tag in self.tags}
        #: first_complete: per tag, complete (kept) pending groups in completion order.
        self._complete_pending: dict[str, dict[int, _Group]] = {
            tag: {} for tag in self.tags
        }
        #: Per tag, env loops waiting for a seat (woken one at a time; see "Wake-ups").
        self._seat_waiters: dict[str, deque[asyncio.Future]] = {
            tag: deque() for tag in self.tags
        }
        self.wakeups = WakeupCounters()
        #: env_id -> when it began waiting for a seat; idle seconds in the current window (env_busy_fraction).
        self._idle_since: dict[int, float] = {}
        self._idle_s_in_window = 0.0
        self._batches_served = 0
        #: Per tag, the pending groups that may have a free seat, oldest first; full ones are dropped lazily
        #: (so finding a seat does not rescan every pending group: 10,000 envs keep thousands pending).
        self._open: dict[str, deque[_Group]] = {tag: deque() for tag in self.tags}
        self._groups: dict[int, _Group] = {}
        self._next_group_id = 0
        self._tag_group_count = {tag: 0 for tag in self.tags}
        self._suspended = False
        self._closed = False
        self._fatal: RolloutFatalError | None = None
        self._consecutive_env_errors = 0
        self._last_env_error = ""
        self._filter_drops_this_batch = 0
        self._stalled: dict[int, str] = {}
        #: The trainer side (get_batch, run_fixed_round) waits here; only batch-relevant events notify it.
        self._changed = _Broadcast()
        self.counters = SchedulerCounters()
        self._counters_at_last_batch = SchedulerCounters()
        self._window_start = clock()
        #: Episodes not served (see ServedBatch.unserved); bounded so an undrained scheduler cannot grow without end.
        self._unserved: deque[tuple[str, Trajectory]] = deque(maxlen=_MAX_UNSERVED_KEPT)

    # -- configuration -----------------------------------------------------------------

    def _set_groups_per_batch(self, groups_per_batch: int) -> None:
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch={groups_per_batch} must be >= 1")
        self.groups_per_batch = groups_per_batch
        self.shares = dict(
            zip(self.tags, split_by_weights(groups_per_batch, self._partition))
        )
        starved = [
            t for t, s in self.shares.items() if s == 0 and t in self._env_tags.values()
        ]
        if starved and self.auto_create:
            logger.warning(
                "tags %s get 0 of the %d groups per batch; their envs stay idle (raise the batch size or "
                "change num_groups_partition)",
                starved,
                groups_per_batch,
            )
        self._max_filter_drops = (
            self._max_filter_drops_override
            if self._max_filter_drops_override is not None
            else 10 * groups_per_batch
        )

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
        waiters = self._seat_waiters[tag]
        woken = False
        try:
            while True:
                if self._closed or self._fatal is not None:
                    return None
                if not self._suspended:
                    group = self._oldest_group_with_free_seat(tag)
                    if group is None and self._may_create(tag):
                        group = self._create_group(tag)
                    if group is not None:
                        spec = self._assign_seat(group, env_id)
                        if waiters and self._has_free_seat(tag):
                            self._wake_one(
                                tag
                            )  # relay: the next waiter takes the next seat
                        return spec
                if env_id not in self._idle_since:
                    self._idle_since[env_id] = self._clock()
                future = asyncio.get_running_loop().create_future()
                if woken:
                    waiters.appendleft(
                        future
                    )  # woken but the seat was taken: keep its place in the queue
                else:
                    waiters.append(future)
                await future
                woken = True
        finally:
            since = self._idle_since.pop(env_id, None)
            if since is not None:
                self._idle_s_in_window += max(
                    0.0, self._clock() - max(since, self._window_start)
                )

    def _has_free_seat(self, tag: str) -> bool:
        return self._oldest_group_with_free_seat(tag) is not None or self._may_create(
            tag
        )

    def _wake_one(self, tag: str) -> None:
        """Wake the longest-waiting env loop of ``tag`` (skipping any whose wait was cancelled)."""
        waiters = self._seat_waiters[tag]
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                self.wakeups.seat += 1
                return

    def _seat_event(self, tag: str | None = None) -> None:
        """Seats may have opened for ``tag`` (every tag if None): wake one waiter each; the relay does the rest."""
        self.wakeups.seat_events += 1
        if self._suspended:
            return
        for t in self.tags if tag is None else (tag,):
            if self._seat_waiters[t] and self._has_free_seat(t):
                self._wake_one(t)

    def _wake_all_seat_waiters(self) -> None:
        """Shutdown or failure: every waiting loop must see it and stop."""
        for tag in self.tags:
            while self._seat_waiters[tag]:
                self._wake_one(tag)

    def _oldest_group_with_free_seat(self, tag: str) -> _Group | None:
        open_groups = self._open[tag]
        while open_groups:
            group = open_groups[0]
            if group.free_seats() > 0 and self._groups.get(group.group_id) is group:
                return group
            open_groups.popleft()  # full, complete or gone; re-listed if a seat re-opens
            group.listed_open = False
        return None

    def _list_open(self, group: _Group) -> None:
        """Put a pending group back in its tag's open list after a seat re-opened (error, abort, cancel)."""
        if (
            group.listed_open
            or group.free_seats() <= 0
            or self._groups.get(group.group_id) is not group
        ):
            return
        group.listed_open = True
        open_groups = self._open[group.tag]
        if not open_groups or open_groups[-1].group_id < group.group_id:
            open_groups.append(group)
        else:
            ordered = list(open_groups)
            bisect.insort(ordered, group, key=lambda g: g.group_id)
            self._open[group.tag] = deque(ordered)

    def _may_create(self, tag: str) -> bool:
        return self.auto_create and len(self._pending[tag]) < self._max_pending(tag)

    def _max_pending(self, tag: str) -> int:
        quota = self.shares.get(tag, 0) * self.lookahead
        if self.serve_order == "first_complete" and quota > 0:
            return max(quota, self._env_groups_per_tag.get(tag, 0))
        return quota

    def _create_group(
        self,
        tag: str,
        *,
        seed: int | None = None,
        env_config_override: dict[str, Any] | None = None,
        num_seats: int | None = None,
    ) -> _Group:
        index = self._tag_group_count[tag]
        self._tag_group_count[tag] += 1
        group = _Group(
            group_id=self._next_group_id,
            tag=tag,
            tag_index=index,
            seed=derive_seed(self.seed, tag, index) if seed is None else seed,
            created_step=self._policy_step,
            created_batch=self._batches_served,
            num_seats=num_seats or self.num_seats,
            needed=min(self.group_size, num_seats or self.num_seats),
            env_config_override=env_config_override,
        )
        self._next_group_id += 1
        self._pending[tag].append(group)
        self._groups[group.group_id] = group
        self._list_open(group)
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
        group = self._groups.get(trajectory.group_id)
        if group is None or trajectory.episode_id not in group.in_flight:
            self.counters.late_trajectories += 1
            self._unserved.append(("late", trajectory))
            return
        del group.in_flight[trajectory.episode_id]
        if trajectory.stop_reason == "env_error":
            self._on_env_error(group, trajectory)
            self._list_open(group)
        elif trajectory.stop_reason == "aborted":
            self._list_open(group)  # the env gave the seat back; it re-opens
        else:
            self._consecutive_env_errors = 0
            group.trajectories.append(trajectory)
            if len(group.trajectories) >= group.needed:
                self._complete(group)
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
        if self._consecutive_env_errors >= self.max_consecutive_env_errors:
            self.report_fatal(
                f"{self._consecutive_env_errors} env errors in a row without one successful episode; "
                f"the env setup looks broken. Last error: {self._last_env_error}"
            )
            return
        if group.env_errors > self.max_errors_per_group:
            if self.auto_create:
                self.counters.dropped_error_groups += 1
                self._drop(group, fate="dropped_errors")
            else:  # a fixed round must terminate: the error is this episode's result
                group.trajectories.append(trajectory)
                if len(group.trajectories) >= group.needed:
                    self._complete(group, apply_filter=False)

    def _complete(self, group: _Group, apply_filter: bool = True) -> None:
        group.complete = True
        self.counters.completed_groups += 1
        self._cancel_seats(group)
        if (
            apply_filter
            and not self._filter_is_none
            and self.auto_create
            and not self._filter(group.trajectories[: group.needed])
        ):
            if self._filter_drops_this_batch < self._max_filter_drops:
                self._filter_drops_this_batch += 1
                self.counters.filtered_groups += 1
                self._drop(group, fate="filtered")
                return
            self.counters.filter_bypassed_groups += 1
        self._complete_pending[group.tag][group.group_id] = group
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
        self._list_open(group)

    def _notify_trainer(self) -> None:
        """Wake a waiting get_batch / run_fixed_round (at most one waits)."""
        self.wakeups.batch += self._changed.notify()

    def _remove_pending(self, group: _Group) -> None:
        """Take a group out of the pending list in O(log n) (bisect by group_id), keeping the fifo cursor right."""
        pending = self._pending[group.tag]
        index = bisect.bisect_left(pending, group.group_id, key=lambda g: g.group_id)
        if index < len(pending) and pending[index] is group:
            del pending[index]
            if index < self._lead[group.tag]:
                self._lead[group.tag] -= 1
        self._complete_pending[group.tag].pop(group.group_id, None)
        self._groups.pop(group.group_id, None)

    def _drop(self, group: _Group, fate: str = "dropped") -> None:
        self._unserved.extend((fate, t) for t in group.trajectories)
        self._cancel_seats(group)
        self._remove_pending(group)
        self._notify_trainer()
        self._seat_event(
            group.tag
        )  # its quota slot is free: a new group may be created

    # -- trainer side ------------------------------------------------------------------

    async def get_batch(self, batch_size: int, step: int) -> ServedBatch:
        """Wait until ``batch_size`` trajectories in whole groups (oldest first, per tag share) are ready."""
        if batch_size < 1 or batch_size % self.group_size != 0:
            raise ValueError(
                f"batch_size={batch_size} must be a positive multiple of group_size={self.group_size}"
            )
        if not self.auto_create:
            raise RuntimeError(
                "this scheduler plays fixed rounds; call run_fixed_round() instead of get_batch()"
            )
        started = self._clock()
        if batch_size // self.group_size != self.groups_per_batch:
            self._set_groups_per_batch(batch_size // self.group_size)
            self._seat_event()  # a larger quota lets waiting envs create groups
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
        for tag in self.tags:
            pending = self._pending[
                tag
            ]  # ordered by created_step: the stale groups are a prefix
            while pending and step - pending[0].created_step > self.staleness_bound:
                self.counters.dropped_stale_groups += 1
                self._drop(pending[0], fate="dropped_stale")
        if self._suspended:
            self.resume()

    def _ready_heads(self) -> list[_Group] | None:
        """The groups to serve if a batch is ready (see serve_order), else None; amortized O(1) per call."""
        for tag in self.tags:
            share = self.shares.get(tag, 0)
            if self.serve_order == "first_complete":
                if len(self._complete_pending[tag]) < share:
                    return None
                continue
            pending, lead = self._pending[tag], self._lead[tag]
            while lead < len(pending) and pending[lead].complete:
                lead += 1
            self._lead[tag] = lead
            if lead < share:
                return None
        heads: list[_Group] = []
        for tag in self.tags:
            share = self.shares.get(tag, 0)
            if self.serve_order == "first_complete":
                heads.extend(
                    itertools.islice(self._complete_pending[tag].values(), share)
                )
            else:
                heads.extend(self._pending[tag][:share])
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
        window = now - self._window_start
        idle_s = self._idle_s_in_window + sum(
            now - max(since, self._window_start) for since in self._idle_since.values()
        )
        env_seconds = len(self._env_tags) * window
        self._idle_s_in_window = 0.0
        if self.mode == "sync" and self.auto_create:
            self._policy_step = step + 1
            self.suspend(cancel_in_flight=True)
            for tag in self.tags:
                for group in list(self._pending[tag]):
                    self.counters.dropped_stale_groups += 1
                    self._drop(group, fate="dropped_stale")
        # Events caused by serving (cancelled redundant seats, leftovers) belong to this batch.
        counters = self.counters.minus(self._counters_at_last_batch)
        self._counters_at_last_batch = SchedulerCounters(**asdict(self.counters))
        self._filter_drops_this_batch = 0
        self._window_start = now
        self._seat_event()  # served groups free their quota slots
        gauges = self.gauges()
        gauges["env_busy_fraction"] = (
            max(0.0, 1.0 - idle_s / env_seconds) if env_seconds > 0 else 0.0
        )
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
        if self.auto_create:
            raise RuntimeError(
                "run_fixed_round needs a scheduler built with auto_create=False"
            )
        started = self._clock()
        self._policy_step = max(self._policy_step, step)
        groups = []
        for spec in episodes:
            if spec.tag not in self._pending:
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
            for tag in self.tags:
                for group in self._pending[tag]:
                    self._cancel_seats(group)

    def resume(self) -> None:
        if self._suspended:
            self._suspended = False
            self._window_start = self._clock()
            self._idle_s_in_window = 0.0
        self._seat_event()

    def report_fatal(self, message: str) -> None:
        """Fail the rollout: get_batch raises ``message``; env loops get no more episodes."""
        if self._fatal is None:
            self._fatal = RolloutFatalError(message)
            logger.error("rollout failed: %s", message)
        self._notify_trainer()
        self._wake_all_seat_waiters()

    async def on_worker_restart(self, env_ids: Sequence[int], reason: str) -> int:
        """A worker hosting ``env_ids`` died and is being replaced: count it, fail its in-flight episodes.

        Each episode those envs were playing ends ``env_error`` (counted, its seat re-opens, the group is
        refilled as for any env error); returns how many there were.
        """
        self.counters.worker_restarts += 1
        dead = set(env_ids)
        failed = 0
        for group in list(self._groups.values()):
            for episode_id, env_id in list(group.in_flight.items()):
                if env_id not in dead:
                    continue
                failed += 1
                await self.put_trajectory(
                    Trajectory(
                        tag=group.tag,
                        group_id=group.group_id,
                        episode_id=episode_id,
                        env_id=env_id,
                        seed=group.seed,
                        traj_id=f"{group.tag}-g{group.group_id}-e{episode_id}",
                        created_step=group.created_step,
                        stop_reason="env_error",
                        error=f"its EnvManagerWorker died: {reason}",
                    )
                )
        for env_id in dead:
            self._stalled.pop(env_id, None)
        return failed

    def report_stalled(self, env_id: int, description: str) -> None:
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
            "next_group_id": self._next_group_id,
            "tag_group_count": dict(self._tag_group_count),
        }

    def load_seed_state(self, state: Mapping[str, Any]) -> None:
        if self._groups:
            raise RuntimeError(
                "load_seed_state must run before the first group is created"
            )
        self._next_group_id = int(state["next_group_id"])
        for tag, count in dict(state["tag_group_count"]).items():
            if tag in self._tag_group_count:
                self._tag_group_count[tag] = int(count)

    def shutdown(self) -> None:
        self._closed = True
        self._notify_trainer()
        self._wake_all_seat_waiters()

    def gauges(self) -> dict[str, float]:
        pending = [g for tag in self.tags for g in self._pending[tag]]
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
                    for g in self._pending[tag]
                ]
                for tag in self.tags
            },
            "counters": asdict(self.counters),
            "stalled": dict(self._stalled),
        }

    # -- construction from config --------------------------------------------------------

    @classmethod
    def from_config(
        cls,
        config: Any,
        which: str = "train",
        *,
        on_cancel: CancelCallback | None = None,
        start_step: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> GroupQueueManager:
        """Build from a PipelineConfig for ``train_env_manager`` (which='train') or ``val_env_manager`` ('val')."""
        em = config.train_env_manager if which == "train" else config.val_env_manager
        layout = env_layout(
            em.tags,
            em.num_env_groups,
            em.num_groups_partition,
            em.group_size,
            em.group_size_redundancy,
        )
        is_train = which == "train"
        queue = cls(
            env_tags=dict(layout),
            tags=list(em.tags),
            num_groups_partition=groups_per_tag(
                em.tags, em.num_env_groups, em.num_groups_partition
            ),
            group_size=em.group_size,
            group_size_redundancy=em.group_size_redundancy if is_train else 0,
            groups_per_batch=max(1, config.rollout_batch_size // em.group_size)
            if is_train
            else 1,
            mode=config.mode if is_train else "sync",
            staleness_bound=config.staleness_bound if is_train else 0,
            seed=config.seed,
            group_filter=em.group_filter if is_train else "none",
            start_step=start_step,
            auto_create=is_train,
            on_cancel=on_cancel,
            clock=clock,
            serve_order=em.serve_order if is_train else "fifo",
            env_groups_per_tag=dict(
                zip(
                    em.tags,
                    groups_per_tag(em.tags, em.num_env_groups, em.num_groups_partition),
                )
            ),
        )
        busy_at_most = (
            sum(queue._max_pending(tag) for tag in queue.tags) * queue.num_seats
        )
        if is_train and len(layout) > busy_at_most:
            logger.warning(
                "%d env instances, but at most %d can be busy (%d groups per batch x lookahead %d x %d seats); "
                "the rest stay idle: lower num_env_groups, raise rollout_batch_size or use "
                "train_env_manager.serve_order=first_complete",
                len(layout),
                busy_at_most,
                queue.groups_per_batch,
                queue.lookahead,
                queue.num_seats,
            )
        return queue
