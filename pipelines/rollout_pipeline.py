"""RolloutPipeline: collect ``num_batches`` batches with the real engine and write the run directory.

The data-collection use case (no training): the same engines, scheduler and env
managers as the agentic pipeline, so what it records is what training would see.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import PipelineConfig
from roll_async.engine.engine_actor import launch_engines, shutdown_engines
from roll_async.metrics import TIME_STEP_ROLLOUT
from roll_async.pipelines.console import format_rollout_line
from roll_async.pipelines.preflight import preflight
from roll_async.rewards.reward_services import (
    RewardService,
    launch_reward_services,
    shutdown_reward_services,
)
from roll_async.run_output.logs import attach_run_logs, configure_console
from roll_async.run_output.run_dir import RunDirectory
from roll_async.runtime.ray_utils import init_ray
from roll_async.scheduler.rollout_scheduler import RolloutScheduler

logger = logging.getLogger(__name__)


async def run_rollout_async(config: PipelineConfig) -> Path:
    import ray

    configure_console(config.logging.level)
    model_path, tokenizer = preflight(
        config
    )  # every config/env/model mistake fails here, before any actor
    run_dir = RunDirectory.create(config.output_dir, "rollout")
    run_dir.write_config(config)
    attach_run_logs(run_dir.root, config.logging.level)
    init_ray(config.ray_address, config.ray_num_cpus, log_dir=run_dir.logs)
    engines: list = []
    reward_services: dict[str, RewardService] = {}
    scheduler = None
    try:
        engines = await launch_engines(model_path, config.engine)
        reward_services = await launch_reward_services(
            config.custom_envs, config.train_env_manager.tags
        )
        scheduler = RolloutScheduler(
            rollout_spec(config, "train"),
            engine_handles=engines,
            tokenizer_path=model_path,
            reward_services=reward_services,
        )
        for step in range(config.num_batches):
            started = time.perf_counter()
            batch, metrics = await scheduler.get_batch_with_metrics(
                config.rollout_batch_size, step
            )
            metrics[TIME_STEP_ROLLOUT] = time.perf_counter() - started
            served_at = time.time()
            run_dir.append_metrics(step, metrics)
            if config.logging.save_trajectories:
                run_dir.append_trajectories(
                    batch, tokenizer, served_step=step, served_at=served_at
                )
                run_dir.append_unserved(scheduler.last_unserved, tokenizer, step)
            if config.logging.console:
                print(format_rollout_line(step, metrics), flush=True)
            if config.mode == "sync":
                await (
                    scheduler.resume()
                )  # sync: loops paused at get_batch; nothing to train, so go on
    finally:
        if scheduler is not None:
            await scheduler.shutdown()
        await shutdown_reward_services(reward_services)
        await shutdown_engines(engines)
        ray.shutdown()
    print(f"run directory: {run_dir.root}")
    return run_dir.root


def run_rollout(config: PipelineConfig) -> Path:
    return asyncio.run(run_rollout_async(config))
