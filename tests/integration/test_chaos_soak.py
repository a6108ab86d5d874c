"""The chaos soak, short: a few async training steps on the session's real engine with one of each cheap fault.

Steps 1-3 get an env exception, an env hang past ``env_step_timeout_s`` and an env segfault (every env in
its own process), a dropped queue connection and ``kill -9`` of an EnvManagerWorker, injected by the soak's
own injector (``benchmarks/chaos.py``) beside an in-process ``AgenticPipeline``; then ``check_run`` must find
every step logged, every group served once and whole, none lost, staleness within the bound and every fault
counted under its metric. A killed engine replica and SIGTERM + resume are left to the full soak
(``python -m benchmarks.chaos``) and covered on their own by ``test_replica_failover.py`` and
``test_run_observability.py``.
"""

from __future__ import annotations

import asyncio
import glob

import pytest

from benchmarks.chaos import (
    Fault,
    SoakConfig,
    check_run,
    inject,
    prepare_trigger_dir,
    soak_pipeline_config,
    validate_schedule,
)
from roll_async.pipelines.agentic_pipeline import AgenticPipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULTS = [
    Fault("env_raise", 1),
    Fault("env_hang", 1),
    Fault("env_segfault", 1),
    Fault("connection_drop", 2),
    Fault("worker_kill", 3),
]


@pytest.fixture
async def fresh_weights(engine, tiny_model_path):
    """Give the shared engine the tiny model's own weights back after the run trained them."""
    yield
    from safetensors.torch import load_file

    original = load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0])
    version = await engine.get_weight_version.remote()
    await engine.pause.remote("wait")
    await engine.update_weights.remote(original, version + 1)
    await engine.resume.remote()


async def test_a_short_soak_survives_one_of_each_cheap_fault_and_loses_no_group(
    engine, tmp_path, fresh_weights
):
    soak = SoakConfig(
        seed=5,
        max_steps=7,
        counts={},
        quiet_steps=2,
        num_replicas=1,
        env_step_timeout_s=3.0,
    )
    validate_schedule(soak, FAULTS)
    run_dir = tmp_path / "run"
    trigger_dir = prepare_trigger_dir(run_dir)
    config = soak_pipeline_config(
        trigger_dir,
        [
            f"output_dir={run_dir}",
            f"max_steps={soak.max_steps}",
            f"seed={soak.seed}",
            "engine.num_replicas=1",
            f"train_env_manager.env_step_timeout_s={soak.env_step_timeout_s}",
            "logging.console=false",
        ],
    )
    pipeline = AgenticPipeline(config, engines=[engine])
    injector = asyncio.create_task(
        inject(
            pipeline,
            FAULTS,
            run_dir,
            trigger_dir,
            soak.seed,
            soak.env_step_timeout_s + 2.0,
        )
    )
    try:
        await asyncio.wait_for(pipeline.run(), 600)
    finally:
        injector.cancel()
        outcome = (await asyncio.gather(injector, return_exceptions=True))[0]
    assert not isinstance(outcome, Exception), outcome
    summary = check_run(run_dir, soak, FAULTS, [{"phase": 1, "rc": 0}])
    assert summary["ok"], "\n".join(summary["failures"])
    assert summary["groups_lost"] == 0
    assert {k: v["counted"] for k, v in summary["faults"].items()} == {
        "env_raise": 1,
        "env_hang": 1,
        "env_segfault": 1,
        "worker_kill": 1,
        "connection_drop": summary["faults"]["connection_drop"]["counted"],
    }
    assert summary["faults"]["connection_drop"]["counted"] >= 1
