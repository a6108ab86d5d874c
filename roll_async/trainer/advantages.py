"""Group-relative advantages: one scalar per trajectory, from the episode rewards of its group.

A group is the set of trajectories that played the same env config and seed;
comparing a trajectory only with its own group removes the difficulty of the
seed from the signal, so no value network is needed.
"""

from __future__ import annotations

import torch

from roll_async.errors import ConfigError, InvalidInputError

ADVANTAGE_ESTIMATORS = ("grpo", "rloo")


def _group_sum(
    values: torch.Tensor, group_index: torch.Tensor, num_groups: int
) -> torch.Tensor:
    """Sum of ``values`` per group, gathered back to each row."""
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return sums.index_add_(0, group_index, values)[group_index]


def _group_size_and_sum(
    rewards: torch.Tensor, group_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the size of its group and the sum of its group's rewards (float64)."""
    num_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    values = rewards.to(torch.float64)
    return _group_sum(torch.ones_like(values), group_index, num_groups), _group_sum(
        values, group_index, num_groups
    )


def grpo_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``(r - group mean) / (group std + eps)`` per trajectory; 0 for groups of size 1."""
    n, total = _group_size_and_sum(rewards, group_index)
    advantages = rewards.to(torch.float64) - total / n
    if normalize_std:
        num_groups = int(group_index.max().item()) + 1
        var = _group_sum(advantages * advantages, group_index, num_groups) / (
            n - 1
        ).clamp(min=1)
        advantages = advantages / (var.sqrt() + eps)
    advantages = torch.where(n > 1, advantages, torch.zeros_like(advantages))
    return advantages.to(rewards.dtype)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """``r_i - mean of the other rewards in the group``; 0 for groups of size 1."""
    n, total = _group_size_and_sum(rewards, group_index)
    values = rewards.to(torch.float64)
    baseline = (total - values) / (n - 1).clamp(min=1)
    advantages = torch.where(n > 1, values - baseline, torch.zeros_like(values))
    return advantages.to(rewards.dtype)


def compute_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    estimator: str = "grpo",
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages ([batch]) by the named estimator (``grpo`` or ``rloo``).

    * ``grpo``: ``A_i = r_i - mean(r_group)``, divided by ``std(r_group) + eps``
      when ``normalize_std`` (the unbiased, Bessel-corrected std, as verl/TRL use).
    * ``rloo``: ``A_i = r_i - mean(r_j for j != i)`` (leave-one-out baseline; an
      unbiased REINFORCE baseline). ``normalize_std`` does not apply to it.

    Rule for groups of size 1: the advantage is 0. A lone trajectory has no peer
    to form a baseline from; using its raw reward instead would mix the reward
    scale into the gradient and bias it toward whatever the env pays on average.
    A group whose rewards are all equal also gets 0 (nothing to prefer).
    """
    if rewards.shape != group_index.shape or rewards.dim() != 1:
        raise InvalidInputError(
            f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)} must be 1-D and the same shape"
        )
    if estimator == "grpo":
        return grpo_advantages(
            rewards, group_index, normalize_std=normalize_std, eps=eps
        )
    if estimator == "rloo":
        return rloo_advantages(rewards, group_index)
    raise ConfigError(
        f"advantage estimator {estimator!r} is unknown; use one of {', '.join(ADVANTAGE_ESTIMATORS)}"
    )
