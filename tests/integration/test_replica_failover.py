"""Two real CPU vLLM engine replicas; one dies mid-run and the rollout continues on the survivor.

The session's engine is the survivor; this module starts one more replica (small KV
cache) and kills its actor (``ray.kill``, as a crash would end it) after the first
batch, while episodes are bound to it. The EnvManagerWorkers' Routers mark it dead,
re-bind its episodes to the survivor and re-send the failed requests: every later
batch arrives whole, nothing fails, and the router metrics name the dead replica.
"""

from __future__ import annotations

import asyncio
import time

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


@pytest.fixture(scope="module")
async def victim_engine(ray_session, tiny_model_path):
    """A second replica that the test kills; its vLLM processes are reaped if the kill leaves any behind."""
    import psutil
    import ray

    from roll_async.engine.engine_actor import launch_engines, shutdown_engines

    config = EngineConfig(
        dtype="float32",
        max_model_len=1024,
        max_num_seqs=32,
        cpu_kv_cache_space_gib=0.25,
    )
    (actor,) = await launch_engines(
        str(tiny_model_path), config, name_prefix="failover_victim"
    )
    import os

    pid = await actor.__ray_call__.remote(lambda self: os.getpid())
    children = psutil.Process(pid).children(recursive=True)
    yield actor
    await shutdown_engines([actor], timeout_s=5)
    deadline = time.monotonic() + 30
    for child in children:  # processes this fixture started (the replica's EngineCore): never leave them running
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except psutil.TimeoutExpired:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    del ray


def failover_config() -> PipelineConfig:
    config = PipelineConfig(
        mode="async",
        max_staleness=2,
        rollout_batch_size=8,
        sequence_length=512,
        seed=3,
        engine=EngineConfig(max_model_len=1024, num_replicas=2),
        generation=GenerationConfig(
            temperature=1.0, max_retries=0
        ),  # a failed request would end the run at once
        custom_envs={
            "Slow": CustomEnvConfig(
                env_type="longtail",
                env_config={
                    "min_turns": 3,
                    "max_turns": 4,
                    "turns_alpha": 0,
                    "step_latency_s": 0.3,
                    "step_latency_sigma": 0.0,
                    "slow_step_prob": 0.0,
                },
                max_steps=4,
                max_tokens_per_step=12,
                stop=[],
            )
        },
        train_env_manager=EnvManagerConfig(
            num_env_groups=4, group_size=2, tags=["Slow"], max_env_num_per_worker=4
        ),
    )
    validate_config(config)
    return config


async def test_a_two_replica_run_survives_the_death_of_one_replica(
    engine, victim_engine, tiny_model_path
):
    import ray

    from roll_async.scheduler.rollout_scheduler import RolloutScheduler

    config = failover_config()
    scheduler = RolloutScheduler(
        rollout_spec(config, "train"),
        engine_handles=[engine, victim_engine],
        tokenizer_path=str(tiny_model_path),
    )
    try:
        first, metrics0 = await asyncio.wait_for(
            scheduler.get_batch_with_metrics(0), 600
        )
        assert len(first) == 8
        # the victim was serving episodes
        assert metrics0.get("router/replica_1/requests", 0) > 0, metrics0
        # Kill the victim while episodes are bound to it (async mode: the loops keep generating).
        for _ in range(200):
            described = await scheduler.describe()
            bound = sum(
                w["router"]["replicas"][1]["bound_episodes"]
                for w in described["workers"]
            )
            if bound:
                break
            await asyncio.sleep(0.05)
        assert bound > 0
        ray.kill(victim_engine, no_restart=True)
        later = []
        for step in (1, 2):
            batch, metrics = await asyncio.wait_for(
                scheduler.get_batch_with_metrics(step), 600
            )
            assert len(batch) == 8 and all(t.stop_reason != "env_error" for t in batch)
            later.append(metrics)
        assert later[-1]["router/dead_replicas"] == 1.0
        assert (
            later[-1]["router/replica_1/dead"] == 1.0
            and later[-1]["router/replica_0/dead"] == 0.0
        )
        assert later[-1]["router/replica_1/failed_over"] >= 1
        # After the death every new request went to the survivor.
        assert (
            later[-1]["router/replica_0/requests"]
            > metrics0["router/replica_0/requests"]
        )
    finally:
        await scheduler.shutdown()


async def test_a_weight_sync_after_the_death_goes_to_the_survivor_and_it_still_generates(
    engine, victim_engine, tiny_model_path, tokenizer
):
    """The driver side of failover: the pipeline's weight push (EngineReplicaFleet) skips the killed replica."""
    import glob
    import uuid

    import ray
    from safetensors.torch import load_file

    from roll_async.engine.replica_fleet import EngineReplicaFleet
    from roll_async.engine.weight_transport import pack_weight_buckets, put_buckets
    from roll_async.trajectory import GenerationRequest

    ray.kill(
        victim_engine, no_restart=True
    )  # already dead after the test above; killing again is a no-op
    fleet = EngineReplicaFleet([engine, victim_engine])
    version = await engine.get_weight_version.remote()
    # The tiny model's own weights: the shared session engine keeps its behaviour for later tests.
    buckets = put_buckets(
        pack_weight_buckets(load_file(glob.glob(f"{tiny_model_path}/*.safetensors")[0]))
    )
    updated = await asyncio.wait_for(
        fleet.push_weights(buckets, version + 1, in_flight="abort"), 300
    )
    assert updated == [0] and fleet.live_indices == [0]
    assert fleet.metrics() == {"engine/live_replicas": 1.0}
    assert 1 in fleet.dead_reasons
    assert await fleet.weight_version() == version + 1
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Move."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    request = GenerationRequest(
        request_id=f"after-failover-{uuid.uuid4().hex[:8]}",
        prompt_token_ids=prompt,
        max_tokens=4,
        temperature=0.0,
        ignore_eos=True,
    )
    result = await asyncio.wait_for(
        engine.generate.remote(request), 120
    )  # resumed, not left paused
    assert len(result.output_token_ids) == 4 and result.weight_version == version + 1
