"""The run directory every pipeline writes: config.yaml, metrics.jsonl, trajectories.jsonl, checkpoints/."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from roll_async.config.schema import PipelineConfig, config_to_yaml
from roll_async.prompts.images import save_trajectory_images
from roll_async.prompts.tokenizers import ChatTokenizer
from roll_async.trajectory import Trajectory

#: Vision trajectories per run whose images are kept as PNG (the first ones written).
MAX_IMAGE_TRAJECTORIES = 16


def _json_safe(value: Any) -> Any:
    """NaN/inf are not JSON; write them as null so every line parses."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunDirectory:
    """Append-only files of one run; each line is flushed so a crash loses at most the line being written."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.checkpoints = self.root / "checkpoints"
        self.config_path = self.root / "config.yaml"
        self.metrics_path = self.root / "metrics.jsonl"
        self.trajectories_path = self.root / "trajectories.jsonl"
        #: Episodes that were played but not trained on (env errors, dropped or late groups), with their ``fate``.
        self.unserved_path = self.root / "unserved_trajectories.jsonl"
        #: Console-free logs of the driver, Ray workers and engines (roll_async.run_output.logs).
        self.logs = self.root / "logs"
        #: One file per training step when logging.save_batches is on (roll_async.trainer.batch_dump).
        self.batches = self.root / "batches"
        #: PNGs of what the model saw, for a sample of vision trajectories (images/<traj_id>/image<k>.png).
        self.images_dir = self.root / "images"
        self._image_trajectories_saved = 0

    @classmethod
    def create(cls, output_dir: str | None, run_name: str) -> RunDirectory:
        """``output_dir`` if given, else ``runs/<run_name>-<timestamp>``."""
        if output_dir:
            return cls(output_dir)
        return cls(Path("runs") / f"{run_name}-{time.strftime('%Y%m%d-%H%M%S')}")

    def write_config(self, config: PipelineConfig) -> None:
        self.config_path.write_text(config_to_yaml(config))

    def append_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        record = {
            "step": step,
            **{k: _json_safe(v) for k, v in sorted(metrics.items())},
        }
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def append_trajectories(
        self,
        trajectories: list[Trajectory],
        tokenizer: ChatTokenizer | None = None,
        served_step: int | None = None,
        served_at: float | None = None,
    ) -> None:
        """One line per trajectory; ``served_step`` is the step whose batch it was in (staleness = served - created).

        ``served_at`` (unix seconds) is when the batch left the scheduler: from ``finished_at`` until then the
        trajectory was queued for the trainer.
        """
        with self.trajectories_path.open("a") as f:
            for trajectory in trajectories:
                text = (
                    tokenizer.decode(trajectory.token_ids)
                    if tokenizer is not None
                    else None
                )
                record = trajectory.to_record(decoded_text=text)
                if served_step is not None:
                    record["served_step"] = served_step
                if served_at is not None:
                    record["served_at"] = served_at
                if (
                    trajectory.images
                    and self._image_trajectories_saved < MAX_IMAGE_TRAJECTORIES
                ):
                    self._image_trajectories_saved += 1
                    record["image_files"] = save_trajectory_images(
                        trajectory, self.images_dir, self.root
                    )
                f.write(json.dumps(record, default=_json_safe) + "\n")

    def append_unserved(
        self,
        unserved: list[tuple[str, Trajectory]],
        tokenizer: ChatTokenizer | None = None,
        step: int | None = None,
    ) -> None:
        """Episodes not trained on, one line each with ``fate`` (env_error, late, dropped_stale, filtered, dropped_errors,
        lost_to_restart, redundant)."""
        if not unserved:
            return
        with self.unserved_path.open("a") as f:
            for fate, trajectory in unserved:
                text = (
                    tokenizer.decode(trajectory.token_ids)
                    if tokenizer is not None
                    else None
                )
                record = {
                    "fate": fate,
                    "recorded_step": step,
                    **trajectory.to_record(decoded_text=text),
                }
                f.write(json.dumps(record, default=_json_safe) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        return [
            json.loads(line)
            for line in self.metrics_path.read_text().splitlines()
            if line.strip()
        ]
