"""Training: the ``Trainer`` interface and its factory, the built-in GRPO trainer, advantages, losses, checkpoints, and where the trainer runs.

The SFT warm start (roll_async.trainer.sft) is not re-exported: it builds envs, whose renderers need
PIL, and this package imports with torch, transformers and peft alone (benchmarks.gpu_trainer).
"""

from roll_async.errors import NonFiniteLossError
from roll_async.trainer.advantages import (
    compute_advantages,
    grpo_advantages,
    rloo_advantages,
)
from roll_async.trainer.base import Trainer
from roll_async.trainer.checkpoint import (
    checkpoint_dir,
    is_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    resolve_resume_dir,
)
from roll_async.trainer.factory import build_trainer, load_trainer_class
from roll_async.trainer.grpo_trainer import GradientStats, GRPOTrainer
from roll_async.trainer.hf_names import checkpoint_state_dict
from roll_async.trainer.losses import (
    LossNormalizer,
    aggregate,
    clipped_surrogate,
    k3_kl,
    token_logprobs,
    truncated_importance_weights,
)
from roll_async.trainer.scoring import score_generated_tokens

__all__ = [
    "GRPOTrainer",
    "GradientStats",
    "LossNormalizer",
    "NonFiniteLossError",
    "Trainer",
    "aggregate",
    "build_trainer",
    "checkpoint_dir",
    "checkpoint_state_dict",
    "clipped_surrogate",
    "compute_advantages",
    "grpo_advantages",
    "is_checkpoint",
    "k3_kl",
    "list_checkpoints",
    "load_trainer_class",
    "prune_checkpoints",
    "resolve_resume_dir",
    "rloo_advantages",
    "score_generated_tokens",
    "token_logprobs",
    "truncated_importance_weights",
]
