"""What follows each train step, in order: weight sync, validation, checkpoint and export, logging.

Each action is one small class with the same three parts: ``due`` (whether it has
work after this step), ``interruptible`` (whether the loop races it against a
signal: the long waits are) and ``runs_when_stopping`` (whether it still runs for
the step a signal arrived in: only the log does, so that step's metrics and
trajectories are written). The train loop runs them in the order it lists them
and handles interrupts itself, so adding a phase is adding one class here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from roll_async import metrics as m
from roll_async.config.sections import CheckpointConfig, LoggingConfig
from roll_async.engine.replica_fleet import EngineReplicaFleet
from roll_async.pipelines.console import format_train_line
from roll_async.pipelines.step_state import RunProgress, StepBatch
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.run_output.run_dir import RunDirectory
from roll_async.run_output.tracking import MetricsTracker
from roll_async.scheduler.interface import RolloutScheduling


class StepAction(Protocol):
    """One phase after the train step."""

    #: Raced against a signal by the loop (a long wait); otherwise it runs to its end.
    interruptible: bool
    #: Still runs for the step a signal arrived in (the step is trained; only its record is written).
    runs_when_stopping: bool

    def due(self, record: StepBatch) -> bool:
        """Whether this action has work after ``record``'s step."""
        ...

    async def __call__(self, record: StepBatch) -> None:
        """Do it; what it measures goes into ``record.metrics``."""
        ...


class WeightSync(StepAction):
    """The engines get the trainer's weights (``time/step_weight_sync``; 0 between weight_sync.interval steps)."""

    interruptible = True
    runs_when_stopping = False

    def __init__(self, sync: Callable[[int], Awaitable[float]]) -> None:
        """``sync(step)``: push the weights trained on ``step``, return the seconds it took."""
        self.sync = sync

    def due(self, record: StepBatch) -> bool:
        return True  # the metric is written every step; ``sync`` decides whether weights move

    async def __call__(self, record: StepBatch) -> None:
        record.metrics[m.TIME_STEP_WEIGHT_SYNC] = await self.sync(record.step)


class Validation(StepAction):
    """Every ``eval_steps`` steps: the validation rollouts' metrics, at the version just synced."""

    interruptible = True
    runs_when_stopping = False

    def __init__(
        self, eval_steps: int, validate: Callable[[int], Awaitable[dict[str, float]]]
    ) -> None:
        """``validate(version_step)``: the ``val/...`` metrics (empty without a validation scheduler)."""
        self.eval_steps = eval_steps
        self.validate = validate

    def due(self, record: StepBatch) -> bool:
        return self.eval_steps > 0 and (record.step + 1) % self.eval_steps == 0

    async def __call__(self, record: StepBatch) -> None:
        record.metrics.update(await self.validate(record.step + 1))


class CheckpointAndExport(StepAction):
    """checkpoint.save_interval, the last step, and every export: a checkpoint; export_hf_interval: an HF export."""

    interruptible = False
    runs_when_stopping = False

    def __init__(
        self,
        config: CheckpointConfig,
        max_steps: int,
        checkpoint: Callable[[int], Awaitable[None]],
        export: Callable[[int], None],
        progress: RunProgress,
    ) -> None:
        """``checkpoint(step)`` saves the step; ``export(step)`` turns that checkpoint into RUN_DIR/hf/step_N."""
        self.config = config
        self.max_steps = max_steps
        self.checkpoint = checkpoint
        self.export = export
        self.progress = progress

    def _export_now(self, step: int) -> bool:
        every = self.config.export_hf_interval
        return every > 0 and ((step + 1) % every == 0 or step == self.max_steps - 1)

    def due(self, record: StepBatch) -> bool:
        step, every = record.step, self.config.save_interval
        return (
            (every > 0 and (step + 1) % every == 0)
            or step == self.max_steps - 1
            or self._export_now(step)
        )

    async def __call__(self, record: StepBatch) -> None:
        await self.checkpoint(record.step)
        self.progress.last_saved = record.step
        if self._export_now(record.step):
            await asyncio.to_thread(self.export, record.step)


class StepLog(StepAction):
    """The step's record: metrics.jsonl (and trackers), trajectories.jsonl, the console line, the progress bar."""

    interruptible = False
    runs_when_stopping = True

    def __init__(
        self,
        config: LoggingConfig,
        tracker: MetricsTracker,
        run_dir: RunDirectory,
        tokenizer: ChatTokenizer | None,
        fleet: EngineReplicaFleet | None,
        train_scheduler: RolloutScheduling | None,
        progress_bar: Any,
    ) -> None:
        """``fleet``: the engines' fleet, None without engines (replay); ``progress_bar``: tqdm or None."""
        self.config = config
        self.tracker = tracker
        self.run_dir = run_dir
        self.tokenizer = tokenizer
        self.fleet = fleet
        self.train_scheduler = train_scheduler
        self.progress_bar = progress_bar

    def due(self, record: StepBatch) -> bool:
        return True

    async def __call__(self, record: StepBatch) -> None:
        step, metrics = record.step, record.metrics
        metrics[m.TIME_STEP_TOTAL] = time.perf_counter() - record.started
        if self.fleet is not None:
            metrics["weight_version"] = float(await self.fleet.weight_version())
            metrics.update(self.fleet.metrics())
        self.tracker.log(step, metrics)
        if self.config.save_trajectories and record.trajectories:
            self.run_dir.append_trajectories(
                record.trajectories,
                self.tokenizer,
                served_step=step,
                served_at=record.served_at,
            )
            assert (
                self.train_scheduler is not None
            )  # trajectories are saved from a rollout
            self.run_dir.append_unserved(
                self.train_scheduler.last_unserved, self.tokenizer, step
            )
        if self.config.console:
            line = format_train_line(step, metrics)
            if self.progress_bar is not None:
                self.progress_bar.write(line)
            else:
                print(line, flush=True)
        if self.progress_bar is not None:
            self.progress_bar.update(1)
