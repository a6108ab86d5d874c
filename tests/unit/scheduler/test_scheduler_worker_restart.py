"""A dead EnvManagerWorker's episodes: lost to the restart (not env errors), seats refilled, the restart counted."""

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


async def test_in_flight_episodes_of_a_dead_worker_are_lost_and_their_seats_are_refilled():
    queue = GroupQueueManager(
        QueueRules(tags=["a"], group_size=4, groups_per_batch=1),
        env_tags={i: "a" for i in range(4)},
    )
    specs = {env_id: await queue.next_episode(env_id) for env_id in range(4)}
    await queue.put_trajectory(finished(specs[0], 0))
    assert await queue.on_worker_restart([1, 2], "ActorDiedError: killed") == 2
    assert queue.counters.episodes_lost_to_restart == 2
    assert queue.counters.env_errors == 0 and queue.counters.worker_restarts == 1
    refills = [
        await queue.next_episode(env_id) for env_id in (1, 2)
    ]  # the replacement's envs take the seats again
    assert {s.group_id for s in refills} == {specs[1].group_id}
    for env_id, spec in [(1, refills[0]), (2, refills[1]), (3, specs[3])]:
        await queue.put_trajectory(finished(spec, env_id))
    served = await queue.get_batch(0)
    assert len(served.trajectories) == 4
    metrics = served.rollout_metrics()
    assert metrics[WORKER_RESTARTS] == 1.0 and metrics["rollout/env_errors"] == 0.0
    assert metrics["rollout/episodes_lost_to_restart"] == 2.0


async def test_a_dead_worker_hosting_many_busy_envs_is_one_restart_not_a_run_of_env_errors():
    # 120 busy envs on one worker, a consecutive-error budget of 100: before, each in-flight episode of the
    # dead worker counted as an env error in a row and the run failed with "env setup looks broken".
    num_envs = 120
    queue = GroupQueueManager(
        QueueRules(tags=["a"], group_size=4, groups_per_batch=num_envs // 4),
        env_tags={i: "a" for i in range(num_envs)},
    )
    specs = {env_id: await queue.next_episode(env_id) for env_id in range(num_envs)}
    await queue.put_trajectory(  # one real env error before the restart
        Trajectory(
            tag="a",
            group_id=specs[0].group_id,
            episode_id=specs[0].episode_id,
            env_id=0,
            seed=specs[0].seed,
            traj_id="err",
            created_step=0,
            stop_reason="env_error",
            error="boom",
        )
    )
    specs[0] = await queue.next_episode(0)
    assert await queue.on_worker_restart(list(range(num_envs)), "killed") == num_envs
    assert queue.failure is None
    assert queue._consecutive_env_errors == 1  # the budget is untouched by the restart
    assert queue.counters.env_errors == 1 and queue.counters.dropped_error_groups == 0
    assert queue.counters.episodes_lost_to_restart == num_envs
    # The run goes on: the replacement's envs take the seats again and the batch completes.
    refills = {env_id: await queue.next_episode(env_id) for env_id in range(num_envs)}
    for env_id, spec in refills.items():
        await queue.put_trajectory(finished(spec, env_id))
    served = await queue.get_batch(0)
    assert len(served.trajectories) == num_envs
    metrics = served.rollout_metrics()
    assert metrics[WORKER_RESTARTS] == 1.0
    assert metrics["rollout/episodes_lost_to_restart"] == float(num_envs)
    assert metrics["rollout/env_errors"] == 1.0
    lost = [t for fate, t in served.unserved if fate == "lost_to_restart"]
    assert len(lost) == num_envs
