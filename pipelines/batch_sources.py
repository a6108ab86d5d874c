"""Where a train step's batch comes from: a rollout by the train scheduler, or a batch saved by an earlier run.

The train loop asks its :class:`BatchSource` for step ``s``'s batch and knows
nothing else about it; ``replay.from`` picks :class:`ReplaySource` (no engine,
env or Ray), otherwise :class:`RolloutSource`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Protocol

from roll_async import metrics as m
from roll_async.errors import ConfigError
from roll_async.pipelines.step_state import StepBatch
from roll_async.sampling import SamplingSettings
from roll_async.scheduler.interface import RolloutScheduling
from roll_async.trainer.batch_dump import load_batch, save_batch
from roll_async.trainer.collate import collate_trajectories

logger = logging.getLogger(__name__)


class BatchSource(Protocol):
    """Gives each step its batch; None when there is none (the run ends there)."""

    #: Whether the wait for a batch is raced against a signal (a rollout can take long; a saved file loads at once).
    interruptible: bool

    async def next_batch(self, step: int, started: float) -> StepBatch | None:
        """Step ``step``'s batch; ``started`` is the step's ``time.perf_counter()`` start."""
        ...

    async def save(self, record: StepBatch) -> None:
        """Keep the batch for a later replay before it trains; never raced, so a signal cannot cut a file short."""
        ...


class RolloutSource(BatchSource):
    """The train scheduler's batch for the step (its spec knows the size), collated for the trainer."""

    interruptible = True

    def __init__(
        self,
        scheduler: RolloutScheduling,
        *,
        pad_token_id: int,
        sampling: SamplingSettings,
        version_base: int,
        save_to: Path | None,
    ) -> None:
        """``sampling``: what train rollouts sampled with; ``save_to``: RUN_DIR/batches, or None not to save."""
        self.scheduler = scheduler
        self.pad_token_id = pad_token_id
        self.sampling = sampling
        self.version_base = version_base
        self.save_to = save_to

    async def next_batch(self, step: int, started: float) -> StepBatch:
        trajectories, metrics = await self.scheduler.get_batch_with_metrics(step)
        metrics[m.TIME_STEP_ROLLOUT] = time.perf_counter() - started
        served_at = time.time()
        batch = collate_trajectories(
            trajectories,
            pad_token_id=self.pad_token_id,
            sampling=self.sampling,
            # the trainer's weights now (trainer.max_token_lag)
            policy_version=self.version_base + step,
        )
        return StepBatch(step, batch, trajectories, metrics, started, served_at)

    async def save(self, record: StepBatch) -> None:
        """logging.save_batches: RUN_DIR/batches/step_N, with the trajectories' ids."""
        if self.save_to is not None:
            await asyncio.to_thread(
                save_batch, self.save_to, record.step, record.batch, record.trajectories
            )


class ReplaySource(BatchSource):
    """``replay.from``: the batch an earlier run saved for the step; the replay stops at the first step without one."""

    interruptible = False

    def __init__(self, saved: dict[int, Path], from_dir: str) -> None:
        """``saved``: step -> batch file (:func:`~roll_async.trainer.batch_dump.saved_steps`)."""
        self.saved = saved
        self.from_dir = from_dir

    async def next_batch(self, step: int, started: float) -> StepBatch | None:
        path = self.saved.get(step)
        if path is None:
            logger.warning(
                "replay.from=%s has no batch for step %d; replay stops",
                self.from_dir,
                step,
            )
            return None
        saved_step, batch = load_batch(path)
        if saved_step != step:
            raise ConfigError(
                f"replay.from: {path} holds step {saved_step}, not step {step}; the batches/ directory was edited"
            )
        return StepBatch(step, batch, [], {}, started)

    async def save(self, record: StepBatch) -> None:
        """The batch is a saved one already."""
