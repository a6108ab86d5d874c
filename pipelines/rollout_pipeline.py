"""RolloutPipeline: collect ``num_batches`` batches with the real engine and write the run directory.

The data-collection use case (no training): the same engines, scheduler and env
managers as the agentic pipeline, so what it records is what training would see.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from roll_async.config.rollout_spec import rollout_spec
from roll_async.config.schema import PipelineConfig
from roll_async.engine.engine_actor import launch_engines, shutdown_engines
from roll_async.metrics import TIME_STEP_ROLLOUT
from roll_async.pipelines.console import format_rollout_line
from roll_async.pipelines.env_runs import end_env_runs, label_env_runs, new_run_id
from roll_async.pipelines.frozen_engines import (
    launch_frozen_engines,
    shutdown_frozen_engines,
)
from roll_async.pipelines.interrupt import (
    InterruptFlag,
    RolloutInterrupted,
    SignalReceived,
)
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


async def run_rollout_async(
    config: PipelineConfig, handle_signals: bool = False
) -> Path:
    """Collect ``config.num_batches`` batches; ``handle_signals``: the first SIGINT/SIGTERM stops the run after
    the batches already written, shuts everything down and raises RolloutInterrupted."""
    interrupt = InterruptFlag()
    if handle_signals:
        interrupt.install()
    try:
        return await _collect(config, interrupt)
    finally:
        interrupt.uninstall()


async def _collect(config: PipelineConfig, interrupt: InterruptFlag) -> Path:
    import ray

    configure_console(config.logging.level)
    # every config/env/model mistake fails here, before any actor
    model_path, tokenizer = preflight(config)
    run_dir = RunDirectory.create(config.output_dir, "rollout")
    run_dir.write_config(config)
    attach_run_logs(run_dir.root, config.logging.level)
    init_ray(config.ray_address, config.ray_num_cpus, log_dir=run_dir.logs)
    interrupt.reclaim()  # ray.init replaced the SIGTERM handler
    engines: list[Any] = []
    reward_services: dict[str, RewardService] = {}
    opponent_engines: dict[str, list[Any]] = {}
    scheduler = None
    written = 0
    interrupted: RolloutInterrupted | None = None
    run_id = new_run_id(run_dir.root.name)
    label_env_runs(config, run_id)
    try:
        engines = await interrupt.race(launch_engines(model_path, config.engine))
        reward_services = await interrupt.race(
            launch_reward_services(config.custom_envs, config.train_env_manager.tags)
        )
        opponent_engines = await interrupt.race(
            launch_frozen_engines(config, config.train_env_manager.tags)
        )
        scheduler = RolloutScheduler(
            rollout_spec(config, "train"),
            engine_handles=engines,
            tokenizer_path=model_path,
            reward_services=reward_services,
            opponent_engines=opponent_engines,
        )
        for step in range(config.num_batches):
            started = time.perf_counter()
            batch, metrics = await interrupt.race(
                scheduler.get_batch_with_metrics(step)
            )
            metrics[TIME_STEP_ROLLOUT] = time.perf_counter() - started
            served_at = time.time()
            run_dir.append_metrics(step, metrics)
            if config.logging.save_trajectories:
                run_dir.append_trajectories(
                    batch, tokenizer, served_step=step, served_at=served_at
                )
                run_dir.append_unserved(scheduler.last_unserved, tokenizer, step)
            written = step + 1
            if config.logging.console:
                print(format_rollout_line(step, metrics), flush=True)
            if interrupt.is_set:
                raise SignalReceived(interrupt.signal_name)
            if config.mode == "sync":
                # sync: loops paused at get_batch; nothing to train, so go on
                await interrupt.race(scheduler.resume())
    except SignalReceived:
        interrupted = RolloutInterrupted(
            written, str(run_dir.root), interrupt.signal_name
        )
    finally:
        if scheduler is not None:
            await scheduler.shutdown()
        swept = await asyncio.to_thread(end_env_runs, config, run_id)
        if swept:
            run_dir.append_metrics(written, swept)
        await shutdown_reward_services(reward_services)
        await shutdown_frozen_engines(opponent_engines)
        await shutdown_engines(engines)
        ray.shutdown()
    if interrupted is not None:
        raise interrupted
    print(f"run directory: {run_dir.root}")
    return run_dir.root


def run_rollout(config: PipelineConfig) -> Path:
    """The ``roll-async rollout`` entry: SIGINT/SIGTERM stop it cleanly (RolloutInterrupted)."""
    return asyncio.run(run_rollout_async(config, handle_signals=True))
