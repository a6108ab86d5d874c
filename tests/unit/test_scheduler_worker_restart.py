"""A dead EnvManagerWorker's episodes: failed as env errors, seats refilled, the restart counted."""

from __future__ import annotations

from roll_async.metrics import WORKER_RESTARTS
from roll_async.scheduler.group_queue import GroupQueueManager
from roll_async.scheduler.queue_rules import QueueRules
from roll_async.trajectory import Trajectory


def finished(spec, env_id: int) -> Trajectory:
    return Trajectory(
        tag=spec.tag,
        group_id=spec.group_id,
        episode_id=spec.episode_id,
        env_id=env_id,
        seed=spec.seed,
        traj_id="t",
        created_step=spec.created_step,
        stop_reason="terminated",
    )


async def test_in_flight_episodes_of_a_dead_worker_fail_and_their_seats_are_refilled():
    queue = GroupQueueManager(
        QueueRules(tags=["a"], group_size=4, groups_per_batch=1),
        env_tags={i: "a" for i in range(4)},
    )
    specs = {env_id: await queue.next_episode(env_id) for env_id in range(4)}
    await queue.put_trajectory(finished(specs[0], 0))
    assert await queue.on_worker_restart([1, 2], "ActorDiedError: killed") == 2
    assert queue.counters.env_errors == 2 and queue.counters.worker_restarts == 1
    refills = [
        await queue.next_episode(env_id) for env_id in (1, 2)
    ]  # the replacement's envs take the seats again
    assert {s.group_id for s in refills} == {specs[1].group_id}
    for env_id, spec in [(1, refills[0]), (2, refills[1]), (3, specs[3])]:
        await queue.put_trajectory(finished(spec, env_id))
    served = await queue.get_batch(4, 0)
    assert len(served.trajectories) == 4
    metrics = served.rollout_metrics()
    assert metrics[WORKER_RESTARTS] == 1.0 and metrics["rollout/env_errors"] == 2.0
