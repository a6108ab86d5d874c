"""GroupQueueManager at scale (found by the 10,000-env simulation): no thundering herd, no rescans of full groups.

With thousands of envs waiting for quota, every finished trajectory used to wake
every waiting env, and each rescanned every pending group for a free seat
(quadratic CPU). Env loops now wait on a channel that only seat-opening events
notify, and free seats are found through a per-tag list of open groups. These
tests pin the behaviour that must not change: oldest group first, re-opened
seats are found again, waiting envs do wake when a seat opens.
"""

from __future__ import annotations

import asyncio

from roll_async.scheduler.group_queue import GroupQueueManager
from roll_async.scheduler.pending_groups import EpisodeGroup
from roll_async.scheduler.queue_rules import QueueRules
from roll_async.trajectory import Trajectory


def queue(
    num_envs: int, *, group_size: int = 2, groups_per_batch: int = 1, staleness: int = 1
) -> GroupQueueManager:
    return GroupQueueManager(
        QueueRules(
            tags=["t"],
            group_size=group_size,
            groups_per_batch=groups_per_batch,
            mode="async",
            staleness_bound=staleness,
        ),
        env_tags={i: "t" for i in range(num_envs)},
    )


def done(spec, env_id: int, stop_reason: str = "terminated") -> Trajectory:
    return Trajectory(
        tag=spec.tag,
        group_id=spec.group_id,
        episode_id=spec.episode_id,
        env_id=env_id,
        seed=spec.seed,
        traj_id="x",
        created_step=spec.created_step,
        stop_reason=stop_reason,
    )


async def test_a_finished_trajectory_does_not_wake_envs_waiting_for_a_seat():
    q = queue(50, group_size=2, groups_per_batch=1, staleness=1)
    specs = [
        await q.next_episode(0),
        await q.next_episode(1),
    ]  # the only group allowed (quota 1)
    waiters = [asyncio.ensure_future(q.next_episode(i)) for i in range(2, 50)]
    await asyncio.sleep(0)
    await q.put_trajectory(done(specs[0], 0))
    await q.put_trajectory(done(specs[1], 1))
    assert q.wakeups.seat == 0 and not any(w.done() for w in waiters)
    served = await asyncio.wait_for(
        q.get_batch(step=0), 1
    )  # serving frees quota: now they wake
    assert len(served.trajectories) == 2
    await asyncio.sleep(0.01)
    assert sum(w.done() for w in waiters) == 2  # one new group of 2 seats
    # exactly the two that got seats: one woken by the event, one by the relay
    assert q.wakeups.seat == 2
    q.shutdown()
    await asyncio.gather(*waiters)


async def test_each_seat_event_wakes_one_waiter_however_many_wait():
    """O(1) wake-ups: 2,000 envs wait; each seat given back wakes exactly one of them (counted)."""
    q = queue(2002, group_size=2, groups_per_batch=1, staleness=1)
    s0, s1 = await q.next_episode(0), await q.next_episode(1)
    waiters = [asyncio.ensure_future(q.next_episode(i)) for i in range(2, 2002)]
    await asyncio.sleep(0)
    before = (q.wakeups.seat, q.wakeups.seat_events)
    await q.put_trajectory(done(s0, 0, stop_reason="aborted"))
    await asyncio.sleep(0.01)
    assert q.wakeups.seat - before[0] == 1 and q.wakeups.seat_events - before[1] == 1
    assert sum(w.done() for w in waiters) == 1
    await q.put_trajectory(done(s1, 1, stop_reason="env_error"))
    await asyncio.sleep(0.01)
    assert q.wakeups.seat - before[0] == 2 and sum(w.done() for w in waiters) == 2
    # A trajectory that does not complete a group wakes nobody on the trainer side either.
    assert q.wakeups.batch == 0
    q.shutdown()
    await asyncio.gather(*waiters)


async def test_seats_go_to_the_oldest_group_and_a_reopened_seat_is_found_again():
    q = queue(8, group_size=2, groups_per_batch=4, staleness=1)
    a0, a1 = await q.next_episode(0), await q.next_episode(1)  # group A full
    b0 = await q.next_episode(2)  # group B, one free seat left
    assert a0.group_id == a1.group_id != b0.group_id
    await q.put_trajectory(done(a1, 1, stop_reason="env_error"))  # A's seat re-opens
    again = await q.next_episode(3)
    # the oldest group first, although it had been full
    assert again.group_id == a0.group_id
    b1 = await q.next_episode(4)
    assert b1.group_id == b0.group_id
    c = await q.next_episode(5)
    assert c.group_id > b0.group_id


async def test_a_waiting_env_wakes_when_a_seat_is_given_back():
    q = queue(3, group_size=2, groups_per_batch=1, staleness=1)
    s0, _ = await q.next_episode(0), await q.next_episode(1)
    waiter = asyncio.ensure_future(q.next_episode(2))
    await asyncio.sleep(0)
    assert not waiter.done()
    await q.put_trajectory(done(s0, 0, stop_reason="aborted"))
    spec = await asyncio.wait_for(waiter, 1)
    assert spec.group_id == s0.group_id


async def test_handing_out_seats_does_not_rescan_full_groups():
    # 2,000 groups with every seat taken: the next seat is found without touching them again.
    q = queue(4001, group_size=2, groups_per_batch=2001, staleness=1)
    for env_id in range(4000):
        await q.next_episode(env_id)
    calls = 0
    original = EpisodeGroup.free_seats

    def counting(self):
        nonlocal calls
        calls += 1
        return original(self)

    EpisodeGroup.free_seats = counting  # type: ignore[method-assign]
    try:
        spec = await q.next_episode(4000)
    finally:
        EpisodeGroup.free_seats = original  # type: ignore[method-assign]
    assert spec.episode_id == 0 and calls < 10
