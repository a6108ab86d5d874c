"""A rollout on a local multi-raylet Ray cluster (ray.cluster_utils.Cluster); run by test_multinode_placement.py.

Three raylets (the head and two more nodes) with 1 CPU each; three EnvManagerWorkers
reserving 1 CPU each must land on three different nodes. The engine is a FakeEngine
actor (no model: this checks placement and the actors' wiring across raylets). Prints
one JSON line: the node of every worker and the batches collected.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def main(tokenizer_dir: str) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from roll_async.config.rollout_spec import rollout_spec
    from roll_async.config.schema import (
        CustomEnvConfig,
        EnvManagerConfig,
        GenerationConfig,
        PipelineConfig,
        validate_config,
    )
    from roll_async.scheduler.rollout_scheduler import RolloutScheduler
    from roll_async.testing.chatml_tokenizer import build_chatml_test_tokenizer
    from roll_async.testing.fake_engine import FakeEngine

    tokenizer = build_chatml_test_tokenizer(save_dir=tokenizer_dir)
    reply = tokenizer("<answer>Up</answer>", add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    try:
        engine = (
            ray.remote(FakeEngine)
            .options(num_cpus=0, max_concurrency=1000)
            .remote(lambda r: reply)
        )
        config = PipelineConfig(
            mode="async",
            max_staleness=1,
            rollout_batch_size=4,
            sequence_length=512,
            generation=GenerationConfig(retry_backoff_s=0.01),
            custom_envs={
                "count": CustomEnvConfig(
                    env_type="scripted",
                    env_config={"episode_length": 2},
                    max_tokens_per_step=16,
                )
            },
            train_env_manager=EnvManagerConfig(
                num_env_groups=3,
                group_size=2,
                tags=["count"],
                max_env_num_per_worker=2,
                num_cpus_per_worker=1.0,
                worker_placement="spread",
                env_threads_per_worker=2,
            ),
        )
        validate_config(config)
        from roll_async.testing.scripted_envs import scripted_env_factory

        scheduler = RolloutScheduler(
            rollout_spec(config, "train"),
            engine_handles=[engine],
            tokenizer_path=tokenizer_dir,
            env_factory=scripted_env_factory,
        )
        try:
            sizes = []
            for step in range(3):
                batch = await asyncio.wait_for(scheduler.get_batch(step), 300)
                sizes.append(len(batch))
            described = await scheduler.describe()
        finally:
            await scheduler.shutdown()
        nodes = [w["node_id"] for w in described["workers"]]
        print(
            json.dumps(
                {
                    "worker_nodes": nodes,
                    "cluster_nodes": len(ray.nodes()),
                    "batches": sizes,
                }
            ),
            flush=True,
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
