"""The distributed rollout on real Ray: GroupQueueManager actor, EnvManagerWorker actors, FakeEngine actors.

The engine is a FAKE (no model) so these tests check scheduling, fault handling
and actor wiring quickly; the lead's real-engine tests cover vLLM.
"""

from __future__ import annotations

import asyncio

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)
from roll_async.errors import RolloutFatalError
from roll_async.scheduler.rollout_scheduler import RolloutScheduler
from roll_async.scheduler.validation import ValidationScheduler
from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
from roll_async.testing.fake_engine import FakeEngine
from roll_async.testing.scripted_envs import scripted_env_factory

pytestmark = pytest.mark.integration

TIMEOUT_S = 30


@pytest.fixture(scope="module")
def tokenizer_setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer = build_chatml_test_tokenizer(save_dir=path)
    reply = tokenizer("<answer>Up</answer>", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    return str(path), reply


def fake_engine(ray, reply, **kwargs):
    return (
        ray.remote(FakeEngine)
        .options(num_cpus=0, max_concurrency=1000)
        .remote(lambda r: reply, **kwargs)
    )


def config_for(
    *,
    mode: str = "sync",
    max_staleness: int | None = None,
    env_config: dict | None = None,
    num_env_groups: int = 2,
    group_size: int = 2,
    redundancy: int = 0,
    group_filter: str = "none",
    generation: GenerationConfig | None = None,
    val_episodes: int = 0,
    request_transport: str = "zmq",
) -> PipelineConfig:
    config = PipelineConfig(
        mode=mode,
        max_staleness=max_staleness,
        rollout_batch_size=num_env_groups * group_size,
        sequence_length=512,
        generation=generation or GenerationConfig(retry_backoff_s=0.01),
        custom_envs={
            "count": CustomEnvConfig(
                env_type="scripted",
                env_config=env_config or {"episode_length": 2},
                max_tokens_per_step=16,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=num_env_groups,
            group_size=group_size,
            group_size_redundancy=redundancy,
            tags=["count"],
            max_env_num_per_worker=2,
            group_filter=group_filter,
        ),
        val_env_manager=EnvManagerConfig(
            num_env_groups=val_episodes,
            group_size=1,
            tags=["count"],
            max_env_num_per_worker=2,
        ),
    )
    config.engine.request_transport = request_transport
    validate_config(config)
    return config


@pytest.mark.parametrize("request_transport", ["zmq", "ray"])
async def test_sync_rollout_on_two_workers_serves_whole_on_policy_groups(
    ray_session, tokenizer_setup, request_transport
):
    ray = ray_session
    path, reply = tokenizer_setup
    engine = fake_engine(ray, reply, latency_s=0.005)
    config = config_for(request_transport=request_transport)
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=path,
        env_factory=scripted_env_factory,
    )
    try:
        for step in range(3):
            batch, metrics = await asyncio.wait_for(
                scheduler.get_batch_with_metrics(step), TIMEOUT_S
            )
            groups: dict[int, list] = {}
            for trajectory in batch:
                groups.setdefault(trajectory.group_id, []).append(trajectory)
            assert len(groups) == 2 and all(
                len(g) == 2 and len({t.seed for t in g}) == 1 for g in groups.values()
            )
            assert all(
                t.created_step == step and t.stop_reason == "terminated" for t in batch
            )
            assert (
                metrics["rollout/staleness/max"] == 0
                and metrics["rollout/trajectories_per_s"] > 0
            )
            assert batch[0].token_ids[-len(reply) :] == reply
            await scheduler.resume()
        assert scheduler.num_workers == 2
        # engine.request_transport: zmq (the default) carries each episode's hand-over too (3 steps x 4 envs at least)
        described = await scheduler.describe()
        handovers = described["queue"]["handovers_over_zmq"]
        assert handovers >= 12 if request_transport == "zmq" else handovers == 0
        # rollout_sched_policy: batch (the default) on every thread of the queue actor and the workers
        for process in [described["queue"], *described["workers"]]:
            assert set(process["sched_policy"]) == {"batch"}, process["sched_policy"]
        requests = await engine.received_requests.remote()
        assert {r.request_id.split("-env")[1].split("-")[0] for r in requests} == {
            "0",
            "1",
            "2",
            "3",
        }
    finally:
        await scheduler.shutdown()
        ray.kill(engine)


async def test_async_rollout_keeps_staleness_within_the_bound(
    ray_session, tokenizer_setup
):
    ray = ray_session
    path, reply = tokenizer_setup
    engine = fake_engine(ray, reply, latency_s=0.005)
    config = config_for(mode="async", max_staleness=1)
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=path,
        env_factory=scripted_env_factory,
    )
    try:
        for step in range(4):
            batch = await asyncio.wait_for(scheduler.get_batch(step), TIMEOUT_S)
            assert all(step - t.created_step <= 1 for t in batch)
            assert all(step - t.oldest_weight_version <= 1 for t in batch)
            await asyncio.sleep(0.05)  # "training": the env loops keep generating
            await engine.update_weights.remote(None, step + 1)
        assert scheduler.last_metrics["rollout/staleness/max"] <= 1
    finally:
        await scheduler.shutdown()
        ray.kill(engine)


