"""Envs out of process against the real vLLM engine and real Ray: an env server, worker restarts.

One env server subprocess (``roll-async env-server``) per module; the session's engine and Ray. Hung envs
in per-env processes (``isolation: process``) are killed, counted and replaced in
``tests/unit/test_env_service.py``, which also bounds the processes.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import (
    CustomEnvConfig,
    EngineConfig,
    EnvManagerConfig,
    GenerationConfig,
    PipelineConfig,
    validate_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HANGS = {"inner_env_type": "countdown", "fault": "hang", "fault_probability": 0.2}


@pytest.fixture(scope="module")
def env_server_url():
    from roll_async.env_service.server_cli import launch_server_process

    process, url = launch_server_process(
        "--env-timeout-s", "60", "--max-envs", "64", "--idle-timeout-s", "20"
    )
    yield url
    process.terminate()
    process.wait(timeout=30)


def flaky_config(num_workers_envs: int = 8, **placement) -> PipelineConfig:
    config = PipelineConfig(
        rollout_batch_size=8,
        sequence_length=512,
        engine=EngineConfig(max_model_len=1024),
        generation=GenerationConfig(temperature=1.0),
        custom_envs={
            "Flaky": CustomEnvConfig(
                env_type="faulty",
                env_config=dict(HANGS),
                max_steps=2,
                max_tokens_per_step=24,
                **placement,
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=2,
            group_size=4,
            tags=["Flaky"],
            env_step_timeout_s=3.0,
            max_env_num_per_worker=num_workers_envs,
        ),
    )
    validate_config(config)
    return config


async def collect(
    config: PipelineConfig, engine, tokenizer_path, steps: int, between=None
):
    from roll_async.scheduler.rollout_scheduler import RolloutScheduler

    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine],
        tokenizer_path=str(tokenizer_path),
    )
    batches, metrics = [], []
    try:
        for step in range(steps):
            batch, step_metrics = await asyncio.wait_for(
                scheduler.get_batch_with_metrics(step), 600
            )
            batches.append(batch)
            metrics.append(step_metrics)
            await scheduler.resume()
            if between is not None:
                await between(scheduler, step)
    finally:
        await scheduler.shutdown()
    return batches, metrics


async def server_stats(url: str) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        return await (await session.get(url + "/health")).json()


async def test_rollout_against_a_live_env_server_survives_hung_envs(
    engine, tiny_model_path, env_server_url
):
    config = flaky_config(service_url=env_server_url)
    batches, metrics = await collect(config, engine, tiny_model_path, steps=4)
    assert [len(b) for b in batches] == [8] * 4
    assert all(
        t.stop_reason != "env_error" and t.num_turns >= 1 for b in batches for t in b
    )
    health = await server_stats(env_server_url)
    errors = sum(m["rollout/env_errors"] for m in metrics)
    # P(no hang in >= 64 steps at 0.2) < 1e-6
    assert health["stats"]["timeouts"] >= 1 and errors >= 1
    # Every instance is closed at shutdown or dropped after its failure; one whose close was cut short
    # by the shutdown (a loaded machine) is reaped by the server once idle: none stays.
    deadline = asyncio.get_running_loop().time() + 120
    while health["envs"] and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(2)
        health = await server_stats(env_server_url)
    assert health["envs"] == 0


async def test_a_killed_worker_is_restarted_and_every_batch_arrives(
    engine, tiny_model_path
):
    config = flaky_config(num_workers_envs=4)  # two EnvManagerWorkers
    config.custom_envs["Flaky"].env_config["fault_probability"] = 0.0
    killed = []

    async def kill_worker_0(scheduler, step):
        if step == 0:
            described = await scheduler.describe()
            pid = described["workers"][0]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    batches, metrics = await collect(
        config, engine, tiny_model_path, steps=4, between=kill_worker_0
    )
    assert killed and [len(b) for b in batches] == [8] * 4
    assert sum(m["rollout/worker_restarts"] for m in metrics) == 1


async def test_worker_deaths_past_the_restart_budget_fail_the_run_with_the_cause(
    engine, tiny_model_path
):
    from roll_async.errors import RolloutFatalError

    config = flaky_config(num_workers_envs=4)
    config.custom_envs["Flaky"].env_config["fault_probability"] = 0.0
    config.train_env_manager.max_worker_restarts = 0

    async def kill_worker_1(scheduler, step):
        described = await scheduler.describe()
        os.kill(described["workers"][1]["pid"], signal.SIGKILL)

    with pytest.raises(
        RolloutFatalError,
        match=r"max_worker_restarts=0 .*: (ActorDiedError|RayActorError)",
    ):
        await collect(config, engine, tiny_model_path, steps=3, between=kill_worker_1)
