"""SimulatedTrainer: a trainer that trains nothing, for measuring the rollout side (SkyRL-style).

On a machine whose CPU the rollout needs, a real trainer would compete with the
engine; this one keeps the pipeline's control flow, pauses and weight versions
real while no model is loaded and no weights move, so a run measures what async
overlap buys for a given step time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from roll_async.config.sections import TrainerConfig
from roll_async.errors import ConfigError
from roll_async.trainer.base import TrainerHandle
from roll_async.trainer.checkpoint import TRAINER_STATE_FILE, resolve_resume_dir
from roll_async.trainer.collate import TrajectoryBatch


class SimulatedTrainer(TrainerHandle):
    """Implements the TrainerHandle methods without training.

    ``trainer.simulate_step_s > 0`` selects it. ``train_step`` takes that many
    seconds without using CPU (it sleeps; the pipeline runs it in a thread), and the
    weight sync that follows takes ``trainer.simulate_sync_s`` seconds with the
    engines paused exactly as for a real sync, then advances their weight version
    (``advance_weight_version``; the prefix cache is reset as a real update would).
    So the pipeline's control flow, pauses and versions are the real ones, and a
    run measures what async overlap buys for a given step time, on a machine whose
    CPU the rollout needs (a real trainer would compete with the engine for it).
    No model is loaded and no weights move.
    """

    #: The pipeline checks this to sync versions instead of weights.
    simulated = True

    def __init__(self, config: TrainerConfig, model_path: str) -> None:
        self.config = config
        self.model_path = model_path
        self.step_s = float(config.simulate_step_s)
        self.sync_s = float(config.simulate_sync_s)
        self.optimizer_steps = 0

    def train_step(self, batch: TrajectoryBatch, step: int) -> dict[str, float]:
        time.sleep(self.step_s)  # no CPU: the simulated step only takes time
        self.optimizer_steps += 1
        return {
            "train/simulated_step_s": self.step_s,
            "train/num_trajectories": float(len(getattr(batch, "traj_ids", []) or [])),
        }

    def state_dict_for_engine(self) -> dict[str, Any]:
        return {}

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: dict[str, Any]
    ) -> None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        state = {
            "simulated": True,
            "optimizer_steps": self.optimizer_steps,
            "extra_state": extra_state,
        }
        (path / TRAINER_STATE_FILE).write_text(json.dumps(state, default=str))

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        state = json.loads(
            (resolve_resume_dir(directory) / TRAINER_STATE_FILE).read_text()
        )
        self.optimizer_steps = int(state.get("optimizer_steps", 0))
        return dict(state.get("extra_state", {}))

    def engine_weight_refs(self) -> list[Any]:
        """No weights move: the pipeline advances the engines' version instead (``simulated``)."""
        return []

    def run_sft(self, examples: list[Any], **kwargs: Any) -> dict[str, float]:
        """There is no model to warm start (config validation rejects the combination first)."""
        raise ConfigError(
            "sft_warmup.enabled=true: trainer.simulate_step_s > 0 simulates the trainer and has no model to "
            "warm start; set simulate_step_s=0 or sft_warmup.enabled=false"
        )

    def shutdown(self) -> None:
        """Nothing runs outside the driver."""
