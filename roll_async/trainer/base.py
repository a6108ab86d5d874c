"""The small ``Trainer`` interface the pipeline talks to.

Four methods are the whole contract, so a user can plug in their own trainer
(an FSDP or DeepSpeed one, say) with ``trainer.trainer_cls=pkg.mod:Class``,
constructed as ``Class(config: TrainerConfig, model_path: str)``; a ``model``
attribute holding the HF causal LM is optional and lets the SFT warm start
train it.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import torch

from roll_async.trainer.collate import TrajectoryBatch

#: The methods every trainer must have; checked when a custom class is loaded.
TRAINER_METHODS = (
    "train_step",
    "state_dict_for_engine",
    "save_checkpoint",
    "load_checkpoint",
)


@runtime_checkable
class Trainer(Protocol):
    """What the pipeline needs from a trainer."""

    def train_step(self, batch: TrajectoryBatch, step: int) -> dict[str, float]:
        """One optimisation step on a rollout batch; returns ``train/...`` metrics.

        ``batch.old_logprobs`` are of the distribution ``batch.sampling`` describes (score the
        batch under it, e.g. ``token_logprobs(..., sampling=batch.sampling)``, for ratios ~1);
        ``batch.token_versions`` / ``batch.policy_version`` give each token's weight-version lag.

        Raises :class:`NonFiniteLossError` (without changing the weights of the
        failing update) when the loss or gradient norm is NaN/inf.
        """
        ...

    def state_dict_for_engine(self) -> dict[str, torch.Tensor]:
        """The current weights under HF checkpoint names (what ``save_pretrained`` writes), as a snapshot."""
        ...

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: dict[str, Any]
    ) -> None:
        """Write model, optimizer and ``extra_state`` to ``directory`` atomically."""
        ...

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore model and optimizer from ``directory``; return the ``extra_state`` saved with them."""
        ...
