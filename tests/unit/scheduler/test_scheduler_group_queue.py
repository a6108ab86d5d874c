"""GroupQueueManager rules, driven directly (no envs, no engine, no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from roll_async.errors import RolloutFatalError
from roll_async.scheduler.group_queue import GroupQueueManager
from roll_async.scheduler.layout import derive_seed, env_layout, split_by_weights
from roll_async.scheduler.queue_rules import QueueRules
from roll_async.trajectory import EpisodeSpec, Trajectory


def make_queue(
    num_envs: int = 4, *, env_tags=None, start_step=0, on_cancel=None, **rules
) -> GroupQueueManager:
    params = dict(tags=["a"], group_size=2, groups_per_batch=1, mode="sync", seed=7)
    params.update(rules)
    return GroupQueueManager(
        QueueRules(**params),
        env_tags if env_tags is not None else {i: "a" for i in range(num_envs)},
        start_step=start_step,
        on_cancel=on_cancel,
    )


def finished(
    spec: EpisodeSpec, env_id: int, reward: float = 1.0, stop_reason: str = "terminated"
) -> Trajectory:
    return Trajectory(
        tag=spec.tag,
        group_id=spec.group_id,
        episode_id=spec.episode_id,
        env_id=env_id,
        seed=spec.seed,
        traj_id=f"{spec.group_id}-{spec.episode_id}",
        created_step=spec.created_step,
        episode_reward=reward,
        stop_reason=stop_reason,
        error="boom" if stop_reason == "env_error" else None,
    )


async def take(
    queue: GroupQueueManager, env_id: int, timeout: float = 0.2
) -> EpisodeSpec | None:
    """next_episode, or None if it is still waiting after ``timeout``."""
    try:
        return await asyncio.wait_for(queue.next_episode(env_id), timeout)
    except TimeoutError:
        return None


async def test_envs_take_seats_of_the_oldest_group_and_share_its_seed():
    queue = make_queue(groups_per_batch=2)
    specs = [await take(queue, env) for env in range(4)]
    assert [s.group_id for s in specs] == [0, 0, 1, 1]
    assert specs[0].seed == specs[1].seed != specs[2].seed == specs[3].seed
    assert [s.episode_id for s in specs] == [0, 1, 0, 1]
    # quota: 2 groups per batch, sync -> at most 2 pending groups, so a fifth request waits
    assert await take(queue, 0, timeout=0.05) is None


async def test_seeds_are_derived_from_the_run_seed():
    async def seeds(run_seed: int) -> list[int]:
        queue = make_queue(seed=run_seed, group_size=1, groups_per_batch=4)
        return [(await take(queue, env)).seed for env in range(4)]

    first, again, other = await seeds(7), await seeds(7), await seeds(8)
    assert first == again == [derive_seed(7, "a", i) for i in range(4)]
    assert first != other
    assert len(set(first)) == 4


async def test_get_batch_returns_exactly_when_the_group_is_whole():
    queue = make_queue()
    a, b = await take(queue, 0), await take(queue, 1)
    batch_task = asyncio.create_task(queue.get_batch(step=0))
    await queue.put_trajectory(finished(a, 0))
    await asyncio.sleep(0.05)
    assert not batch_task.done(), "half a group must not be served"
    await queue.put_trajectory(finished(b, 1))
    served = await asyncio.wait_for(batch_task, 0.5)
    assert [(t.group_id, t.env_id) for t in served.trajectories] == [(0, 0), (0, 1)]
    assert served.step == 0


async def test_redundant_seat_is_cancelled_and_its_late_trajectory_discarded():
    """redundancy_keep='first_finished' (the documented, length-biased option): the first finishers win."""
    cancelled = []
    queue = make_queue(
        group_size=2,
        group_size_redundancy=1,
        redundancy_keep="first_finished",
        on_cancel=lambda *key: cancelled.append(key),
    )
    seats = [await take(queue, env) for env in range(3)]
    assert {s.group_id for s in seats} == {0}
    await queue.put_trajectory(finished(seats[0], 0))
    await queue.put_trajectory(finished(seats[2], 2))
    assert cancelled == [(1, 0, seats[1].episode_id)]
    await queue.put_trajectory(
        finished(seats[1], 1)
    )  # arrives after the group completed
    served = await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert sorted(t.env_id for t in served.trajectories) == [0, 2]
    assert served.counters["cancelled_episodes"] == 1
    assert queue.counters.late_trajectories == 1


async def test_by_default_a_group_keeps_its_first_seats_whatever_finishes_first():
    """seat_order: the redundant seat finishing first does not displace a slower (longer) seat's episode."""
    cancelled = []
    queue = make_queue(
        group_size=2,
        group_size_redundancy=1,
        on_cancel=lambda *key: cancelled.append(key),
    )
    seats = [await take(queue, env) for env in range(3)]
    assert [s.episode_id for s in seats] == [0, 1, 2]
    await queue.put_trajectory(finished(seats[2], 2, reward=1.0))  # short episode
    await queue.put_trajectory(finished(seats[0], 0, reward=0.0))
    assert not cancelled, "seat 1 is still playing: the group is not whole yet"
    batch = asyncio.create_task(queue.get_batch(step=0))
    await asyncio.sleep(0.05)
    assert not batch.done()
    await queue.put_trajectory(finished(seats[1], 1, reward=0.0))  # long episode
    served = await asyncio.wait_for(batch, 0.5)
    assert [t.episode_id for t in served.trajectories] == [0, 1]
    assert [(fate, t.episode_id) for fate, t in served.unserved] == [("redundant", 2)]
    assert queue.counters.late_trajectories == 0


