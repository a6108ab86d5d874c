"""The small ``Trainer`` interface the pipeline talks to, and the factory that picks an implementation.

Four methods are the whole contract, so a user can plug in their own trainer
(an FSDP or DeepSpeed one, say) with ``trainer.trainer_cls=pkg.mod:Class``. The
class is constructed as ``Class(config: TrainerConfig, model_path: str)``.
Optional extra: a ``model`` attribute holding the HF causal LM lets the SFT
warm start (:mod:`roll_async.trainer.sft`) train it.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

import torch

from roll_async.config.dotted_paths import resolve_dotted
from roll_async.config.schema import TrainerConfig
from roll_async.errors import ConfigError
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


def load_trainer_class(dotted_path: str) -> type:
    """Import ``package.module:ClassName`` and check it has the Trainer methods; ConfigError otherwise."""
    key = "trainer.trainer_cls"
    module_name, sep, attr = dotted_path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{key}={dotted_path!r} is not a dotted path; write it as package.module:ClassName "
            "(or leave it empty for the built-in GRPO trainer)"
        )
    try:
        obj = resolve_dotted(dotted_path, f"{key}={dotted_path!r}")
    except ValueError as exc:
        raise ConfigError(
            f"{exc}; check the name and that the package is installed or on PYTHONPATH"
        ) from exc
    if not isinstance(obj, type):
        raise ConfigError(
            f"{key}={dotted_path!r} names a {type(obj).__name__}, not a class"
        )
    missing = [m for m in TRAINER_METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise ConfigError(
            f"{key}={dotted_path!r}: class {obj.__name__} lacks the Trainer method(s) {', '.join(missing)}; "
            "see roll_async.trainer.base.Trainer"
        )
    return obj


def build_trainer(config: TrainerConfig, model_path: str) -> Trainer:
    """The configured trainer: ``config.trainer_cls`` if set, else the built-in GRPO trainer."""
    if config.simulate_step_s > 0:
        from roll_async.trainer.simulated import SimulatedTrainer

        return SimulatedTrainer(config, model_path)
    if config.trainer_cls:
        cls = load_trainer_class(config.trainer_cls)
        return cls(config, model_path)
    from roll_async.trainer.grpo_trainer import GRPOTrainer

    return GRPOTrainer(config, model_path)
