"""What the phases of one train step share: the step's batch and metrics, and how far the run has got.

The train loop (:meth:`roll_async.pipelines.agentic_pipeline.AgenticPipeline._run`)
passes one :class:`StepBatch` from the batch source through the train step and
the after-step actions; :class:`RunProgress` is what an interrupt or a failed
step needs to say which checkpoint is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trajectory import Trajectory


@dataclass
class StepBatch:
    """One step's batch as its source gave it; the later phases add to ``metrics``."""

    step: int
    batch: TrajectoryBatch
    #: The rollout's trajectories (written to trajectories.jsonl); empty for a replayed batch.
    trajectories: list[Trajectory]
    #: Everything logged for the step (metrics.jsonl, the console line).
    metrics: dict[str, float]
    #: ``time.perf_counter()`` when the step began, for ``time/step_total``.
    started: float
    #: Wall time the rollout batch was served; None for a replayed batch.
    served_at: float | None = None
    #: A signal arrived during the train step: the step is kept and logged, then the run stops.
    stopping: bool = False


@dataclass
class RunProgress:
    """The last step trained and the last one checkpointed (``start_step - 1``: none yet)."""

    start_step: int
    last_completed: int = field(init=False)
    last_saved: int = field(init=False)

    def __post_init__(self) -> None:
        self.last_completed = self.last_saved = self.start_step - 1

    def kept_checkpoint(self) -> str:
        """Which checkpoint a stopped run leaves, in the words of the error that stopped it."""
        if self.last_saved >= self.start_step:
            return f"last good checkpoint: step {self.last_saved}"
        return "no checkpoint yet"