async def test_by_default_a_redundant_seat_replaces_a_seat_whose_episode_failed():
    cancelled = []
    queue = make_queue(
        num_envs=3,
        group_size=2,
        group_size_redundancy=1,
        on_cancel=lambda *key: cancelled.append(key),
    )
    seats = [await take(queue, env) for env in range(3)]
    await queue.put_trajectory(finished(seats[1], 1, stop_reason="env_error"))
    await queue.put_trajectory(finished(seats[2], 2))
    assert not cancelled
    await queue.put_trajectory(finished(seats[0], 0))
    served = await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert [t.episode_id for t in served.trajectories] == [0, 2]
    assert served.counters["env_errors"] == 1


async def test_by_default_the_group_completes_when_a_failed_seat_leaves_the_finished_ones_first():
    """Seats 0 and 2 done, seat 1 fails last: the group is whole (0, 2) at once, no new seat is needed."""
    queue = make_queue(num_envs=3, group_size=2, group_size_redundancy=1)
    seats = [await take(queue, env) for env in range(3)]
    await queue.put_trajectory(finished(seats[2], 2))
    await queue.put_trajectory(finished(seats[0], 0))
    await queue.put_trajectory(finished(seats[1], 1, stop_reason="aborted"))
    served = await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert [t.episode_id for t in served.trajectories] == [0, 2]


async def test_seat_order_keeps_the_reward_of_groups_independent_of_episode_length():
    """Many groups whose long episodes succeed and short ones fail: the default serves the seats' own mix
    (half successes), first_finished serves mostly the short failures."""

    async def served_success(keep: str) -> float:
        queue = make_queue(
            num_envs=4,
            group_size=2,
            group_size_redundancy=2,
            groups_per_batch=1,
            redundancy_keep=keep,
        )
        rewards: list[float] = []
        for step in range(8):
            seats = [await take(queue, env) for env in range(4)]
            # seat i of group `step` is long (and succeeds) when (i + step) is even
            long = [(i + step) % 2 == 0 for i in range(4)]
            for i in sorted(range(4), key=lambda i: long[i]):  # short ones finish first
                await queue.put_trajectory(finished(seats[i], i, reward=float(long[i])))
            served = await asyncio.wait_for(queue.get_batch(step=step), 0.5)
            rewards += [t.episode_reward for t in served.trajectories]
            queue.resume()
        return sum(rewards) / len(rewards)

    assert await served_success("seat_order") == 0.5
    assert await served_success("first_finished") == 0.0


async def test_zero_variance_filter_drops_the_group_and_a_new_one_refills_it():
    queue = make_queue(group_filter="zero_variance")
    a, b = await take(queue, 0), await take(queue, 1)
    await queue.put_trajectory(finished(a, 0, reward=1.0))
    await queue.put_trajectory(finished(b, 1, reward=1.0))  # all equal: dropped
    c, d = await take(queue, 2), await take(queue, 3)
    assert c.group_id == d.group_id == 1 and c.seed != a.seed
    await queue.put_trajectory(finished(c, 2, reward=0.0))
    await queue.put_trajectory(finished(d, 3, reward=1.0))
    served = await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert {t.group_id for t in served.trajectories} == {1}
    assert served.counters["filtered_groups"] == 1


async def test_filter_is_bypassed_after_too_many_drops_so_training_cannot_stall():
    queue = make_queue(group_filter="zero_variance", max_filter_drops_per_batch=1)
    for expected_group in (0, 1):
        a, b = await take(queue, 0), await take(queue, 1)
        assert a.group_id == expected_group
        await queue.put_trajectory(finished(a, 0, reward=0.0))
        await queue.put_trajectory(finished(b, 1, reward=0.0))
    served = await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert {t.group_id for t in served.trajectories} == {1}
    assert (
        served.counters["filtered_groups"] == 1
        and served.counters["filter_bypassed_groups"] == 1
    )


