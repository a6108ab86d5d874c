"""Episodes that were played but not trained on come back with the next batch, each with its fate."""

from __future__ import annotations

from tests.unit.scheduler.test_scheduler_group_queue import finished, make_queue, take


async def test_env_errors_and_stale_groups_are_handed_over_with_their_fate():
    queue = make_queue(num_envs=4, mode="async", staleness_bound=1, groups_per_batch=1)
    first = [await take(queue, env) for env in range(2)]  # group 0, created for step 0
    await queue.put_trajectory(finished(first[0], 0, stop_reason="env_error"))
    await queue.put_trajectory(
        finished(first[0], 0)
    )  # a late copy: its seat was already given back
    retry = await take(queue, 0)
    await queue.put_trajectory(finished(retry, 0))
    await queue.put_trajectory(finished(first[1], 1))
    batch = await queue.get_batch(step=0)
    assert {fate for fate, _ in batch.unserved} == {"env_error", "late"}
    assert [t.error for fate, t in batch.unserved if fate == "env_error"] == ["boom"]

    second = await take(
        queue, 2
    )  # a group created for step 1, half done when step 3 comes: stale
    await queue.put_trajectory(finished(second, 2))
    await take(queue, 3)
    # get_batch(step=3) drops the stale group, then raises instead of waiting
    queue.report_fatal("stop here")
    try:
        await queue.get_batch(step=3)
    except Exception:
        pass
    assert [(fate, t.group_id) for fate, t in queue._accounts.take_unserved()] == [
        ("dropped_stale", second.group_id)
    ]
