"""Distributed checkpoints (torch DCP) of the sharded trainer: each rank writes its shards, any world size reads them.

A run saved at N ranks must resume at M: DCP stores every tensor with its
global shape and the slices each file holds, and on load each rank reads the
slices its own sharding asks for. Model (its trainable parameters: a LoRA
run's adapters), optimizer and (when saved) the KL reference go in one DCP
directory; counters, config and the pipeline's state
are small files the main rank writes beside it (roll_async.trainer.checkpoint).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from roll_async.errors import ConfigError

#: The DCP directory inside a checkpoint directory.
DCP_DIR = "dcp"


def is_sharded_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """Whether a checkpoint directory holds DCP shards (written by trainer.strategy=fsdp2)."""
    return (Path(directory) / DCP_DIR / ".metadata").is_file()


def check_resumable_by_fsdp2(path: Path, source: str) -> None:
    """One-line ConfigError when fsdp2 ranks are asked to resume a checkpoint without DCP shards."""
    if not is_sharded_checkpoint(path):
        raise ConfigError(
            f"checkpoint.resume_from={source!r}: {path.name} was written by trainer.strategy=single (HF weights "
            "and optimizer.pt), which fsdp2 ranks cannot reshard; resume with trainer.strategy=single, or start "
            "the fsdp2 run from its weights with model.path"
        )


def _state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: torch.nn.Module | None,
) -> dict[str, Any]:
    """DCP's state dict: "model", "optimizer" and "reference" (each its own state dict type)."""
    # frozen parameters (a LoRA run's base weights) are model.path's and are not saved
    trainable = StateDictOptions(ignore_frozen_params=True)
    state: dict[str, Any] = {
        "model": get_model_state_dict(model, options=trainable),
        "optimizer": get_optimizer_state_dict(model, optimizer),
    }
    if reference is not None:
        state["reference"] = get_model_state_dict(reference)
    return state


def save_sharded(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: torch.nn.Module | None = None,
) -> None:
    """Every rank writes its shards of model, optimizer and reference into ``directory/dcp`` (synchronously)."""
    dcp.save(
        _state(model, optimizer, reference),
        checkpoint_id=str(Path(directory) / DCP_DIR),
    )


def load_sharded(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    reference: torch.nn.Module | None = None,
) -> None:
    """Read this rank's slices of a checkpoint written at any world size into model, optimizer and reference.

    A fresh AdamW has no state to load into; ``get_optimizer_state_dict``
    initialises it (zero moments) so the saved moments have somewhere to go.
    """
    state = _state(model, optimizer, reference)
    dcp.load(state, checkpoint_id=str(Path(directory) / DCP_DIR))
    frozen = any(not p.requires_grad for p in model.parameters())
    set_model_state_dict(
        model, state["model"], options=StateDictOptions(strict=not frozen)
    )
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    if reference is not None:
        set_model_state_dict(reference, state["reference"])


def has_reference(directory: str | os.PathLike[str]) -> bool:
    """Whether the DCP checkpoint holds KL reference weights."""
    metadata = dcp.FileSystemReader(str(Path(directory) / DCP_DIR)).read_metadata()
    return any(key.startswith("reference.") for key in metadata.state_dict_metadata)