async def test_sync_mode_suspends_when_the_batch_is_served_and_resumes_for_the_next_step():
    cancelled = []
    queue = make_queue(
        group_size=1,
        group_size_redundancy=1,
        on_cancel=lambda *key: cancelled.append(key),
    )
    first, spare = await take(queue, 0), await take(queue, 1)
    assert first.group_id == spare.group_id == 0 and first.created_step == 0
    await queue.put_trajectory(finished(first, 0))
    served = await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert len(served.trajectories) == 1
    assert cancelled == [(1, 0, spare.episode_id)]
    assert queue.suspended
    assert await take(queue, 0, timeout=0.05) is None, "no new episode while suspended"
    queue.resume()
    spec = await take(queue, 0)
    assert spec is not None and spec.created_step == 1


async def test_next_get_batch_resumes_a_suspended_sync_scheduler_by_itself():
    queue = make_queue(group_size=1)
    await queue.put_trajectory(finished(await take(queue, 0), 0))
    await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    waiting = asyncio.create_task(queue.next_episode(0))
    batch = asyncio.create_task(queue.get_batch(step=1))
    spec = await asyncio.wait_for(waiting, 0.5)
    await queue.put_trajectory(finished(spec, 0))
    served = await asyncio.wait_for(batch, 0.5)
    assert [t.created_step for t in served.trajectories] == [1]


async def test_async_mode_keeps_handing_out_episodes_after_get_batch():
    queue = make_queue(group_size=1, mode="async", staleness_bound=1)
    await queue.put_trajectory(finished(await take(queue, 0), 0))
    await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert not queue.suspended
    spec = await take(queue, 1)
    # made with step-0 weights while step 0 trains
    assert spec is not None and spec.created_step == 0
    await queue.put_trajectory(finished(spec, 1))
    served = await asyncio.wait_for(queue.get_batch(step=1), 0.5)
    assert [1 - t.created_step for t in served.trajectories] == [1]


async def test_stale_groups_are_dropped_counted_and_replaced():
    queue = make_queue(group_size=1, mode="async", staleness_bound=1)
    old = await take(queue, 0)
    assert old.created_step == 0
    batch = asyncio.create_task(
        queue.get_batch(step=2)
    )  # step 2 - created 0 > 1: stale
    fresh = await take(queue, 1)
    assert fresh.group_id != old.group_id and fresh.created_step == 2
    await queue.put_trajectory(finished(old, 0))  # too late: the group is gone
    await queue.put_trajectory(finished(fresh, 1))
    served = await asyncio.wait_for(batch, 0.5)
    assert [t.group_id for t in served.trajectories] == [fresh.group_id]
    assert served.counters["dropped_stale_groups"] == 1


async def test_oldest_group_is_served_first_even_if_younger_ones_finish_earlier():
    queue = make_queue(
        group_size=1, mode="async", staleness_bound=2
    )  # lookahead 2: two groups pending
    slow, fast = await take(queue, 0), await take(queue, 1)
    assert slow.group_id < fast.group_id
    await queue.put_trajectory(finished(fast, 1))
    batch = asyncio.create_task(queue.get_batch(step=0))
    await asyncio.sleep(0.05)
    assert not batch.done(), (
        "the younger group must wait for the older one (no starvation)"
    )
    await queue.put_trajectory(finished(slow, 0))
    assert [t.group_id for t in (await asyncio.wait_for(batch, 0.5)).trajectories] == [
        slow.group_id
    ]
    served = await asyncio.wait_for(queue.get_batch(step=1), 0.5)
    assert [t.group_id for t in served.trajectories] == [fast.group_id]


async def test_env_error_reopens_the_seat_for_the_same_group():
    queue = make_queue(group_size=1)
    spec = await take(queue, 0)
    await queue.put_trajectory(finished(spec, 0, stop_reason="env_error"))
    retry = await take(queue, 1)
    assert (retry.group_id, retry.seed) == (
        spec.group_id,
        spec.seed,
    ) and retry.episode_id != spec.episode_id
    await queue.put_trajectory(finished(retry, 1))
    served = await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert [t.stop_reason for t in served.trajectories] == ["terminated"]
    assert served.counters["env_errors"] == 1


async def test_a_group_that_keeps_failing_is_dropped_and_replaced():
    queue = make_queue(group_size=1, max_errors_per_group=1)
    first = await take(queue, 0)
    for env in (0, 1):
        spec = await take(queue, env) if env else first
        assert spec.group_id == first.group_id
        await queue.put_trajectory(finished(spec, env, stop_reason="env_error"))
    replacement = await take(queue, 2)
    assert replacement.group_id != first.group_id and replacement.seed != first.seed
    assert queue.counters.dropped_error_groups == 1


