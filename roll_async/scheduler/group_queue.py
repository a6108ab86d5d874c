"""GroupQueueManager: which episode each env plays next, and when a batch of whole groups is ready.

Envs must never wait for each other and the trainer must only ever get whole
groups, fresh enough for its step; these rules decide both, so they live in one
plain asyncio class (no Ray) that unit tests drive directly and that the
RolloutScheduler hosts in a Ray actor and the LocalRolloutScheduler in-process.
The manager applies the rules in order; the pieces it owns have their own
modules: pending_groups, seat_assignment, batch_serving, busy_window, worker_faults.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from roll_async.config.rollout_spec import RolloutSpec
from roll_async.errors import InvalidInputError, LifecycleError, RolloutFatalError
from roll_async.scheduler.batch_serving import BatchAccounts, BatchQuota
from roll_async.scheduler.busy_window import BusyWindow
from roll_async.scheduler.filters import resolve_group_filter
from roll_async.scheduler.layout import rollout_layout
from roll_async.scheduler.pending_groups import EpisodeGroup, PendingGroups
from roll_async.scheduler.queue_rules import QueueRules
from roll_async.scheduler.seat_assignment import CancelCallback, SeatAssigner
from roll_async.scheduler.serve_order import ServeOrder, make_serve_order
from roll_async.scheduler.served_batch import SchedulerCounters, ServedBatch
from roll_async.scheduler.wakeups import TrainerWakeup, WakeupCounters
from roll_async.scheduler.worker_faults import StalledEnvs, reopen_seats_of_dead_envs
from roll_async.trajectory import EpisodeSpec, Trajectory, with_game_seats

logger = logging.getLogger(__name__)


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
    trajectories of a group share tag, env config and seed. A game tag's episode is one game: its policy seats'
    trajectories come in one hand-over (``Trajectory.game_seats``), so a game is kept, dropped or re-played
    whole, and a served batch lists them flat (``group_size`` games x policy seats per group).

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
            raise InvalidInputError(
                f"envs have tags {unknown} that are not in tags={list(rules.tags)}"
            )
        self.rules = rules
        self.tags = list(rules.tags)
        self._env_tags = dict(env_tags)
        self._order: ServeOrder[EpisodeGroup] = make_serve_order(
            rules.serve_order, self.tags
        )
        self._filter = resolve_group_filter(rules.group_filter)
        self._clock = clock
        self._quota = BatchQuota.for_rules(rules, self._env_tags)
        self._policy_step = start_step
        self._pending = PendingGroups(self.tags)
        self.counters = SchedulerCounters()
        self.wakeups = WakeupCounters()
        self._seats = SeatAssigner(
            rules,
            self._pending,
            self._order,
            self._quota,
            self.counters,
            self.wakeups,
            on_cancel,
        )
        #: The trainer side (get_batch, run_fixed_round) waits here; only batch-relevant events notify it.
        self._changed = TrainerWakeup()
        self._window = BusyWindow(clock)
        self._accounts = BatchAccounts(self.counters, self._quota.max_filter_drops)
        self._suspended = False
        self._closed = False
        self._fatal: RolloutFatalError | None = None
        self._consecutive_env_errors = 0
        self._last_env_error = ""
        self._stalled = StalledEnvs()

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
            sum(queue._seats.max_pending(tag) for tag in queue.tags) * queue.num_seats
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
            raise InvalidInputError(
                f"env_id {env_id} is not known to this scheduler"
            ) from None
        self._stalled.clear(env_id)
        woken = False
        try:
            while True:
                if self._closed or self._fatal is not None:
                    return None
                if not self._suspended:
                    spec = self._seats.take(
                        tag,
                        env_id,
                        created_step=self._policy_step,
                        created_batch=self._accounts.batches_served,
                    )
                    if spec is not None:
                        return spec
                self._window.env_waits(env_id)
                # Woken but the seat was taken: keep its place in the queue.
                await self._seats.waiters.wait(tag, keep_place=woken)
                woken = True
        finally:
            self._window.env_stops_waiting(env_id)

    def _seat_event(self, tag: str | None = None) -> None:
        """Seats may have opened for ``tag`` (every tag if None); waiters are woken unless suspended."""
        self._seats.seat_event(tag, suspended=self._suspended)

    async def put_trajectory(self, trajectory: Trajectory) -> None:
        """An env finished (or failed) an episode."""
        self._stalled.clear(trajectory.env_id)
        group = self._pending.by_id.get(trajectory.group_id)
        if group is None or trajectory.episode_id not in group.in_flight:
            self.counters.late_trajectories += 1
            self._accounts.unserved.append(("late", trajectory))
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

    def _on_env_error(self, group: EpisodeGroup, trajectory: Trajectory) -> None:
        self.counters.env_errors += 1
        self._accounts.unserved.append(("env_error", trajectory))
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

    def _complete_if_whole(self, group: EpisodeGroup) -> None:
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
        self._accounts.unserved.extend(
            ("redundant", t) for t in group.trajectories if t.episode_id not in kept
        )
        group.trajectories = [finished[e] for e in standing]
        self._complete(group)

    def _complete(self, group: EpisodeGroup, apply_filter: bool = True) -> None:
        group.complete = True
        self.counters.completed_groups += 1
        self._seats.cancel(group)
        if (
            apply_filter
            and self.rules.group_filter != "none"
            and self.rules.auto_create
            and not self._filter(with_game_seats(group.trajectories[: group.needed]))
        ):
            if self._accounts.spend_filter_drop():
                self.counters.filtered_groups += 1
                self._drop(group, fate="filtered")
                return
            self.counters.filter_bypassed_groups += 1
        self._order.group_completed(group)
        self._notify_trainer()

    def _notify_trainer(self) -> None:
        """Wake a waiting get_batch / run_fixed_round (at most one waits)."""
        self.wakeups.batch += self._changed.notify()

    def _remove_pending(self, group: EpisodeGroup) -> None:
        self._order.group_removed(group, self._pending.remove(group))

    def _drop(self, group: EpisodeGroup, fate: str = "dropped") -> None:
        self._accounts.unserved.extend((fate, t) for t in group.trajectories)
        self._seats.cancel(group)
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
            raise LifecycleError(
                "this scheduler plays fixed rounds; call run_fixed_round() instead of get_batch()"
            )
        started = self._clock()
        self._enter_step(step)
        while True:
            self._raise_if_unusable()
            heads = self._quota.ready_heads(self.tags, self._order, self._pending)
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

    def _serve(
        self, groups: list[EpisodeGroup], step: int, started: float
    ) -> ServedBatch:
        groups = sorted(groups, key=lambda g: g.group_id)
        trajectories: list[Trajectory] = []
        carried_over = 0
        for group in groups:
            self._remove_pending(group)
            # a game's trained seats travel as one hand-over; the trainer gets each seat's trajectory
            trajectories.extend(
                with_game_seats(group.trajectories[: group.needed], detach=True)
            )
            carried_over += group.created_batch < self._accounts.batches_served
        self._accounts.batches_served += 1
        now = self._clock()
        window, busy_fraction = self._window.close(now, len(self._env_tags))
        if self.rules.mode == "sync" and self.rules.auto_create:
            self._policy_step = step + 1
            self.suspend(cancel_in_flight=True)
            for group in list(self._pending):
                self.counters.dropped_stale_groups += 1
                self._drop(group, fate="dropped_stale")
        # Events caused by serving (cancelled redundant seats, leftovers) belong to this batch.
        counters = self._accounts.close_batch()
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
            unserved=[
                (fate, seat)
                for fate, trajectory in self._accounts.take_unserved()
                for seat in with_game_seats([trajectory], detach=True)
            ],
        )

    async def run_fixed_round(
        self, episodes: Sequence[EpisodeSpec], step: int
    ) -> ServedBatch:
        """Play each given episode once (one seat each), wait for all, return them in the given order.

        For validation: seeds and env configs come from ``episodes``; envs are
        suspended again afterwards. ``EpisodeSpec.group_id``/``episode_id`` are
        ignored (the scheduler numbers groups itself).
        """
        if self.rules.auto_create:
            raise LifecycleError(
                "run_fixed_round needs a scheduler built with auto_create=False"
            )
        started = self._clock()
        self._policy_step = max(self._policy_step, step)
        groups = []
        for spec in episodes:
            if spec.tag not in self._pending.by_tag:
                raise InvalidInputError(
                    f"episode tag {spec.tag!r} is not one of this scheduler's tags {self.tags}"
                )
            groups.append(
                self._seats.create_group(
                    spec.tag,
                    created_step=self._policy_step,
                    created_batch=self._accounts.batches_served,
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
            raise LifecycleError("the rollout scheduler was shut down")

    # -- control -----------------------------------------------------------------------

    def suspend(self, cancel_in_flight: bool = True) -> None:
        """No new episodes until resume(); optionally cancel every episode in flight."""
        self._suspended = True
        if cancel_in_flight:
            for group in self._pending:
                self._seats.cancel(group)

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
        self._seats.waiters.wake_all()

    async def on_worker_restart(self, env_ids: Sequence[int], reason: str) -> int:
        """A worker hosting ``env_ids`` died and is being replaced: one restart; its in-flight episodes are lost.

        Each episode those envs were playing is recorded as ``lost_to_restart`` (counted in
        ``episodes_lost_to_restart``) and its seat re-opens for the replacement's envs. A worker's death is
        not an env error: it spends neither the consecutive env-error budget nor the group's error budget,
        so one dead worker hosting many busy envs is one restart, not a broken env setup. Returns how many
        episodes were lost.
        """
        self.counters.worker_restarts += 1
        lost = reopen_seats_of_dead_envs(self._pending, env_ids, reason)
        self._accounts.unserved.extend(("lost_to_restart", t) for t in lost)
        self.counters.episodes_lost_to_restart += len(lost)
        for env_id in set(env_ids):
            self._stalled.clear(env_id)
        if lost:
            self._seat_event()
        return len(lost)

    def report_stalled(self, env_id: int, description: str) -> None:
        """A worker's watchdog saw ``env_id`` in one phase too long; a gauge until the env talks to the queue.

        An env this queue holds waiting for a seat (quota, sync suspension) waits by design and is not
        recorded; a wait for an episode whose request the queue does not hold (lost in transport) is.
        """
        self._stalled.report(
            env_id, description, waits_for_seat=self._window.is_waiting(env_id)
        )

    def clear_stalled(self, env_id: int) -> None:
        self._stalled.clear(env_id)

    def stalled_envs(self) -> dict[int, str]:
        return self._stalled.snapshot()

    def seed_state(self) -> dict[str, Any]:
        """The position in the seed sequence; a resumed run loads it so it continues, not repeats, the seeds.

        Groups pending at save time are not saved: the resumed run creates fresh groups
        after them, so their seeds are skipped rather than trained on twice.
        """
        return self._pending.seed_state()

    def load_seed_state(self, state: Mapping[str, Any]) -> None:
        self._pending.load_seed_state(state)

    def shutdown(self) -> None:
        self._closed = True
        self._notify_trainer()
        self._seats.waiters.wake_all()

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
            "pending": self._pending.describe(),
            "counters": asdict(self.counters),
            "stalled": self._stalled.snapshot(),
        }