async def test_env_errors_redundancy_and_filter_on_ray(ray_session, tokenizer_setup):
    ray = ray_session
    path, reply = tokenizer_setup
    engine = fake_engine(ray, reply)
    config = config_for(
        env_config={"episode_length": 2, "fail_rate": 0.25, "reward": "random"},
        group_size=2,
        redundancy=1,
        group_filter="zero_variance",
    )
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=path,
        env_factory=scripted_env_factory,
    )
    errors = filtered = 0
    try:
        # Rewards are coin flips, so a group of two has zero variance half the time: 3 batches (6 served groups)
        # saw no filtered group in about 1 run of 64. Keep collecting (up to 12 batches) until both happened.
        for step in range(12):
            if step >= 3 and errors > 0 and filtered > 0:
                break
            batch, metrics = await asyncio.wait_for(
                scheduler.get_batch_with_metrics(step), TIMEOUT_S
            )
            errors += metrics["rollout/env_errors"]
            filtered += (
                metrics["rollout/filtered_groups"]
                + metrics["rollout/filter_bypassed_groups"]
            )
            assert all(t.stop_reason != "env_error" for t in batch)
            by_group: dict[int, list[float]] = {}
            for t in batch:
                by_group.setdefault(t.group_id, []).append(t.episode_reward)
            assert all(len(r) == 2 for r in by_group.values())
            if not metrics["rollout/filter_bypassed_groups"]:
                assert all(len(set(r)) == 2 for r in by_group.values()), (
                    "zero-variance groups must be filtered"
                )
    finally:
        await scheduler.shutdown()
        ray.kill(engine)
    assert errors > 0 and filtered > 0


async def test_an_engine_that_keeps_failing_surfaces_in_get_batch(
    ray_session, tokenizer_setup
):
    ray = ray_session
    path, reply = tokenizer_setup
    engine = fake_engine(ray, reply, fail_requests=10**6)
    config = config_for(
        generation=GenerationConfig(max_retries=1, retry_backoff_s=0.01)
    )
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=path,
        env_factory=scripted_env_factory,
    )
    try:
        with pytest.raises(
            RolloutFatalError,
            match=r"engine request .* failed for env \d+ \(tag count\), turn 0",
        ):
            await asyncio.wait_for(scheduler.get_batch(0), TIMEOUT_S)
    finally:
        await scheduler.shutdown()
        ray.kill(engine)


async def test_a_dead_worker_past_the_restart_budget_makes_get_batch_raise_instead_of_hanging(
    ray_session, tokenizer_setup
):
    ray = ray_session
    path, reply = tokenizer_setup
    engine = fake_engine(ray, reply, latency_s=0.05)
    config = config_for(env_config={"episode_length": 50})
    config.train_env_manager.max_worker_restarts = (
        0  # a dead worker is otherwise restarted (test_env_service_rollout)
    )
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=path,
        env_factory=scripted_env_factory,
    )
    try:
        await scheduler.start()
        ray.kill(scheduler._workers[0])
        with pytest.raises(
            RolloutFatalError, match="EnvManagerWorker 0 died after 0 worker restarts"
        ):
            await asyncio.wait_for(scheduler.get_batch(0), TIMEOUT_S)
    finally:
        await scheduler.shutdown()
        ray.kill(engine)


async def test_validation_on_ray_is_repeatable(ray_session, tokenizer_setup):
    ray = ray_session
    path, reply = tokenizer_setup
    engine = fake_engine(ray, reply)
    config = config_for(
        env_config={"episode_length": 2, "reward": "seed_parity"}, val_episodes=3
    )
    val_spec = rollout_spec(config, "val")
    validation = ValidationScheduler.for_spec(
        val_spec,
        RolloutScheduler(
            val_spec,
            engine_handles=[engine],
            tokenizer_path=path,
            env_factory=scripted_env_factory,
        ),
    )
    try:
        first, metrics = await asyncio.wait_for(validation.evaluate(step=0), TIMEOUT_S)
        second, _ = await asyncio.wait_for(validation.evaluate(step=1), TIMEOUT_S)
    finally:
        await validation.shutdown()
        ray.kill(engine)
    assert [t.seed for t in first] == [e.seed for e in validation.episodes]
    assert [(t.seed, t.token_ids, t.episode_reward) for t in first] == [
        (t.seed, t.token_ids, t.episode_reward) for t in second
    ]
    assert metrics["val/num_episodes"] == 3 and "val/count/episode_reward" in metrics


async def test_a_dead_worker_hosting_many_busy_envs_is_restarted_and_the_run_goes_on(
    ray_session, tokenizer_setup
):
    # 104 envs busy on one worker, more than the queue's 100 consecutive env errors: the worker's death
    # must be one restart, not 104 env errors in a row that fail the run as a broken env setup.
    ray = ray_session
    path, reply = tokenizer_setup
    engine = fake_engine(ray, reply, latency_s=0.5)
    config = config_for(
        num_env_groups=26, group_size=4, env_config={"episode_length": 3}
    )
    config.train_env_manager.max_env_num_per_worker = 104
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=path,
        env_factory=scripted_env_factory,
    )
    try:
        await scheduler.start()
        assert scheduler.num_workers == 1
        for _ in range(200):
            queue = (await scheduler.describe())["queue"]
            in_flight = sum(len(g["in_flight"]) for g in queue["pending"]["count"])
            if in_flight == 104:
                break
            await asyncio.sleep(0.05)
        assert in_flight == 104
        ray.kill(scheduler._workers[0])
        batch, metrics = await asyncio.wait_for(scheduler.get_batch_with_metrics(0), 90)
        assert len(batch) == 104
        assert metrics["rollout/worker_restarts"] == 1
        assert metrics["rollout/episodes_lost_to_restart"] > 100
        assert metrics["rollout/env_errors"] == 0
    finally:
        await scheduler.shutdown()
        ray.kill(engine)