async def test_endless_env_errors_fail_get_batch_with_the_last_error():
    queue = make_queue(group_size=1, max_consecutive_env_errors=3)
    batch = asyncio.create_task(queue.get_batch(step=0))
    for _ in range(3):
        spec = await take(queue, 0)
        await queue.put_trajectory(finished(spec, 0, stop_reason="env_error"))
    with pytest.raises(RolloutFatalError, match="boom"):
        await asyncio.wait_for(batch, 0.5)
    assert await queue.next_episode(0) is None


async def test_report_fatal_wakes_a_waiting_get_batch():
    queue = make_queue()
    batch = asyncio.create_task(queue.get_batch(step=0))
    await asyncio.sleep(0.01)
    queue.report_fatal("worker 3: rollout loop of env 9 died: engine exploded")
    with pytest.raises(RolloutFatalError, match="engine exploded"):
        await asyncio.wait_for(batch, 0.5)


async def test_tags_share_each_batch_by_partition():
    env_tags = {0: "a", 1: "a", 2: "a", 3: "b"}
    queue = make_queue(
        env_tags=env_tags,
        tags=["a", "b"],
        num_groups_partition=[3, 1],
        group_size=1,
        groups_per_batch=4,
    )
    assert queue.shares == {"a": 3, "b": 1}
    specs = {env: await take(queue, env) for env in env_tags}
    assert [specs[e].tag for e in env_tags] == ["a", "a", "a", "b"]
    for env, spec in specs.items():
        await queue.put_trajectory(finished(spec, env))
    served = await asyncio.wait_for(queue.get_batch(step=0), 0.5)
    assert sorted(t.tag for t in served.trajectories) == ["a", "a", "a", "b"]


async def test_watchdog_reports_show_as_a_gauge_until_the_env_progresses():
    queue = make_queue()
    queue.report_stalled(0, "env 0 stuck in generate for 400s")
    assert queue.gauges()["stalled_envs"] == 1
    await take(queue, 0)
    assert queue.gauges()["stalled_envs"] == 0


async def test_fixed_round_plays_each_episode_once_and_keeps_their_order():
    queue = make_queue(num_envs=2, group_size=1, auto_create=False)
    episodes = [
        EpisodeSpec(tag="a", group_id=0, episode_id=0, seed=s, created_step=0)
        for s in (11, 22, 33)
    ]
    round_task = asyncio.create_task(queue.run_fixed_round(episodes, step=5))
    taken = [await take(queue, 0), await take(queue, 1)]
    await queue.put_trajectory(finished(taken[1], 1))
    taken.append(await take(queue, 1))
    assert [s.seed for s in taken] == [11, 22, 33]
    for spec in reversed(taken):
        await queue.put_trajectory(finished(spec, 0))
    served = await asyncio.wait_for(round_task, 0.5)
    assert [t.seed for t in served.trajectories] == [11, 22, 33]
    assert await take(queue, 0, timeout=0.05) is None, "suspended between rounds"


def test_bad_batch_quota_is_rejected():
    # get_batch takes no size: the quota is the rules' (the spec's groups_per_batch), checked when made;
    # a rollout_batch_size that is no multiple of group_size fails at config load (test_config).
    with pytest.raises(ValueError, match=r"groups_per_batch=0: must be >= 1"):
        make_queue(groups_per_batch=0)


def test_split_and_layout_helpers():
    assert split_by_weights(4, [1, 1, 1]) == [2, 1, 1]
    assert split_by_weights(5, [3, 1]) == [4, 1]
    assert split_by_weights(0, [1, 2]) == [0, 0]
    layout = env_layout(["a", "b"], 3, [2, 1], group_size=2, group_size_redundancy=1)
    assert [tag for _, tag in layout] == ["a"] * 6 + ["b"] * 3
    assert [env for env, _ in layout] == list(range(9))
    assert [t for _, t in env_layout(["a", "b"], 3, [], 1, 0)] == ["a", "a", "b"]


def test_zero_variance_needs_groups_of_two():
    with pytest.raises(ValueError, match="group_size >= 2"):
        make_queue(group_size=1, group_filter="zero_variance")


async def test_seed_state_lets_a_resumed_run_continue_the_seed_sequence():
    first = make_queue(num_envs=2)
    seen = []
    for step in range(3):
        specs = [await take(first, env) for env in range(2)]
        seen.append(specs[0].seed)
        for env, spec in enumerate(specs):
            await first.put_trajectory(finished(spec, env))
        await first.get_batch(step)
        first.resume()
    state = first.seed_state()
    assert state == {"next_group_id": 3, "tag_group_count": {"a": 3}}
    resumed = make_queue(num_envs=2, start_step=3)
    resumed.load_seed_state(state)
    spec = await take(resumed, 0)
    assert (spec.group_id, spec.seed) == (3, derive_seed(7, "a", 3))
    assert spec.seed not in seen
    with pytest.raises(RuntimeError, match="before the first group"):
        resumed.load_seed_state(state)
