"""Dump and replay of training batches: ``RUN_DIR/batches/step_NNNNNN.pt``, one file per step.

A training problem is easiest to study on the exact batch the trainer received,
so each step's collated batch can be saved and loaded back later, even by a
version whose batch has fields added.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from roll_async.trainer.collate import TrajectoryBatch
from roll_async.trajectory import Trajectory

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


def batch_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step_{step:06d}.pt"


def save_batch(
    directory: str | Path,
    step: int,
    batch: TrajectoryBatch,
    trajectories: list[Trajectory] | None = None,
) -> Path:
    """Write one step's batch (atomically: a killed run never leaves a half-written file under the final name).

    A file holds the collated :class:`~roll_async.trainer.collate.TrajectoryBatch` exactly as
    the trainer received it, saved field by field from the dataclass (so a field a
    later version adds, e.g. per-token weight versions, rides along without a
    change here), plus each trajectory's oldest/newest weight version. Loading
    keeps the fields the current TrajectoryBatch knows and reports the others.
    ``torch.load(weights_only=True)`` reads it: tensors and plain lists only.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Nested records (e.g. the sampling settings) are stored as plain dicts: weights_only loading reads no classes.
    fields = {
        f.name: dataclasses.asdict(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type)
        else value
        for f in dataclasses.fields(batch)
        for value in (getattr(batch, f.name),)
    }
    payload: dict[str, Any] = {"format": FORMAT_VERSION, "step": step, "batch": fields}
    if trajectories is not None:
        payload["weight_versions"] = [
            [t.oldest_weight_version, t.newest_weight_version] for t in trajectories
        ]
    path = batch_path(directory, step)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_batch(path: str | Path) -> tuple[int, TrajectoryBatch]:
    """(step, batch) of one saved file."""
    payload = torch.load(Path(path), weights_only=True)
    fields = payload["batch"]
    known = {f.name: f for f in dataclasses.fields(TrajectoryBatch)}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        logger.warning(
            "%s: fields %s are not part of this version's TrajectoryBatch; replaying without them",
            path,
            unknown,
        )
    kwargs = {}
    for name, value in fields.items():
        if name not in known:
            continue
        factory = known[name].default_factory
        if (
            isinstance(value, dict)
            and isinstance(factory, type)
            and dataclasses.is_dataclass(factory)
        ):
            value = factory(**value)  # a nested record saved as a dict (see save_batch)
        kwargs[name] = value
    return int(payload["step"]), TrajectoryBatch(**kwargs)


def saved_steps(run_dir: str | Path) -> dict[int, Path]:
    """step -> file of every batch a run saved."""
    directory = Path(run_dir) / "batches"
    steps: dict[int, Path] = {}
    for path in sorted(directory.glob("step_*.pt")):
        try:
            steps[int(path.stem.split("_", 1)[1])] = path
        except ValueError:
            continue
    return steps
