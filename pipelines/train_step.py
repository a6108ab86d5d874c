"""The train step: one optimisation step on the step's batch, run in a thread, never cut short by a signal.

Stopping a step halfway would leave the weights half-updated, so a signal that
arrives during it is looked at once the step is done (the loop marks the step
``stopping``). A non-finite loss stops the run, naming the checkpoint it keeps.
"""

from __future__ import annotations

import asyncio
import time

from roll_async import metrics as m
from roll_async.errors import NonFiniteLossError
from roll_async.pipelines.step_state import RunProgress, StepBatch
from roll_async.trainer.base import TrainerHandle


class TrainStep:
    """``trainer.train_step`` on the batch; its metrics and timings go into the step's metrics."""

    def __init__(self, trainer: TrainerHandle, progress: RunProgress) -> None:
        self.trainer = trainer
        self.progress = progress

    async def __call__(self, record: StepBatch) -> None:
        metrics = record.metrics
        train_start = time.perf_counter()
        metrics["timestamp/train_start"] = time.time()
        try:
            metrics.update(
                await asyncio.to_thread(
                    self.trainer.train_step, record.batch, record.step
                )
            )
        except NonFiniteLossError as exc:
            kept = self.progress.kept_checkpoint()
            raise NonFiniteLossError(
                exc.step, exc.traj_ids, exc.what, f"run stopped; {kept}"
            ) from exc
        metrics[m.TIME_STEP_TRAIN] = time.perf_counter() - train_start
        metrics["timestamp/train_end"] = time.time()
        self.progress.last_completed = record.step
