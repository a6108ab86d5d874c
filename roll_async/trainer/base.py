"""The trainer contracts: ``Trainer`` (what a user's class provides) and ``TrainerHandle`` (what the pipeline holds).

Four methods are the whole ``Trainer`` contract, so a user can plug in their own
trainer (an FSDP or DeepSpeed one, say) with ``trainer.trainer_cls=pkg.mod:Class``,
constructed as ``Class(config: TrainerConfig, model_path: str)``; a ``model``
attribute holding the HF causal LM is optional and lets the SFT warm start
train it.

``TrainerHandle`` adds what the pipeline and the placement code need beyond
those four: how the weights reach the engines, the SFT warm start where the
model is, the end of the run, and whether the trainer only simulates. The four
kinds the pipeline can hold implement it explicitly: a trainer in the driver
(``InProcessTrainer`` around a ``Trainer``), the simulated trainer, a trainer
in a Ray actor (``TrainerActorClient``) and the fsdp2 ranks (``TrainerRankGroup``).
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


@runtime_checkable
class TrainerHandle(Trainer, Protocol):
    """Every call the pipeline makes on the trainer it holds, wherever that trainer runs."""

    #: True for a trainer that trains nothing (trainer.simulate_step_s): syncs advance versions, move no weights.
    simulated: bool

    def engine_weight_refs(self) -> list[Any]:
        """Object refs to the weights in safetensors buckets, each ``ray.put`` once by the process holding them.

        The engines load them directly, so a remote trainer's weights never pass through the driver.
        """
        ...

    def run_sft(self, examples: list[Any], **kwargs: Any) -> dict[str, float]:
        """The SFT warm start (:func:`roll_async.trainer.sft.run_sft`'s keywords) where the model is."""
        ...

    def shutdown(self) -> None:
        """Release what the trainer holds outside the driver (actors, placement group); idempotent."""
        ...
